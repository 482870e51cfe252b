#!/bin/sh
# Fairness under a flood (issue 26): a well-behaved client's 8 B tagged ping-pong
# (rdmx_ep_perf -t tag_lat) alone, and beside a flooder (rdmx_ep_perf -t flood: 1 KiB
# messages to a tag the server never receives, as fast as its endpoint takes them, never
# receiving), in interleaved rounds, each row against a fresh server. Prints each row's
# median and p99 one-way latency; the issue asks for p99 beside a flooder within 2x of p99
# alone. Server pinned to CPU 0, client and flooder to CPU 1; every run bounded by timeout.
# On TCP loopback, then in the rxe guest and in the siw guest (unless --no-guest).
# Usage: bench/flood_p99.sh BUILD_DIR [ROUNDS] [GUEST_ROUNDS|--no-guest] > results.txt
#        (inside a guest: bench/flood_p99.sh --guest BUILD_DIR ROUNDS LABEL)
set -u
guest=0
[ "$1" = --guest ] && { guest=1; shift; }
build=$1; rounds=${2:-5}; guest_rounds=${3:-3}
perf=$build/samples/rdmx_ep_perf
scheme=tcp host=127.0.0.1 settle=0.5 limit=120 label=tcp iters=5000
if [ $guest = 1 ]; then
    scheme=rdma host=$RDMX_GUEST_IP settle=2 limit=300 label=${3:-rdma} iters=2000
fi
port=7800

row() { # name flood(0|1)
    port=$((port + 1))
    taskset -c 0 timeout $((limit + 30)) "$perf" --server "$scheme://$host:$port" >/dev/null 2>&1 &
    spid=$!
    sleep $settle
    fpid=
    if [ "$2" = 1 ]; then
        taskset -c 1 timeout $((limit + 30)) "$perf" "$scheme://$host:$port" -t flood -s 1K >/tmp/flood.$$ 2>&1 &
        fpid=$!
        sleep 1 # the flood reaches the server and stops where its credit ends
    fi
    out=$(timeout $limit taskset -c 1 "$perf" "$scheme://$host:$port" --json -t tag_lat -s 8 -n $iters -w 200 2>&1 |
        grep -v LAST_WQE_REACHED)
    fl=
    if [ -n "$fpid" ]; then
        kill $fpid 2>/dev/null; wait $fpid 2>/dev/null
        fl=" ($(tail -n 1 /tmp/flood.$$ | tr -d '\n'))"
        rm -f /tmp/flood.$$
    fi
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
    echo "${label}_$1 $(echo "$out" | tr -d '\n')$fl"
}

rounds_of() {
    for r in $(seq 1 "$1"); do
        echo "# $label round $r load $(cut -d' ' -f1 /proc/loadavg)"
        row tag_lat_8B_alone 0
        row tag_lat_8B_beside_flooder 1
    done
}

if [ $guest = 1 ]; then
    rounds_of "$rounds"
    exit 0
fi
rounds_of "$rounds"
[ "$guest_rounds" = --no-guest ] && exit 0
root=$(cd "$(dirname "$0")/.." && pwd)
for p in rxe siw; do
    echo "# guest: $p, $guest_rounds rounds"
    "$root/tests/guest/rxe-guest.sh" --provider $p --cache "${RDMX_GUEST_CACHE:-$build/guest-cache}" \
        --share "$(realpath "$build")" --timeout 1200 -- \
        sh "$root/bench/flood_p99.sh" --guest "$(realpath "$build")" "$guest_rounds" $p ||
        echo "# guest: rxe-guest.sh exited with $?"
done
