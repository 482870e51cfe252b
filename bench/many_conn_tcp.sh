#!/bin/sh
# Many connections from one thread, and event mode, on TCP loopback: rdmx_perf -q N with
# per-connection CQs, one shared CQ (busy polling) and one shared CQ in event mode, against
# iperf3 -P N; and 8 B send latency busy-polling vs event mode, against ucx_perftest with
# and without its wakeup (UCX_...: -E sleep). Interleaved rounds, so that each ratio
# compares rows measured side by side.
# Usage: bench/many_conn_tcp.sh BUILD_DIR [ROUNDS] [N] > results.txt
# Needs iperf3 and ucx-utils (bench/compare.sh installs them); rows whose tool is missing
# are skipped with a line saying so.
set -u
build=$1; rounds=${2:-3}; q=${3:-8}
perf=$build/samples/rdmx_perf
port=7600

rdmx() { # label, client args... (the server runs with the same test arguments)
    label=$1; shift
    port=$((port + 1))
    "$perf" --server "$@" "tcp://127.0.0.1:$port" >/dev/null 2>&1 &
    spid=$!
    sleep 1
    out=$("$perf" "$@" --json "tcp://127.0.0.1:$port" 2>&1)
    wait $spid
    echo "$label $(echo "$out" | tr -d '\n')"
}

iperf() { # label, args
    label=$1; shift
    command -v iperf3 >/dev/null || { echo "$label skipped: no iperf3"; return; }
    iperf3 -s -1 -p 5301 >/dev/null 2>&1 &
    spid=$!
    sleep 0.3
    out=$(iperf3 -c 127.0.0.1 -p 5301 -J "$@" 2>&1 | python3 -c \
        'import json,sys; d=json.load(sys.stdin); print(d["end"]["sum_received"]["bits_per_second"]/8e9, "GB/s")')
    wait $spid
    echo "$label $out"
}

ucx() { # label, test, extra args
    label=$1; t=$2; shift 2
    command -v ucx_perftest >/dev/null || { echo "$label skipped: no ucx_perftest"; return; }
    UCX_TLS=tcp,self ucx_perftest -p 13337 "$@" >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(UCX_TLS=tcp,self ucx_perftest -p 13337 -t "$t" -s 8 -n 20000 "$@" 127.0.0.1 2>&1 | tail -3 | tr -s ' ' | tr '\n' ' ')
    wait $spid
    echo "$label $out"
}

for r in $(seq 1 "$rounds"); do
    echo "# round $r"
    rdmx "q${q}_own_64B" -t send_bw -s 64 -n 20000 -q "$q"
    rdmx "q${q}_shared_64B" -t send_bw -s 64 -n 20000 -q "$q" --shared-cq
    rdmx "q${q}_shared_event_64B" -t send_bw -s 64 -n 20000 -q "$q" --shared-cq -e
    rdmx "q${q}_own_64K" -t send_bw -s 64K -n 4000 -q "$q"
    rdmx "q${q}_shared_64K" -t send_bw -s 64K -n 4000 -q "$q" --shared-cq
    iperf "iperf3_P${q}_64K" -P "$q" -l 64K -n 2G
    rdmx "send_lat_8B_poll" -t send_lat -s 8 -n 20000
    rdmx "send_lat_8B_event" -t send_lat -s 8 -n 20000 -e
    ucx "ucx_tag_lat_8B_poll" tag_lat
done
