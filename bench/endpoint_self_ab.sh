#!/bin/sh
# The library's CPU work per message, before against after: rdmx_ep_perf -t self_lat (two
# endpoints of one process, each in a domain of its own, ping-pong on one thread, so that
# no cache line crosses CPUs) of two builds, on CPU 1, alternating which runs first.
# Unlike the two-process ping-pong it does not move with the host's mode of moving lines
# between CPUs (docs/performance.md, "CPU work per message").
# Usage: sh bench/endpoint_self_ab.sh BUILD_A BUILD_B [ROUNDS (6)] [shm|tcp (shm)]
# Lines: "ROUND A us B us B/A" (one-way medians of 100000 round trips, ITERS to change).
set -u
a=$1; b=$2; rounds=${3:-6}; scheme=${4:-shm}

run() { # build tag round
    case $scheme in
    shm) addr="shm://selfab$2$3:0" ;;
    tcp) addr="tcp://127.0.0.1:0" ;;
    esac
    taskset -c 1 timeout 120 "$1/samples/rdmx_ep_perf" "$addr" -t self_lat -s 8 -n "${ITERS:-100000}" --json |
        python3 -c "import sys, json; print(json.load(sys.stdin)['lat_us'])" 2>/dev/null || echo failed
}

for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then
        x=$(run "$a" a "$r"); y=$(run "$b" b "$r")
    else
        y=$(run "$b" b "$r"); x=$(run "$a" a "$r")
    fi
    echo "$r A $x B $y $(python3 -c "print(round($y / $x, 3))" 2>/dev/null || echo -)"
done
