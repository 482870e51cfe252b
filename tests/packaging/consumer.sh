#!/bin/bash
# Installs the build into a temporary root (meson install --destdir) and builds a program
# against it both ways the README tells a user to: flags from pkg-config only, with an rpath
# to the library directory; and a CMake project with find_package(rdmx) and rdmx::rdmx.
# Checks that Cflags carry nothing but the include directory, that each program needs
# librdmx.so.SOVERSION and nothing of CUDA, finds the installed library, and runs.
#   consumer.sh BUILD_ROOT SOVERSION CXX CMAKE CMAKE_PROJECT CONSUMER_CPP [GPU_CONSUMER_CPP]
#               [-- extra compiler flags]
set -euo pipefail
build=$1 so=$2 cxx=$3 cmake=$4 cmake_project=$5 src=$6
shift 6
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

# A built consumer program: needs the SONAME, loads it from the installed directory and
# no CUDA (GPU memory loads the driver at run time, when it is first asked for), and runs.
check_program() { # PROGRAM HOW
    local prog=$1 how=$2 dyn loaded
    # (Outputs into variables first: with pipefail, grep -q ending a pipe early fails it.)
    dyn=$(readelf -d "$prog")
    grep -q "(NEEDED).*\[librdmx\.so\.$so\]" <<<"$dyn" || fail "$how: $prog does not need librdmx.so.$so"
    loaded=$(ldd "$prog")
    ! grep -i 'libcud' <<<"$loaded" || fail "$how: $prog links CUDA"
    grep -q "librdmx\.so\.$so => $libdir/" <<<"$loaded" || fail "$how: $prog does not find the installed library"
    "$prog" || fail "$how: $prog failed"
}

# 1. pkg-config
# shellcheck disable=SC2046 # word splitting of pkg-config's output is intended
"$cxx" -std=c++20 "${extra[@]}" "$src" -o "$root/consumer" $(pc --cflags --libs rdmx) \
    -Wl,-rpath,"$libdir" || fail "building against the installed rdmx"
check_program "$root/consumer" pkg-config

if [ -n "$gpu_src" ]; then
    # shellcheck disable=SC2046
    "$cxx" -std=c++20 "${extra[@]}" "$gpu_src" -o "$root/consumer_gpu" $(pc --cflags --libs rdmx) \
        -Wl,-rpath,"$libdir" || fail "building the GPU consumer against the installed rdmx"
    check_program "$root/consumer_gpu" pkg-config
fi

# 2. CMake: find_package(rdmx) from the installed config (<libdir>/cmake/rdmx), found
# through the prefix alone; CMake gives the program an rpath to the imported library.
want=$(pkg-config --modversion rdmx)
config=$(find "$root" -name rdmxConfig.cmake)
[ -n "$config" ] || fail "no rdmxConfig.cmake installed"
[ "$(dirname "$config")" = "$libdir/cmake/rdmx" ] || fail "rdmxConfig.cmake is in $(dirname "$config"), not $libdir/cmake/rdmx"
"$cmake" -S "$cmake_project" -B "$root/cmake-build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_PREFIX_PATH="$root$prefix" -DRDMX_WANT="$want" -DCMAKE_CXX_FLAGS="${extra[*]}" -DCMAKE_EXE_LINKER_FLAGS="${extra[*]}" \
    -DCONSUMER_SOURCE="$(realpath "$src")" ${gpu_src:+-DGPU_CONSUMER_SOURCE="$(realpath "$gpu_src")"} \
    >"$root/cmake.log" 2>&1 || { cat "$root/cmake.log"; fail "cmake configure with find_package(rdmx)"; }
"$cmake" --build "$root/cmake-build" >>"$root/cmake.log" 2>&1 ||
    { cat "$root/cmake.log"; fail "cmake --build against rdmx::rdmx"; }
echo "cmake: find_package(rdmx $want) found $config"
check_program "$root/cmake-build/consumer" cmake
[ -z "$gpu_src" ] || check_program "$root/cmake-build/consumer_gpu" cmake
# The version file: another major version is no match (its SONAME would differ).
"$cmake" -S "$cmake_project" -B "$root/cmake-major" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_PREFIX_PATH="$root$prefix" -DRDMX_WANT=$((so + 1)).0 -DCONSUMER_SOURCE="$(realpath "$src")" \
    >"$root/cmake-major.log" 2>&1 && fail "find_package(rdmx $((so + 1)).0) accepted rdmx $want"
log=$(tr -s ' \n' ' ' <"$root/cmake-major.log")
grep -q 'compatible with requested version' <<<"$log" ||
    { cat "$root/cmake-major.log"; fail "find_package(rdmx $((so + 1)).0) failed, but not for the version"; }
echo "ok"
