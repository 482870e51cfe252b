#!/bin/sh
# rdmx_ep_perf -t self_lat, short: the ping-pong between two endpoints of one process on one
# thread, which bench/ uses for the library's CPU work per message (docs/performance.md).
# Over TCP and shm:// it must finish and report a positive one-way time.
# Usage: ep_self_smoke.sh BUILD_DIR
set -u
perf=$1/samples/rdmx_ep_perf
for addr in tcp://127.0.0.1:0 "shm://selfsmoke$$:0"; do
    rc=0
    out=$(timeout 60 "$perf" "$addr" -t self_lat -s 8 -n 200 -w 10 --json 2>&1) || rc=$?
    [ $rc -eq 0 ] || { echo "ep_self_smoke: FAIL: $addr: exited $rc: $out"; exit 1; }
    python3 - "$out" "$addr" <<'PY' || { echo "ep_self_smoke: FAIL: $addr: bad report: $out"; exit 1; }
import json, sys
doc = json.loads(sys.argv[1])
assert doc["test"] == "self_lat" and doc["size"] == 8 and 0 < doc["lat_us"] <= doc["p99_us"], doc
print(f"ep_self_smoke: {sys.argv[2]}: self_lat 8 B one-way {doc['lat_us']:.3f} us (p99 {doc['p99_us']:.3f})")
PY
done
