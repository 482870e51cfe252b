#!/bin/sh
# Progress by the polled queue (issue 27), before against after: two builds of rdmx side by
# side on TCP loopback, in interleaved rounds (each round runs every row on build A, then
# on build B), in compare.sh's regime (server on CPU 0, client on CPU 1, bounded by timeout).
# Rows: 64 B messages over 8 connections with the server's on one shared completion queue
# and on 8 queues of their own (rdmx_perf -q 8 [--shared-cq]), and the endpoint rows of
# bench/endpoints.sh (tag_lat 8 B, with and without busy_poll, with fd() taken (-F) and
# sleeping on it (-e); tag_bw 64 B, also with fd() taken, and 1 MiB).
# Prints one line per run; bench/tcp_progress_ab.py turns them into medians and ratios.
# Usage: bench/tcp_progress_ab.sh BUILD_A BUILD_B [ROUNDS (5)] > results.txt
set -u
a=$1; b=$2; rounds=${3:-5}
port=7900

run() { # build label server-args client-args...
    build=$1; label=$2; srv=$3; shift 3
    prog=$build/samples/$1; shift
    port=$((port + 1))
    taskset -c 0 timeout 90 "$prog" --server $srv "tcp://127.0.0.1:$port" >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(timeout 60 taskset -c 1 "$prog" "tcp://127.0.0.1:$port" --json "$@" 2>&1 | tr -d '\n')
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
    echo "$label ${out:-failed}"
}

rows() { # build tag
    run "$1" "$2 q8_own_64B" "-q 8" rdmx_perf -t send_bw -s 64 -n 100000 -q 8
    run "$1" "$2 q8_shared_64B" "-q 8 --shared-cq" rdmx_perf -t send_bw -s 64 -n 100000 -q 8 --shared-cq
    run "$1" "$2 ep_tag_lat_8B" "-s 4M" rdmx_ep_perf -t tag_lat -s 8 -n 20000 -w 1000
    run "$1" "$2 ep_tag_lat_8B_busy" "-s 4M -B" rdmx_ep_perf -t tag_lat -s 8 -n 20000 -w 1000 -B
    run "$1" "$2 ep_tag_lat_8B_fd" "-s 4M -F" rdmx_ep_perf -t tag_lat -s 8 -n 20000 -w 1000 -F
    run "$1" "$2 ep_tag_lat_8B_event" "-s 4M -e" rdmx_ep_perf -t tag_lat -s 8 -n 20000 -w 1000 -e
    run "$1" "$2 ep_tag_rate_64B" "-s 4M" rdmx_ep_perf -t tag_bw -s 64 -n 200000 -W 64
    run "$1" "$2 ep_tag_rate_64B_fd" "-s 4M -F" rdmx_ep_perf -t tag_bw -s 64 -n 200000 -W 64 -F
    run "$1" "$2 ep_tag_bw_1M" "-s 4M" rdmx_ep_perf -t tag_bw -s 1M -n 2000 -W 16
}

for r in $(seq 1 "$rounds"); do
    echo "# round $r load $(cut -d' ' -f1 /proc/loadavg)"
    rows "$a" A
    rows "$b" B
done
