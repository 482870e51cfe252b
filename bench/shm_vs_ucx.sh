#!/bin/sh
# rdmx's shm:// (CMA) against UCX on one host, interleaved (issue 29's "against libfabric's
# shm provider and UCX" rows, UCX's half): per round rdmx_perf over shm://, then
# ucx_perftest with UCX_TLS=posix,cma (the issue's configuration) and UCX_TLS=sm: 8 B
# latency (send_lat / tag_lat) and write / read bandwidth (write_bw / ucp_put_bw, read_bw /
# ucp_get) at 64 KiB, 1 MiB and 4 MiB, rdmx's with registered buffers (CMA) and with
# --allocate (the peer's region mapped), and one core's memcpy of those sizes
# (bench/memcpy_bw.c, CPU 1). Server on CPU 0, client on CPU 1.
# Usage: sh bench/shm_vs_ucx.sh BUILD_DIR [ROUNDS]   (ucx-utils installed: ucx_perftest)
# rdmx rows: send_lat: size iters t_min t_typical t_99 t_max (us); bandwidth: size iters
# MB/s Mmsg/s us-per-message. UCX rows: "TEST SIZE: typical-latency-us MB/s".
set -eu
build=${1:?usage: shm_vs_ucx.sh BUILD_DIR [ROUNDS]}
rounds=${2:-3}
perf=$build/samples/rdmx_perf
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)" >&2; exit 1; }
log=$(mktemp)
mc=$(mktemp)
trap 'rm -f "$log" "$mc"' EXIT
cc -O2 -o "$mc" "$(dirname "$0")/memcpy_bw.c"
port=13500

. "$(dirname "$0")/lib.sh"
rdmx() { rdmx_pair shm://ucxcmp:0 "$@"; } # test args...

ucx() { # tls test size iters
    port=$((port + 1))
    UCX_TLS=$1 taskset -c 0 ucx_perftest -p $port >/dev/null 2>&1 &
    sleep 0.5
    # Final: iterations, latency 50%ile / average / overall (us), bandwidth average / overall (MB/s), ...
    UCX_TLS=$1 taskset -c 1 ucx_perftest localhost -p $port -t "$2" -s "$3" -n "$4" 2>&1 |
        awk -v t="$2" -v s="$3" '/Final:/ { printf "%s %s: %s %s\n", t, s, $3, $6 }'
    wait
}

for r in $(seq "$rounds"); do
    echo "== round $r rdmx shm:// (CMA)"
    rdmx send_lat -s 8 -n 20000 -w 1000
    rdmx write_bw -s 64K -s 1M -s 4M -n 2000
    rdmx read_bw -s 64K -s 1M -s 4M -n 2000
    # Buffers from domain::allocate_memory: the client maps the server's and copies itself,
    # as UCX's puts and gets copy into memory ucx_perftest allocated through UCX.
    echo "== round $r rdmx shm:// (allocated regions)"
    rdmx write_bw -s 64K -s 1M -s 4M -n 2000 --allocate
    rdmx read_bw -s 64K -s 1M -s 4M -n 2000 --allocate
    for tls in posix,cma sm; do
        echo "== round $r UCX_TLS=$tls"
        ucx $tls tag_lat 8 20000
        for s in 65536 1048576 4194304; do ucx $tls ucp_put_bw $s 2000; done
        for s in 65536 1048576 4194304; do ucx $tls ucp_get $s 2000; done
    done
    echo "== round $r memcpy (size iterations MB/s)"
    for s in 65536 1048576 4194304; do taskset -c 1 "$mc" $s 2000; done
done
