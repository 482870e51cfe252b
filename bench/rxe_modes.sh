#!/usr/bin/env bash
# Runs inside the rxe guest (tests/guest/rxe-guest.sh): REPS reps of bench/compare.sh's
# verbs latency pairs at 2 B (perftest and rdmx_perf back to back, the order alternating
# from rep to rep, server vCPU 0, client vCPU 1), then counts how many runs of each tool
# land in the fast mode (profile-2026-11-29.md, sections 12-15). From the host:
#   tests/guest/rxe-guest.sh --cache build/guest-cache --share "$PWD" --share "$(realpath build)" \
#       -- bash "$PWD/bench/rxe_modes.sh" build 20
#   bench/rxe_modes.sh BUILD_DIR REPS [ITERS (1000)] [TESTS ("send_lat write_lat")] [FAST_US (18)]
# BUILD_DIR is relative to the repository, as compare.sh's RDMX_BUILD_DIR.
set -euo pipefail
export RDMX_BUILD_DIR=$1
REPS=$2 FAST=${5:-18}
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
: >"$RAW/results.jsonl"
: >"$RAW/errors.jsonl"
GUEST_LAT_SIZES=2 GUEST_LAT_ITERS=${3:-1000} GUEST_LAT_TESTS=${4:-send_lat write_lat} \
    bash "$(dirname "$0")/compare.sh" guest-verbs "$RAW" 0 "$REPS"

python3 - "$RAW/results.jsonl" "$FAST" <<'PY'
import json, statistics, sys
fast = float(sys.argv[2])
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["metric"] == "lat_us":
        runs.setdefault((r["test"], r["tool"]), []).append(float(r["value"]))
print(f"2 B, one way, us, in rep order; fast = below {fast:g} us")
for (test, tool), v in sorted(runs.items()):
    f = [x for x in v if x < fast]
    mean = f"{statistics.mean(f):.2f}" if f else "-"
    print(f"{test:10} {tool:9} runs {len(v):3}  median {statistics.median(v):6.2f}  "
          f"fast {len(f):3}  mean of the fast runs {mean}")
    print("   " + " ".join(f"{x:.2f}" for x in v))
PY
