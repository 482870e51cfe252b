#!/bin/sh
# Per-connection TCP rows of issue 27's "Measured": rdmx_perf against fabtests over
# libfabric's tcp provider (msg endpoints) on loopback, in interleaved rounds: write with
# immediate (fi_rma_bw -o writedata vs rdmx_perf write_imm_bw), read (fi_rma_bw -o read vs
# read_bw) and send (fi_msg_bw vs send_bw) at 64 KiB, 1 MiB and 4 MiB, a window of 16 on
# both (-W 16; rdmx_perf -d 16 -c 1: every request signalled, as fabtests'). Server on CPU
# 0, client on CPU 1, every run bounded by timeout. fabtests from bench/fabtests.sh.
# Both sides use the host's congestion control (sysctl net.ipv4.tcp_congestion_control),
# or, with CC=NAME in the environment, that one on every socket of both programs
# (rdmx_perf --tcp-congestion; fabtests through tcp_congestion_shim.c, LD_PRELOADed).
# BBR paces even on loopback, and the 1 MiB rows depend on it (docs/performance.md).
# Usage: [CC=cubic] bench/fabtests_tcp.sh BUILD_DIR [ROUNDS (3)] > results.txt
#        python3 bench/fabtests_tcp.py results.txt
set -u
build=$1; rounds=${2:-3}
F=$build/fabtests; R=$build/samples/rdmx_perf; port=8200
CC=${CC:-}; pre=; rcc=
if [ -n "$CC" ]; then
    shim=$build/tcp_congestion_shim.so
    cc -O2 -shared -fPIC -o "$shim" "$(dirname "$0")/tcp_congestion_shim.c" -ldl || exit 1
    pre="env LD_PRELOAD=$shim RDMX_BENCH_CC=$CC"; rcc="--tcp-congestion $CC"
fi
echo "# congestion control: ${CC:-$(sysctl -n net.ipv4.tcp_congestion_control) (host default)}"
fab() { # label program args...
    l=$1; p=$2; shift 2
    taskset -c 0 timeout 60 $pre "$F/$p" -p tcp -e msg "$@" -s 127.0.0.1 >/dev/null 2>&1 &
    s=$!
    sleep 0.5
    out=$(taskset -c 1 timeout 60 $pre "$F/$p" -p tcp -e msg "$@" 127.0.0.1 2>&1 | tail -1)
    wait $s 2>/dev/null
    echo "$l ${out:-failed}"
}
rd() { # label test size iterations
    port=$((port + 1))
    taskset -c 0 timeout 60 "$R" --server "tcp://127.0.0.1:$port" $rcc >/dev/null 2>&1 &
    s=$!
    sleep 0.5
    out=$(taskset -c 1 timeout 60 "$R" "tcp://127.0.0.1:$port" $rcc --json -t "$2" -s "$3" -n "$4" -d 16 -c 1 2>&1 |
        tr -d '\n' | grep -o '"mb_per_s": [0-9.]*')
    kill $s 2>/dev/null
    wait $s 2>/dev/null
    echo "$1 ${out:-failed}"
}
for r in $(seq 1 "$rounds"); do
    echo "# round $r load $(cut -d' ' -f1 /proc/loadavg)"
    for row in 65536:64K:4000 1048576:1M:500 4194304:4M:150; do
        bytes=${row%%:*}; rest=${row#*:}; h=${rest%%:*}; n=${rest#*:}
        fab "fi_writedata_$h" fi_rma_bw -o writedata -S "$bytes" -I "$n" -W 16
        rd "rdmx_write_imm_$h" write_imm_bw "$h" "$n"
        fab "fi_read_$h" fi_rma_bw -o read -S "$bytes" -I "$n" -W 16
        rd "rdmx_read_$h" read_bw "$h" "$n"
        fab "fi_msg_$h" fi_msg_bw -S "$bytes" -I "$n" -W 16
        rd "rdmx_send_$h" send_bw "$h" "$n"
    done
done
