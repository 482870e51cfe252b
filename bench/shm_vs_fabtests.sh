#!/bin/sh
# rdmx's shm:// against libfabric 1.17's shm provider, interleaved (issue 29's "against
# libfabric's shm provider" rows): per round rdmx_perf over shm://, then fabtests with
# `-p shm`: 8 B latency (send_lat / fi_rdm_tagged_pingpong) and write / read bandwidth
# (write_bw, read_bw / fi_rma_bw -o write, -o read) at 64 KiB, 1 MiB and 4 MiB. Server on
# CPU 0, client on CPU 1. fabtests are not packaged: bench/fabtests.sh builds them.
# Each fabtests side needs a name of its own (the shm region is named after the port):
# the server takes -B PORT, the client -B PORT+1 -P PORT, and -E exchanges addresses.
# Usage: sh bench/shm_vs_fabtests.sh BUILD_DIR FABTESTS_DIR [ROUNDS]
# rdmx rows: send_lat: size iters t_min t_typical t_99 t_max (us); bandwidth: size iters
# MB/s Mmsg/s us-per-message. fabtests rows: "PROGRAM OP: bytes iters total time MB/sec
# usec/xfer Mxfers/sec" (the pingpong's usec/xfer is half the round trip).
set -eu
build=${1:?usage: shm_vs_fabtests.sh BUILD_DIR FABTESTS_DIR [ROUNDS]}
ft=${2:?usage: shm_vs_fabtests.sh BUILD_DIR FABTESTS_DIR [ROUNDS]}
rounds=${3:-3}
perf=$build/samples/rdmx_perf
log=$(mktemp)
trap 'rm -f "$log"' EXIT
port=9400

. "$(dirname "$0")/lib.sh"
rdmx() { rdmx_pair shm://ftcmp:0 "$@"; } # test args...

fab() { # label program args...
    label=$1; prog=$2; shift 2
    port=$((port + 2))
    taskset -c 0 "$ft/$prog" -p shm -E -B $port "$@" >"$log" 2>&1 &
    sleep 0.5
    taskset -c 1 "$ft/$prog" -p shm -E -B $((port + 1)) -P $port "$@" 127.0.0.1 2>&1 |
        awk -v l="$label" '/^[0-9]/ { print l ": " $0 }'
    wait
}

for r in $(seq "$rounds"); do
    echo "== round $r rdmx shm://"
    rdmx send_lat -s 8 -n 20000 -w 1000
    rdmx write_bw -s 64K -s 1M -s 4M -n 2000
    rdmx read_bw -s 64K -s 1M -s 4M -n 2000
    echo "== round $r libfabric shm"
    fab "tagged_pingpong" fi_rdm_tagged_pingpong -S 8 -I 20000
    for s in 65536 1048576 4194304; do fab "rma_bw write" fi_rma_bw -e rdm -o write -S $s -I 2000; done
    for s in 65536 1048576 4194304; do fab "rma_bw read" fi_rma_bw -e rdm -o read -S $s -I 2000; done
done
