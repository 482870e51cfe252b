#!/bin/sh
# rdmx_perf's atomic tests (fetch_add_lat, compare_swap_lat, fetch_add_bw, compare_swap_bw)
# as bench/compare.sh --atomics runs them, short: each must finish, report a positive
# latency or rate in its JSON, and (the tool checks this itself, and fails otherwise) see
# every old value it is given equal what the counter held, so the atomics really added
# and swapped in order. An atomic test with another size must be refused.
# Usage: perf_atomics.sh BUILD_DIR tcp|rdma
#   tcp:  on this host, over tcp://127.0.0.1
#   rdma: inside the test guest, over rdma://$RDMX_GUEST_IP, server vCPU 0, client vCPU 1;
#         a device without atomics (siw) is a skip (exit 77) when rdmx_perf says so
set -u
build=$1; kind=$2
perf=$build/samples/rdmx_perf
out=$(mktemp -d)
fail() { echo "perf_atomics: FAIL: $*"; for f in "$out"/*.log; do echo "--- $(basename "$f")"; sed 's/^/    /' "$f"; done; exit 1; }

if [ "$kind" = rdma ]; then
    base="rdma://${RDMX_GUEST_IP:?not in the test guest}"; pin_s="taskset -c 0"; pin_c="taskset -c 1"; port=7490
else
    base="tcp://127.0.0.1"; pin_s=""; pin_c=""; port=0
fi

# Runs one server and one client; leaves the client's JSON in $out/client.log.
run() { # test args...
    t=$1; shift
    rm -f "$out/server.log" # the last server's "listening" must not be read as this one's
    $pin_s timeout 120 "$perf" --server "$base:$port" -o 32 >"$out/server.log" 2>&1 &
    spid=$!
    i=0
    until grep -q listening "$out/server.log" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 300 ] || fail "$t: server did not start"; sleep 0.1
    done
    p=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$out/server.log" | head -n 1)
    rc=0
    $pin_c timeout 120 "$perf" "$base:$p" -t "$t" --json "$@" >"$out/client.log" 2>&1 || rc=$?
    if [ $rc -ne 0 ] && grep -q "has no atomics" "$out/client.log"; then
        kill $spid # it waits for a client that will not come
        echo "perf_atomics: SKIP: $(cat "$out/client.log")"
        exit 77
    fi
    wait $spid
    src=$?
    [ $rc -eq 0 ] || fail "$t: client exited $rc"
    [ $src -eq 0 ] || fail "$t: server exited $src"
    [ "$kind" = rdma ] && port=$((port + 1))
    return 0
}

for t in fetch_add_lat compare_swap_lat; do
    run $t -n 500 -w 50
    python3 - "$out/client.log" "$t" <<'EOF' || fail "$t: bad report"
import json, sys
doc = json.loads(open(sys.argv[1]).read())
r = doc["results"][0]
assert r["test"] == sys.argv[2] and r["size"] == 8 and r["iterations"] == 500, r
assert 0 < r["min_us"] <= r["median_us"] <= r["max_us"], r
print(f"perf_atomics: {r['test']}: median {r['median_us']:.2f} us round trip over {doc['backend']}")
EOF
done
# The server busy-polling meanwhile (on TCP its thread serves the atomics then).
run fetch_add_lat -n 500 -w 50 --target-poll
grep -q '"median_us"' "$out/client.log" || fail "fetch_add_lat --target-poll: no latency"
echo "perf_atomics: fetch_add_lat --target-poll: $(sed -n 's/.*"median_us": \([0-9.]*\).*/\1/p' "$out/client.log") us"
for t in fetch_add_bw compare_swap_bw; do
    # a window of 64, 32 executing at once (-o on both sides), one in 16 signalled, lists of 4
    run $t -n 5000 -w 100 -d 64 -o 32 -c 16 -l 4
    python3 - "$out/client.log" "$t" <<'EOF' || fail "$t: bad report"
import json, sys
doc = json.loads(open(sys.argv[1]).read())
r = doc["results"][0]
assert r["test"] == sys.argv[2] and r["size"] == 8 and r["msg_per_s"] > 0, r
assert doc["depth"] == 64 and 1 <= doc["outs"] <= 32, doc
print(f"perf_atomics: {r['test']}: {r['msg_per_s']:.0f} atomics/s, outs {doc['outs']}, over {doc['backend']}")
EOF
done

# Atomics are 8 bytes: another size is refused before anything runs.
if "$perf" "$base:1" -t fetch_add_lat -s 16 >"$out/size.log" 2>&1; then fail "-s 16 accepted"; fi
grep -q "atomics are 8 bytes" "$out/size.log" || fail "unclear size error: $(cat "$out/size.log")"
echo "perf_atomics: $kind: -s 16 -> $(cat "$out/size.log")"
rm -rf "$out"
