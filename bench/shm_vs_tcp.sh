#!/bin/sh
# rdmx's shm:// against its own tcp:// on loopback, interleaved (issue 29's "against rdmx's
# own TCP" and "against the machine's limit" rows): per round, tcp, then shm with its frames
# through the UNIX socket and no cross-memory attach (RDMX_SHM_RING=off RDMX_SHM_CMA=off:
# the first shm://), shm through the rings without CMA (RDMX_SHM_CMA=off), then shm as it
# is (rings and CMA), each with 8 B send/recv latency and write and read bandwidth at
# 64 KiB, 1 MiB and 4 MiB (SEND_BW=1: send bandwidth at 4 KiB to 4 MiB too); then one core's
# memcpy of those sizes (bench/memcpy_bw.c, on CPU 1). Server on CPU 0, client on CPU 1.
# Usage: sh bench/shm_vs_tcp.sh BUILD_DIR [ROUNDS]   (a build with samples, debugoptimized)
# Prints rdmx_perf's rows: send_lat: size iters t_min t_typical t_99 t_max (us);
# bandwidth: size iters MB/s Mmsg/s us-per-message.
set -eu
build=${1:?usage: shm_vs_tcp.sh BUILD_DIR [ROUNDS]}
rounds=${2:-3}
perf=$build/samples/rdmx_perf
log=$(mktemp)
mc=$(mktemp)
trap 'rm -f "$log" "$mc"' EXIT
cc -O2 -o "$mc" "$(dirname "$0")/memcpy_bw.c"

. "$(dirname "$0")/lib.sh"
run() { rdmx_pair "$@"; } # address test args...

for r in $(seq "$rounds"); do
    for v in tcp shm-socket shm-ring shm; do
        a=shm://bench:0 ring=on cma=on
        case $v in
        tcp) a=tcp://127.0.0.1:0 ;;
        shm-socket) ring=off cma=off ;;
        shm-ring) cma=off ;;
        esac
        export RDMX_SHM_RING=$ring RDMX_SHM_CMA=$cma
        echo "== round $r $v (ring=$ring cma=$cma)"
        run "$a" send_lat -s 8 -n 20000 -w 1000
        run "$a" write_bw -s 64K -s 1M -s 4M -n 2000
        run "$a" read_bw -s 64K -s 1M -s 4M -n 2000
        [ -z "${SEND_BW:-}" ] || run "$a" send_bw -s 4K -s 16K -s 64K -s 1M -s 4M -n 2000
    done
    echo "== round $r memcpy (size iterations MB/s)"
    for s in 65536 1048576 4194304; do taskset -c 1 "$mc" $s 2000; done
done
