#!/bin/sh
# Where cross-memory attach starts to pay on shm:// (lib/tcp/tcp_engine.hpp, cma_min_bytes):
# write and read bandwidth at 8, 16 and 32 KiB with CMA off (RDMX_SHM_CMA=off) and on,
# interleaved per round. Server on CPU 0, client on CPU 1.
# Usage: sh bench/shm_cma_threshold.sh BUILD_DIR [ROUNDS]   (a build with samples)
# Rows: size iters MB/s Mmsg/s us-per-message (write_bw, then read_bw). The threshold only
# changes which of these sizes go by CMA: with it at 32 KiB, 8 and 16 KiB go through the
# socket in both columns.
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
for r in $(seq "$rounds"); do
    for c in off on; do
        export RDMX_SHM_CMA=$c
        echo "== round $r cma=$c"
        run shm://thr:0 write_bw -s 8K -s 16K -s 32K -n 5000
        run shm://thr:0 read_bw -s 8K -s 16K -s 32K -n 5000
    done
done
