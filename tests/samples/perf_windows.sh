#!/bin/sh
# rdmx_perf's window-or-region tests (register, window_bind, window_send, window_send_local,
# register_send, register_send_bind) as bench/compare.sh --windows runs them, short, at 4 KiB and 1 MiB: each
# must finish and report a positive latency and rate in its JSON. The tool checks the rest
# itself and fails otherwise: each completion has the opcode its step expects (bind_window,
# then invalidate_window), each registered region's descriptor covers the object, every
# window_send reply revoked exactly the window its request named (with_invalidate,
# invalidated_key) and no other test's reply revoked one.
# Usage: perf_windows.sh BUILD_DIR tcp|rdma
#   tcp:  on this host, over tcp://127.0.0.1
#   rdma: inside the test guest, over rdma://$RDMX_GUEST_IP, server vCPU 0, client vCPU 1;
#         a device without memory windows (siw) runs the region tests, then skips (exit
#         77) when rdmx_perf says so
set -u
build=$1; kind=$2
perf=$build/samples/rdmx_perf
out=$(mktemp -d)
fail() { echo "perf_windows: FAIL: $*"; for f in "$out"/*.log; do echo "--- $(basename "$f")"; sed 's/^/    /' "$f"; done; exit 1; }

if [ "$kind" = rdma ]; then
    base="rdma://${RDMX_GUEST_IP:?not in the test guest}"; pin_s="taskset -c 0"; pin_c="taskset -c 1"; port=7590
else
    base="tcp://127.0.0.1"; pin_s=""; pin_c=""; port=0
fi

# Runs one server and one client; leaves the client's JSON in $out/client.log.
run() { # test args...
    t=$1; shift
    rm -f "$out/server.log" # the last server's "listening" must not be read as this one's
    $pin_s timeout 120 "$perf" --server "$base:$port" >"$out/server.log" 2>&1 &
    spid=$!
    i=0
    until grep -q listening "$out/server.log" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 300 ] || fail "$t: server did not start"; sleep 0.1
    done
    p=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$out/server.log" | head -n 1)
    rc=0
    $pin_c timeout 120 "$perf" "$base:$p" -t "$t" --json "$@" >"$out/client.log" 2>&1 || rc=$?
    if [ $rc -ne 0 ] && grep -q "has no memory windows" "$out/client.log"; then
        kill $spid # it waits for a client that will not come
        echo "perf_windows: SKIP: $(cat "$out/client.log")"
        exit 77
    fi
    wait $spid
    src=$?
    [ $rc -eq 0 ] || fail "$t: client exited $rc"
    [ $src -eq 0 ] || fail "$t: server exited $src"
    [ "$kind" = rdma ] && port=$((port + 1))
    return 0
}

for t in register register_send register_send_bind window_bind window_send window_send_local; do
    run $t -s 4K -s 1M -n 200 -w 20
    python3 - "$out/client.log" "$t" <<'PY' || fail "$t: bad report"
import json, sys
doc = json.loads(open(sys.argv[1]).read())
rs = doc["results"]
assert [r["size"] for r in rs] == [4096, 1 << 20], rs
for r in rs:
    assert r["test"] == sys.argv[2] and r["iterations"] == 200, r
    assert 0 < r["min_us"] <= r["median_us"] <= r["max_us"] and r["ops_per_s"] > 0, r
    print(f"perf_windows: {r['test']} {r['size']} B: median {r['median_us']:.2f} us, "
          f"{r['ops_per_s']:.0f} ops/s over {doc['backend']}")
PY
done
rm -rf "$out"
