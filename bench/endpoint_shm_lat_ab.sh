#!/bin/sh
# The 8 B endpoint ping-pong over shm://, two builds of rdmx against the anchors in one
# interleaved run: per round rdmx_ep_perf of BUILD_A, of BUILD_B, fi_rdm_tagged_pingpong
# over libfabric's shm provider, ucx_perftest tag_lat with UCX_TLS=sm (the latency rows of
# bench/endpoints_shm.sh). Server CPU 0, client CPU 1.
# Usage: sh bench/endpoint_shm_lat_ab.sh BUILD_A BUILD_B FABTESTS_DIR [ROUNDS (8)]
# Lines: "ROUND A us B us fab us ucx us load L" (medians of each tool's run, one-way).
set -u
a=$1; b=$2; ft=$3; rounds=${4:-8}
port=9800

ep() { # build
    port=$((port + 2))
    taskset -c 0 timeout 60 "$1/samples/rdmx_ep_perf" --server -s 4M "shm://eplat:$port" >/dev/null 2>&1 &
    spid=$!
    sleep 0.4
    taskset -c 1 timeout 60 "$1/samples/rdmx_ep_perf" "shm://eplat:$port" --json -t tag_lat -s 8 -n 20000 -w 1000 |
        python3 -c "import sys, json; print(json.load(sys.stdin)['lat_us'])" 2>/dev/null || echo failed
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
}

fab() {
    port=$((port + 2))
    taskset -c 0 timeout 60 "$ft/fi_rdm_tagged_pingpong" -p shm -E -B $port -S 8 -I 20000 -w 1000 >/dev/null 2>&1 &
    spid=$!
    sleep 0.4
    taskset -c 1 timeout 60 "$ft/fi_rdm_tagged_pingpong" -p shm -E -B $((port + 1)) -P $port -S 8 -I 20000 -w 1000 \
        127.0.0.1 2>&1 | awk '$1 == "8" && NF == 7 { print $6 }'
    wait $spid 2>/dev/null
}

ucx() {
    port=$((port + 2))
    UCX_TLS=sm taskset -c 0 timeout 60 ucx_perftest -p $port >/dev/null 2>&1 &
    spid=$!
    sleep 0.4
    UCX_TLS=sm taskset -c 1 timeout 60 ucx_perftest -p $port -t tag_lat -s 8 -n 20000 localhost 2>&1 |
        awk '/Final:/ { print $3 }'
    wait $spid 2>/dev/null
}

for r in $(seq 1 "$rounds"); do
    echo "$r A $(ep "$a") B $(ep "$b") fab $(fab) ucx $(ucx) load $(cut -d' ' -f1 /proc/loadavg)"
done
