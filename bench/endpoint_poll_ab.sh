#!/bin/sh
# A spinning endpoint's cost per poll, before against after: two builds of rdmx side by side,
# interleaved per round, over tcp:// on loopback and over shm://, server on CPU 0 and client
# on CPU 1 (as compare.sh). Rows per transport: 8 B tagged ping-pong (rdmx_ep_perf tag_lat,
# whose JSON carries empty_poll_us, the mean time of a poll() that found nothing), the same
# with busy_poll (-B), and 64 B messages with a window of 64 (tag_bw). Odd rounds run A
# first, even rounds B (the TCP rows drift with the order otherwise).
# Usage: sh bench/endpoint_poll_ab.sh BUILD_A BUILD_B [ROUNDS (4)] > results.txt
# Lines: "ROUND BUILD TRANSPORT ROW JSON".
set -u
a=$1; b=$2; rounds=${3:-4}
port=9500

run() { # round tag build transport row args...
    r=$1; tag=$2; build=$3; tr=$4; row=$5; shift 5
    port=$((port + 2))
    case $tr in
    tcp) addr="tcp://127.0.0.1:$port" ;;
    shm) addr="shm://epab:$port" ;;
    esac
    taskset -c 0 timeout 90 "$build/samples/rdmx_ep_perf" --server -s 4M "$addr" >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(timeout 60 taskset -c 1 "$build/samples/rdmx_ep_perf" "$addr" --json "$@" 2>&1 | tr -d '\n')
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
    echo "$r $tag $tr $row ${out:-failed}"
}

for r in $(seq 1 "$rounds"); do
    echo "# round $r load $(cut -d' ' -f1 /proc/loadavg)"
    for tr in tcp shm; do
        order="A B"
        [ $((r % 2)) = 0 ] && order="B A" # each build first in every other round
        for x in $order; do
            build=$a; [ $x = B ] && build=$b
            run "$r" "$x" "$build" "$tr" lat8 -t tag_lat -s 8 -n 20000 -w 1000
            run "$r" "$x" "$build" "$tr" lat8_busy -t tag_lat -s 8 -n 20000 -w 1000 -B
            run "$r" "$x" "$build" "$tr" rate64 -t tag_bw -s 64 -n 200000 -W 64
        done
    done
done
