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
run() { # address test args...
    a=$1; t=$2; shift 2
    "$perf" --server --cpu 0 -t "$t" "$@" "$a" >"$log" 2>&1 &
    i=0
    until grep -q listening "$log"; do
        i=$((i + 1)); [ $i -lt 100 ] || { cat "$log"; exit 1; }; sleep 0.1
    done
    port=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$log" | head -n 1)
    "$perf" --cpu 1 -t "$t" "$@" "$(echo "$a" | sed "s/:0\$/:$port/")" | grep -E '^ *[0-9]'
    wait
}
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
