#!/bin/sh
# The built libraries as a deployment sees them (readelf -d, nm -D): the core librdmx has
# no CUDA in it at all (no NEEDED libcud*, no undefined cuda* symbol: the driver is loaded
# at run time), and it carries a versioned SONAME.
#   check-libraries.sh SOVERSION CORE_LIB
set -eu
so=$1 core=$2
fail() { echo "FAIL: $*"; exit 1; }

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
soname() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; }

deps=$(needed "$core") || fail "readelf -d $core"
echo "$core NEEDED:" $deps
[ -n "$deps" ] || fail "no NEEDED entries read from $core"
! echo "$deps" | grep -qi 'libcud' || fail "the core library needs CUDA: $(echo "$deps" | grep -i libcud)"
undef=$(nm -D --undefined-only "$core") || fail "nm -D $core"
! echo "$undef" | grep -qE ' (cuda|cu[A-Z])' || fail "the core library refers to CUDA: $(echo "$undef" | grep -E ' (cuda|cu[A-Z])' | head -3)"
[ "$(soname "$core")" = "librdmx.so.$so" ] || fail "SONAME of $core is '$(soname "$core")', not librdmx.so.$so"

echo "ok: SONAME librdmx.so.$so, no CUDA in the core"
