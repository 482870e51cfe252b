#!/bin/sh
# Builds fabtests' benchmarks (fi_msg_bw, fi_rma_bw, fi_rdm_tagged_bw, fi_rdm_tagged_pingpong,
# fi_rdm_pingpong, fi_msg_pingpong, fi_rdm_cntr_pingpong, fi_dgram_pingpong) against the
# installed libfabric, for bench/endpoints.sh's rxm rows. Debian 12 packages libfabric 1.17.0
# (libfabric-bin, libfabric-dev) but not fabtests, so they come from libfabric's source at
# the same version:
#   (in a clone of libfabric's repository, ofiwg/libfabric on GitHub)
#   git archive v1.17.0 fabtests | tar -x -C /tmp/ft        # SRC_DIR = /tmp/ft/fabtests
# Plain gcc rather than fabtests' autotools: the benchmarks need only common/shared.c,
# common/hmem*.c and benchmarks/benchmark_shared.c, which build without a config.h (the
# GPU memory back ends compile to stubs without their HAVE_* macros), so no autoconf,
# automake or libtool is needed; libfabric-dev (fabric.h and the libfabric.so link) is
# installed with apt-get if missing.
# Usage: bench/fabtests.sh SRC_DIR OUT_DIR      (OUT_DIR: build/fabtests, which the guest sees)
set -eu
src=$1; out=$2
[ -f "$src/benchmarks/benchmark_shared.c" ] || { echo "$src: not fabtests' source" >&2; exit 2; }
if ! dpkg-query -W -f '${Status}' libfabric-dev 2>/dev/null | grep -q 'install ok installed'; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends libfabric-dev libfabric-bin
fi
mkdir -p "$out/obj"
cflags="-O2 -g -D_GNU_SOURCE -I$src/include -I$src/include/unix -I$src/benchmarks -Wno-unused-result"
common="common/shared.c common/hmem.c common/hmem_cuda.c common/hmem_rocr.c common/hmem_ze.c
        common/hmem_neuron.c benchmarks/benchmark_shared.c"
objs=""
for f in $common; do
    o="$out/obj/$(basename "$f" .c).o"
    gcc $cflags -c "$src/$f" -o "$o"
    objs="$objs $o"
done
built=""
for f in "$src"/benchmarks/*.c; do
    name=$(basename "$f" .c)
    [ "$name" = benchmark_shared ] && continue
    gcc $cflags "$f" $objs -o "$out/fi_$name" -lfabric -lpthread -lrt -lm -ldl
    built="$built fi_$name"
done
echo "built in $out:$built"
