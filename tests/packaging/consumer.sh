#!/bin/bash
# Installs the build into a temporary root (meson install --destdir) and builds a program
# against it the way the README tells a user to: flags from pkg-config only, an rpath to
# the library directory. Checks that Cflags carry nothing but the include directory, that
# the program needs librdmx.so.SOVERSION and nothing of CUDA, and that it runs.
#   consumer.sh BUILD_ROOT SOVERSION CXX CONSUMER_CPP [GPU_CONSUMER_CPP] [-- extra compiler flags]
set -euo pipefail
build=$1 so=$2 cxx=$3 src=$4
shift 4
gpu_src=
if [ $# -gt 0 ] && [ "$1" != -- ]; then gpu_src=$1; shift; fi
[ $# -gt 0 ] && shift # the --
extra=("$@")
fail() { echo "FAIL: $*"; exit 1; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
meson install -C "$build" --no-rebuild --destdir "$root" >"$root/install.log" 2>&1 ||
    { cat "$root/install.log"; fail "meson install --destdir"; }
pc=$(find "$root" -name rdmx.pc)
[ -n "$pc" ] || fail "no rdmx.pc installed"
# The installed .pc files first (the system's libibverbs.pc and so on after them), with
# their prefix moved under the temporary root.
export PKG_CONFIG_PATH=$(dirname "$pc")
prefix=$(pkg-config --variable=prefix rdmx)
pc() { pkg-config --define-variable=prefix="$root$prefix" "$@"; }

cflags=$(pc --cflags rdmx)
echo "pkg-config --cflags rdmx: $cflags"
[ "$(echo $cflags)" = "-I$root$prefix/include" ] ||
    fail "Cflags carry '$cflags': users need only -I<prefix>/include"
libdir=$(pc --variable=libdir rdmx)
[ -e "$libdir/librdmx.so.$so" ] || fail "librdmx.so.$so not installed in $libdir"

# shellcheck disable=SC2046 # word splitting of pkg-config's output is intended
"$cxx" -std=c++20 "${extra[@]}" "$src" -o "$root/consumer" $(pc --cflags --libs rdmx) \
    -Wl,-rpath,"$libdir" || fail "building against the installed rdmx"
# (Outputs into variables first: with pipefail, grep -q ending a pipe early fails it.)
dyn=$(readelf -d "$root/consumer")
grep -q "(NEEDED).*\[librdmx\.so\.$so\]" <<<"$dyn" || fail "consumer does not need librdmx.so.$so"
loaded=$(ldd "$root/consumer")
! grep -i 'libcud' <<<"$loaded" || fail "a program using only the core loads CUDA"
grep -q "librdmx\.so\.$so => $libdir/" <<<"$loaded" || fail "the rpath does not find the installed library"
"$root/consumer" || fail "consumer failed"

if [ -n "$gpu_src" ]; then
    gflags=$(pc --cflags rdmx-gpu)
    echo "pkg-config --cflags rdmx-gpu: $gflags"
    [ "$(echo $gflags)" = "-I$root$prefix/include" ] || fail "rdmx-gpu Cflags carry '$gflags'"
    # shellcheck disable=SC2046
    "$cxx" -std=c++20 "${extra[@]}" "$gpu_src" -o "$root/consumer_gpu" $(pc --cflags --libs rdmx-gpu) \
        -Wl,-rpath,"$libdir" || fail "building against the installed rdmx-gpu"
    "$root/consumer_gpu" || fail "gpu consumer failed"
fi
echo "ok"
