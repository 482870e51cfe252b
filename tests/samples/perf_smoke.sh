#!/bin/sh
# rdmx_perf's tests as bench/compare.sh runs them, short: each must finish and report a
# positive latency or rate in its JSON. The tool checks the rest itself and fails otherwise.
#   atomics  (compare.sh --atomics): fetch_add_lat, compare_swap_lat, fetch_add_bw,
#            compare_swap_bw; every old value the tool is given must equal what the counter
#            held, so the atomics really added and swapped in order. Another size than 8 B
#            must be refused.
#   windows  (compare.sh --windows): register, register_send, register_send_bind,
#            window_bind, window_send, window_send_local at 4 KiB and 1 MiB; each completion
#            has the opcode its step expects (bind_window, then invalidate_window), each
#            region's descriptor covers the object, every window_send reply revoked exactly
#            the window its request named (with_invalidate, invalidated_key), no other
#            test's reply revoked one.
#   allocated (shm only): write_bw and read_bw with --allocate, the buffers from
#            domain::allocate_memory, so that the client copies into the server's mapped
#            region itself; the rates reported.
# Usage: perf_smoke.sh BUILD_DIR tcp|shm|rdma atomics|windows|allocated
#   tcp:  on this host, over tcp://127.0.0.1
#   shm:  on this host, over shm://perf-smoke
#   rdma: inside the test guest, over rdma://$RDMX_GUEST_IP, server vCPU 0, client vCPU 1;
#         a device without the feature (siw) is a skip (exit 77) once rdmx_perf says so
#         (windows: after the region tests, which siw runs)
set -u
build=$1; kind=$2; what=$3
perf=$build/samples/rdmx_perf
out=$(mktemp -d)
me="perf_smoke $what"
fail() { echo "$me: FAIL: $*"; for f in "$out"/*.log; do echo "--- $(basename "$f")"; sed 's/^/    /' "$f"; done; exit 1; }

case $what in
atomics) server_args="-o 32"; lacks="has no atomics"; port0=7490 ;;
windows) server_args=""; lacks="has no memory windows"; port0=7590 ;;
allocated) server_args="--allocate"; lacks="(never skipped: every backend allocates)"; port0=7690 ;;
*) echo "usage: perf_smoke.sh BUILD_DIR tcp|shm|rdma atomics|windows|allocated" >&2; exit 2 ;;
esac
if [ "$kind" = rdma ]; then
    base="rdma://${RDMX_GUEST_IP:?not in the test guest}"; pin_s="taskset -c 0"; pin_c="taskset -c 1"; port=$port0
elif [ "$kind" = shm ]; then
    base="shm://perf-smoke"; pin_s=""; pin_c=""; port=0
else
    base="tcp://127.0.0.1"; pin_s=""; pin_c=""; port=0
fi

# Runs one server and one client; leaves the client's JSON in $out/client.log.
run() { # test args...
    t=$1; shift
    rm -f "$out/server.log" # the last server's "listening" must not be read as this one's
    # shellcheck disable=SC2086 # server_args is a list
    $pin_s timeout 120 "$perf" --server "$base:$port" $server_args >"$out/server.log" 2>&1 &
    spid=$!
    i=0
    until grep -q listening "$out/server.log" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 300 ] || fail "$t: server did not start"; sleep 0.1
    done
    p=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$out/server.log" | head -n 1)
    rc=0
    $pin_c timeout 120 "$perf" "$base:$p" -t "$t" --json "$@" >"$out/client.log" 2>&1 || rc=$?
    if [ $rc -ne 0 ] && grep -q "$lacks" "$out/client.log"; then
        kill $spid # it waits for a client that will not come
        echo "$me: SKIP: $(cat "$out/client.log")"
        exit 77
    fi
    wait $spid
    src=$?
    [ $rc -eq 0 ] || fail "$t: client exited $rc"
    [ $src -eq 0 ] || fail "$t: server exited $src"
    [ "$kind" = rdma ] && port=$((port + 1))
    return 0
}

# Checks $out/client.log: TEST ITERS SIZES (comma-separated bytes) lat|lat+rate|rate|bw
report() {
    python3 - "$out/client.log" "$me" "$@" <<'PY' || fail "$1: bad report"
import json, sys
doc = json.loads(open(sys.argv[1]).read())
me, test, iters, sizes, kind = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
rs = doc["results"]
assert [r["size"] for r in rs] == [int(s) for s in sizes.split(",")], rs
for r in rs:
    assert r["test"] == test, r
    if kind in ("lat", "lat+rate"):
        assert r["iterations"] == iters and 0 < r["min_us"] <= r["median_us"] <= r["max_us"], r
        rate = ""
        if kind == "lat+rate":
            assert r["ops_per_s"] > 0, r
            rate = f", {r['ops_per_s']:.0f} ops/s"
        print(f"{me}: {test} {r['size']} B: median {r['median_us']:.2f} us{rate} over {doc['backend']}")
    elif kind == "bw":
        assert r["mb_per_s"] > 0 and r["iterations"] == iters, r
        print(f"{me}: {test} {r['size']} B: {r['mb_per_s']:.0f} MB/s over {doc['backend']}")
    else:
        assert r["msg_per_s"] > 0 and doc["depth"] == 64 and 1 <= doc["outs"] <= 32, (r, doc)
        print(f"{me}: {test}: {r['msg_per_s']:.0f} atomics/s, outs {doc['outs']}, over {doc['backend']}")
PY
}

if [ "$what" = atomics ]; then
    for t in fetch_add_lat compare_swap_lat; do
        run $t -n 500 -w 50
        report $t 500 8 lat
    done
    # The server busy-polling meanwhile (on TCP its thread serves the atomics then).
    run fetch_add_lat -n 500 -w 50 --target-poll
    report fetch_add_lat 500 8 lat
    for t in fetch_add_bw compare_swap_bw; do
        # a window of 64, 32 executing at once (-o on both sides), one in 16 signalled, lists of 4
        run $t -n 5000 -w 100 -d 64 -o 32 -c 16 -l 4
        report $t 0 8 rate
    done
    # Atomics are 8 bytes: another size is refused before anything runs.
    if "$perf" "$base:1" -t fetch_add_lat -s 16 >"$out/size.log" 2>&1; then fail "-s 16 accepted"; fi
    grep -q "atomics are 8 bytes" "$out/size.log" || fail "unclear size error: $(cat "$out/size.log")"
    echo "$me: $kind: -s 16 -> $(cat "$out/size.log")"
elif [ "$what" = allocated ]; then
    for t in write_bw read_bw; do
        run $t -s 64K -s 1M -n 200 -w 20 --allocate
        report $t 200 65536,1048576 bw
    done
else
    for t in register register_send register_send_bind window_bind window_send window_send_local; do
        run $t -s 4K -s 1M -n 60 -w 6
        report $t 60 4096,1048576 lat+rate
    done
fi
rm -rf "$out"
