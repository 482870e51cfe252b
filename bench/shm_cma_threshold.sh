#!/bin/sh
# Where cross-memory attach starts to pay on shm:// (lib/tcp/tcp_engine.hpp, cma_min_bytes*):
# write, read and send bandwidth with CMA off (RDMX_SHM_CMA=off) and on, interleaved per
# round, on connections with rings (the default: 32 KiB to 256 KiB), or with RING=off on
# the UNIX socket alone (8 KiB to 32 KiB). Server on CPU 0, client on CPU 1.
# Usage: [RING=off] sh bench/shm_cma_threshold.sh BUILD_DIR [ROUNDS]   (a build with samples)
# Rows: size iters MB/s Mmsg/s us-per-message (write_bw, read_bw, send_bw). The threshold
# only changes which of these sizes go by CMA: below it both columns are the same path.
set -eu
build=${1:?usage: shm_cma_threshold.sh BUILD_DIR [ROUNDS]}
rounds=${2:-3}
perf=$build/samples/rdmx_perf
log=$(mktemp)
trap 'rm -f "$log"' EXIT
. "$(dirname "$0")/lib.sh"
run() { rdmx_pair "$@"; } # address test args...
sizes="-s 32K -s 64K -s 128K -s 256K"
[ "${RING:-on}" != off ] || sizes="-s 8K -s 16K -s 32K"
export RDMX_SHM_RING=${RING:-on}
for r in $(seq "$rounds"); do
    for c in off on; do
        export RDMX_SHM_CMA=$c
        echo "== round $r ring=$RDMX_SHM_RING cma=$c"
        # shellcheck disable=SC2086 # $sizes is a list of options
        for t in write_bw read_bw send_bw; do run shm://thr:0 $t $sizes -n 4000; done
    done
done
