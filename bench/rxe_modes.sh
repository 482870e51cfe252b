#!/usr/bin/env bash
# Runs inside the rxe guest (tests/guest/rxe-guest.sh): REPS pairs of perftest and
# rdmx_perf latency runs, back to back with the order alternating, pinned as
# bench/compare.sh pins them (server vCPU 0, client vCPU 1), and counts how many runs of
# each tool land in the fast mode (profile-2026-11-29.md, sections 12-14). From the host:
#   tests/guest/rxe-guest.sh --cache build/guest-cache --share "$PWD" --share "$(realpath build)" \
#       -- bash "$PWD/bench/rxe_modes.sh" "$(realpath build)" 20
#   bench/rxe_modes.sh BUILD_DIR REPS [ITERS (1000)] [TESTS ("send_lat write_lat")] [FAST_US (18)]
set -uo pipefail
BUILD=$1 REPS=$2 ITERS=${3:-1000} TESTS=${4:-send_lat write_lat} FAST=${5:-18}
PERF=$BUILD/samples/rdmx_perf
IP=$RDMX_GUEST_IP
OUT=$(mktemp)

pair() { # server client: prints the client's output
    timeout 60 taskset -c 0 bash -c "$1" >/dev/null 2>&1 &
    local spid=$!
    sleep 0.5
    timeout 60 taskset -c 1 bash -c "$2" 2>&1
    wait "$spid" 2>/dev/null
}
perftest() { # test: perftest's typical (median) latency, one way
    pair "ib_$1 -d rxe0 -R -s 2 -n $ITERS" "ib_$1 -d rxe0 -R -s 2 -n $ITERS $IP" |
        awk '$1 == 2 { v = $5 } END { print v }'
}
rdmx() { # test: rdmx_perf's median latency, one way
    local spin=""
    [ "$1" = write_lat ] && spin=--spin-only # as ib_write_lat, which spins on memory only
    pair "$PERF --server rdma://$IP:18600" "$PERF rdma://$IP:18600 -t $1 -s 2 -n $ITERS -w 100 $spin --json" |
        python3 -c 'import json, sys
s = sys.stdin.read()
try:
    print("%.2f" % json.loads(s[s.index("{"):])["results"][0]["median_us"])
except ValueError:
    print("")'
}

for ((rep = 1; rep <= REPS; rep++)); do
    for t in $TESTS; do
        if ((rep % 2)); then
            a=$(perftest "$t")
            b=$(rdmx "$t")
        else
            b=$(rdmx "$t")
            a=$(perftest "$t")
        fi
        echo "rep $rep $t perftest ${a:--} rdmx ${b:--}" | tee -a "$OUT"
    done
done

python3 - "$OUT" "$FAST" <<'EOF'
import statistics, sys
fast = float(sys.argv[2])
runs = {}
for line in open(sys.argv[1]):
    _, _, test, _, a, _, b = line.split()
    for tool, v in (("perftest", a), ("rdmx", b)):
        if v != "-":
            runs.setdefault((test, tool), []).append(float(v))
print(f"2 B, one way, us; fast = below {fast:g} us")
for (test, tool), v in sorted(runs.items()):
    f = [x for x in v if x < fast]
    mean = f"{statistics.mean(f):.2f}" if f else "-"
    print(f"{test:10} {tool:9} runs {len(v):3}  median {statistics.median(v):6.2f}  "
          f"fast {len(f):3}  mean of the fast runs {mean}")
EOF
rm -f "$OUT"
