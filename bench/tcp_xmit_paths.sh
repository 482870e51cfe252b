#!/usr/bin/env bash
# Where the segments of one rdmx_perf TCP run leave from: every packet queued on lo for
# 0.3 s in the middle of the run (perf record -a -g -e net:net_dev_queue), counted by kind
# (data: > 30000 B; ack: a bare TCP ACK, <= 66 B; small: anything else, e.g. rdmx's own
# ACK frames), by CPU, and by the kernel function that transmitted it (the call chain's
# frame above __tcp_transmit_skb, or tcp_sendmsg when that is on the chain: the process's
# own system call). Server on CPU 0, client on CPU 1. Needs root (system-wide tracing).
#   bench/tcp_xmit_paths.sh TEST SIZE ITERS     e.g. bench/tcp_xmit_paths.sh write_bw 1M 4000
# ITERS must keep the run going for about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
PERF=${RDMX_BUILD_DIR:-build}/samples/rdmx_perf
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
port=$((18400 + RANDOM % 200))
"$PERF" --server "tcp://127.0.0.1:$port" --cpu 0 >/dev/null 2>&1 &
for ((i = 0; i < 100; ++i)); do
    ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.05
done
"$PERF" "tcp://127.0.0.1:$port" --cpu 1 -t "$1" -s "$2" -n "$3" | tail -1 &
sleep 0.6
perf record -q -a -g -e net:net_dev_queue -o "$RAW/data" -- sleep 0.3 >/dev/null 2>&1
wait
perf script -i "$RAW/data" -F comm,tid,cpu,event,trace,ip,sym 2>/dev/null >"$RAW/txt"
python3 - "$RAW/txt" <<'PY'
import collections, re, sys
count = collections.Counter()
for ev in open(sys.argv[1]).read().split("\n\n"):
    lines = [l.strip() for l in ev.strip().split("\n") if l.strip()]
    m = re.match(r"(\S+)\s+(\d+)\s+\[(\d+)\].*len=(\d+)", lines[0]) if lines else None
    if not m or m.group(1) != "rdmx_perf":
        continue
    cpu, n = int(m.group(3)), int(m.group(4))
    syms = [l.split()[1] for l in lines[1:] if len(l.split()) > 1]
    kind = "data" if n > 30000 else "ack" if n <= 66 else "small"
    if "tcp_sendmsg_locked" in syms:
        path = "own tcp_sendmsg"
    elif "__tcp_transmit_skb" in syms and syms.index("__tcp_transmit_skb") + 1 < len(syms):
        path = syms[syms.index("__tcp_transmit_skb") + 1]
    else:
        path = "?"
    count[(kind, cpu, path)] += 1
print(f"{'packets':>8}  kind   cpu  sent from")
for (kind, cpu, path), v in sorted(count.items()):
    print(f"{v:8d}  {kind:5s}  {cpu:3d}  {path}")
PY
