#!/usr/bin/env python3
"""Turns the raw lines of bench/compare.sh into <out>.md, <out>.json and <out>.png.

Medians over the interleaved reps; ratios are rdmx / peer (bandwidth: higher is better,
latency: lower is better), each checked against the target of issue 3, with the range in
which the spread of the reps alone could move each ratio (bootstrap, ratio_range)."""
import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
from collections import defaultdict

ap = argparse.ArgumentParser()
ap.add_argument("raw")
ap.add_argument("out")
ap.add_argument("--reps", type=int, default=0)
ap.add_argument("--tcp-lat-pairs", type=int, default=1)
ap.add_argument("--guest-reps", type=int, default=0)
ap.add_argument("--guest-bw-iters", type=int, default=0)
ap.add_argument("--guest-lat-reps", type=int, default=0)
ap.add_argument("--seconds", type=int, default=0)
ap.add_argument("--machine", default="")
ap.add_argument("--many-conn", action="store_true",
                help="compare.sh --many-conn: the rows of issue 17 only (many connections, event mode)")
ap.add_argument("--atomics", action="store_true",
                help="compare.sh --atomics: the rows of issue 19 only (8 B remote atomics)")
ap.add_argument("--windows", action="store_true",
                help="compare.sh --windows: the rows of issue 19 on memory windows vs a region per object")
ap.add_argument("--no-plot", action="store_true", help="write .md and .json only (no gnuplot needed)")
a = ap.parse_args()


def lines(name):
    path = os.path.join(a.raw, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


rows = lines("results.jsonl")
errors = lines("errors.jsonl")
vals = defaultdict(list)
loads = defaultdict(list)
for r in rows:
    if r["metric"] == "load":
        loads[r["backend"]].append(float(r["value"]))
        continue
    vals[(r["backend"], r["tool"], r["test"], int(r["size"]), r["metric"])].append(float(r["value"]))
med = {k: statistics.median(v) for k, v in vals.items()}


def get(backend, tool, test, size, metric):
    return med.get((backend, tool, test, size, metric))


def size_name(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 and s % (1 << 20) == 0 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"


# (description, backend, rdmx (tool, test, size, metric), peer (tool, test, size, metric), target, higher_is_better)
targets = []
targets.append(("send/recv 8 B latency vs UCX tag_lat", "tcp", ("rdmx", "send_lat", 8, "lat_us"),
                ("ucx", "tag_lat", 8, "lat_us"), 1.0, False))
for s in (65536, 1 << 20, 4 << 20):
    targets.append((f"write {size_name(s)} bw vs UCX ucp_put_bw", "tcp", ("rdmx", "write_bw", s, "mb_s"),
                    ("ucx", "ucp_put_bw", s, "mb_s"), 1.5, True))
targets.append(("write 1 MiB bw vs iperf3 (1 MiB writes)", "tcp", ("rdmx", "write_bw", 1 << 20, "mb_s"),
                ("iperf3", "stream", 1 << 20, "mb_s"), 0.9, True))
targets.append(("read 1 MiB bw vs UCX ucp_get", "tcp", ("rdmx", "read_bw", 1 << 20, "mb_s"),
                ("ucx", "ucp_get", 1 << 20, "mb_s"), 2.0, True))
for s in (65536, 1 << 20):
    targets.append((f"send {size_name(s)} bw vs UCX tag_bw", "tcp", ("rdmx", "send_bw", s, "mb_s"),
                    ("ucx", "tag_bw", s, "mb_s"), 1.0, True))
for t in ("write_bw", "read_bw", "send_bw"):
    targets.append((f"{t} 64 KiB vs perftest ib_{t}", "verbs", ("rdmx", t, 65536, "mb_s"),
                    ("perftest", t, 65536, "mb_s"), 0.95, True))
for t in ("send_lat", "write_lat", "read_lat"):
    for s in (2, 4096):
        targets.append((f"{t} {size_name(s)} vs perftest ib_{t}", "verbs", ("rdmx", t, s, "lat_us"),
                        ("perftest", t, s, "lat_us"), 1.05, False))

# Comparisons without a target in issue 3, reported for completeness.
others = [("write 8 B latency vs UCX ucp_put_lat", "tcp", ("rdmx", "write_lat", 8, "lat_us"),
           ("ucx", "ucp_put_lat", 8, "lat_us"), None, False),
          ("write 8 B latency, spinning on memory only (--spin-only) vs UCX ucp_put_lat", "tcp",
           ("rdmx", "write_lat_spin", 8, "lat_us"), ("ucx", "ucp_put_lat", 8, "lat_us"), None, False),
          ("send/recv 8 B latency vs fi_pingpong (tcp, msg)", "tcp", ("rdmx", "send_lat", 8, "lat_us"),
           ("fi_tcp_msg", "pingpong", 8, "lat_us"), None, False),
          ("send/recv 8 B latency vs qperf tcp_lat", "tcp", ("rdmx", "send_lat", 8, "lat_us"),
           ("qperf", "tcp_lat", 8, "lat_us"), None, False),
          ("send 4 MiB bw vs UCX tag_bw", "tcp", ("rdmx", "send_bw", 4 << 20, "mb_s"),
           ("ucx", "tag_bw", 4 << 20, "mb_s"), None, True),
          ("read 4 MiB bw vs UCX ucp_get", "tcp", ("rdmx", "read_bw", 4 << 20, "mb_s"),
           ("ucx", "ucp_get", 4 << 20, "mb_s"), None, True)]

# Many connections and event mode (issue 17): 8 connections served by one thread; 8 B
# send/recv latency and the server's CPU per round trip, busy polling vs sleeping.
Q8, Q8S, Q8E = ("rdmx", "send_bw_q8"), ("rdmx", "send_bw_q8_shared"), ("rdmx", "send_bw_q8_shared_event")
many = [("send 64 B x 8 connections, one shared CQ vs 8 CQs (message rate)", "tcp", (*Q8S, 64, "msg_s"), (*Q8, 64, "msg_s"), None, True),
        ("send 64 B x 8 connections, shared CQ, event mode vs polling (message rate)", "tcp",
         (*Q8E, 64, "msg_s"), (*Q8S, 64, "msg_s"), None, True),
        ("send 64 B x 8 connections, server CPU per message, one shared CQ vs 8 CQs", "tcp",
         (*Q8S, 64, "server_cpu_us_per_msg"), (*Q8, 64, "server_cpu_us_per_msg"), None, False),
        ("send 64 B x 8 connections, server CPU per message, shared CQ, event mode vs polling", "tcp",
         (*Q8E, 64, "server_cpu_us_per_msg"), (*Q8S, 64, "server_cpu_us_per_msg"), None, False),
        ("send 64 B x 8 connections, one shared CQ vs UCX tag_bw -T 8 (8 threads, an endpoint each; message rate)", "tcp",
         (*Q8S, 64, "msg_s"), ("ucx", "tag_bw_T8", 64, "msg_s"), None, True),
        ("send 64 B x 8 connections, 8 CQs vs UCX tag_bw -T 8 (message rate)", "tcp",
         (*Q8, 64, "msg_s"), ("ucx", "tag_bw_T8", 64, "msg_s"), None, True),
        ("send 64 B x 8 connections, one shared CQ vs UCX tag_bw, one endpoint (message rate)", "tcp",
         (*Q8S, 64, "msg_s"), ("ucx", "tag_bw_T1", 64, "msg_s"), None, True),
        ("send 64 KiB x 8 connections, one shared CQ vs 8 CQs", "tcp", (*Q8S, 65536, "mb_s"), (*Q8, 65536, "mb_s"), None, True),
        ("send 64 KiB x 8 connections, shared CQ, event mode vs polling", "tcp",
         (*Q8E, 65536, "mb_s"), (*Q8S, 65536, "mb_s"), None, True),
        ("send 64 KiB x 8 connections, one shared CQ vs iperf3 -P 8 (64 KiB writes)", "tcp",
         (*Q8S, 65536, "mb_s"), ("iperf3", "stream_p8", 65536, "mb_s"), None, True),
        ("send 64 KiB x 8 connections, 8 CQs vs iperf3 -P 8", "tcp",
         (*Q8, 65536, "mb_s"), ("iperf3", "stream_p8", 65536, "mb_s"), None, True),
        ("send 64 KiB x 8 connections, shared CQ, event mode vs iperf3 -P 8", "tcp",
         (*Q8E, 65536, "mb_s"), ("iperf3", "stream_p8", 65536, "mb_s"), None, True),
        ("send/recv 8 B latency, event mode vs busy polling", "tcp",
         ("rdmx", "send_lat_event", 8, "lat_us"), ("rdmx", "send_lat", 8, "lat_us"), None, False),
        ("send/recv 8 B latency, event mode vs UCX tag_lat -I -E sleep", "tcp",
         ("rdmx", "send_lat_event", 8, "lat_us"), ("ucx", "tag_lat_sleep", 8, "lat_us"), None, False),
        ("send/recv 8 B latency, busy polling vs UCX tag_lat (polling)", "tcp",
         ("rdmx", "send_lat", 8, "lat_us"), ("ucx", "tag_lat", 8, "lat_us"), None, False),
        # Means (lat_avg_us): fi_pingpong gives nothing else (its time over its transfers)
        ("send/recv 8 B latency, means, busy polling vs fi_pingpong (tcp, msg; busy polling)", "tcp",
         ("rdmx", "send_lat", 8, "lat_avg_us"), ("fi_tcp_msg", "pingpong", 8, "lat_us"), None, False),
        ("send/recv 8 B latency, means, busy polling vs fi_pingpong (tcp;ofi_rxm, rdm; busy polling)", "tcp",
         ("rdmx", "send_lat", 8, "lat_avg_us"), ("fi_tcp_rxm_rdm", "pingpong", 8, "lat_us"), None, False),
        ("send/recv 8 B latency, means, busy polling vs UCX tag_lat (polling)", "tcp",
         ("rdmx", "send_lat", 8, "lat_avg_us"), ("ucx", "tag_lat", 8, "lat_avg_us"), None, False),
        ("send/recv 8 B latency, means, event mode vs UCX tag_lat -I -E sleep", "tcp",
         ("rdmx", "send_lat_event", 8, "lat_avg_us"), ("ucx", "tag_lat_sleep", 8, "lat_avg_us"), None, False),
        ("8 B ping-pong, server CPU per round trip, event mode vs busy polling", "tcp",
         ("rdmx", "send_lat_event", 8, "server_cpu_us_per_rt"), ("rdmx", "send_lat", 8, "server_cpu_us_per_rt"), None, False),
        ("8 B ping-pong, server CPU per round trip, event mode vs UCX -I -E sleep", "tcp",
         ("rdmx", "send_lat_event", 8, "server_cpu_us_per_rt"), ("ucx", "tag_lat_sleep", 8, "server_cpu_us_per_rt"), None, False),
        ("8 B ping-pong, server CPU per round trip, busy polling vs UCX (polling)", "tcp",
         ("rdmx", "send_lat", 8, "server_cpu_us_per_rt"), ("ucx", "tag_lat", 8, "server_cpu_us_per_rt"), None, False),
        ("send 64 B x 8 connections, one shared CQ vs ib_send_bw -q 8 (message rate)", "verbs",
         (*Q8S, 64, "msg_s"), ("perftest", "send_bw_q8", 64, "msg_s"), None, True),
        ("send 64 B x 8 connections, 8 CQs vs ib_send_bw -q 8 (message rate)", "verbs",
         (*Q8, 64, "msg_s"), ("perftest", "send_bw_q8", 64, "msg_s"), None, True),
        ("send 64 B x 8 connections, one shared CQ vs 8 CQs (message rate)", "verbs",
         (*Q8S, 64, "msg_s"), (*Q8, 64, "msg_s"), None, True)]
# Atomics (issue 19): 8 B fetch-and-add and compare-and-swap, one at a time (the whole round
# trip) and a window of 128 (the rate). TCP: against UCX's software atomics over its tcp
# transport; rxe: against perftest.
atomics = []
for op, ucx_op, pt_op in (("fetch_add", "ucp_fadd", "FETCH_AND_ADD"), ("compare_swap", "ucp_cswap", "CMP_AND_SWAP")):
    atomics += [(f"{op} 8 B latency (round trip, median) vs UCX {ucx_op}", "tcp",
                 ("rdmx", f"{op}_lat", 8, "lat_us"), ("ucx", ucx_op, 8, "lat_us"), None, False),
                (f"{op} 8 B latency, means, vs UCX {ucx_op}", "tcp",
                 ("rdmx", f"{op}_lat", 8, "lat_avg_us"), ("ucx", ucx_op, 8, "lat_avg_us"), None, False),
                (f"{op} 8 B rate, window 128 vs UCX {ucx_op} -O 128", "tcp",
                 ("rdmx", f"{op}_bw", 8, "msg_s"), ("ucx", f"{ucx_op}_O128", 8, "msg_s"), None, True)]
atomics.append(("fetch_add 8 B rate, window 128 vs UCX ucp_add -O 128 (no fetch)", "tcp",
                ("rdmx", "fetch_add_bw", 8, "msg_s"), ("ucx", "ucp_add_O128", 8, "msg_s"), None, True))
# The rdmx_perf server busy-polling (--target-poll): on TCP its thread serves the atomics, as
# UCX's responder does; and rdmx's own 8 B read, the same round trip through the target.
for op, ucx_op in (("fetch_add", "ucp_fadd"), ("compare_swap", "ucp_cswap")):
    atomics += [(f"{op} 8 B latency, server busy-polling (--target-poll) vs UCX {ucx_op}", "tcp",
                 ("rdmx", f"{op}_lat_target_poll", 8, "lat_us"), ("ucx", ucx_op, 8, "lat_us"), None, False),
                (f"{op} 8 B latency, means, server busy-polling vs UCX {ucx_op}", "tcp",
                 ("rdmx", f"{op}_lat_target_poll", 8, "lat_avg_us"), ("ucx", ucx_op, 8, "lat_avg_us"), None, False),
                (f"{op} 8 B latency, server busy-polling vs sleeping", "tcp",
                 ("rdmx", f"{op}_lat_target_poll", 8, "lat_us"), ("rdmx", f"{op}_lat", 8, "lat_us"), None, False)]
atomics += [("fetch_add 8 B latency vs rdmx read_lat 8 B (round trips)", "tcp",
             ("rdmx", "fetch_add_lat", 8, "lat_us"), ("rdmx", "read_lat", 8, "lat_us"), None, False),
            ("fetch_add 8 B rate, window 128, server busy-polling vs UCX ucp_fadd -O 128", "tcp",
             ("rdmx", "fetch_add_bw_target_poll", 8, "msg_s"), ("ucx", "ucp_fadd_O128", 8, "msg_s"), None, True),
            ("fetch_add 8 B rate, window 128, server busy-polling vs sleeping", "tcp",
             ("rdmx", "fetch_add_bw_target_poll", 8, "msg_s"), ("rdmx", "fetch_add_bw", 8, "msg_s"), None, True)]
for op, pt_op in (("fetch_add", "FETCH_AND_ADD"), ("compare_swap", "CMP_AND_SWAP")):
    atomics += [(f"{op} 8 B latency (round trip, median) vs ib_atomic_lat -A {pt_op}", "verbs",
                 ("rdmx", f"{op}_lat", 8, "lat_us"), ("perftest", f"{op}_lat", 8, "lat_us"), None, False),
                (f"{op} 8 B latency, means, vs ib_atomic_lat -A {pt_op}", "verbs",
                 ("rdmx", f"{op}_lat", 8, "lat_avg_us"), ("perftest", f"{op}_lat", 8, "lat_avg_us"), None, False),
                (f"{op} 8 B rate, window 128 vs ib_atomic_bw -A {pt_op} -t 128 -o 128", "verbs",
                 ("rdmx", f"{op}_bw", 8, "msg_s"), ("perftest", f"{op}_bw", 8, "msg_s"), None, True)]
# Memory windows against a region per object (issue 19): both sides are rdmx_perf on one
# backend; latency is per operation (the whole round trip for the _send tests), the rate
# the operations over the measured time.
windows = []
for b in ("tcp", "verbs"):
    for s in (4096, 65536, 1 << 20):
        n = size_name(s)
        windows += [(f"{n} object: window bind + invalidate vs register + deregister (per op, median)", b,
                     ("rdmx", "window_bind", s, "lat_us"), ("rdmx", "register", s, "lat_us"), None, False),
                    (f"{n} object: window bind + invalidate vs register + deregister (ops/s)", b,
                     ("rdmx", "window_bind", s, "msg_s"), ("rdmx", "register", s, "msg_s"), None, True),
                    (f"{n} object: round trip, unsignalled bind + send + reply revoking it vs register + send + "
                     f"reply + deregister (median)", b,
                     ("rdmx", "window_send", s, "lat_us"), ("rdmx", "register_send", s, "lat_us"), None, False),
                    (f"{n} object: round trip, window vs a region per object (ops/s)", b,
                     ("rdmx", "window_send", s, "msg_s"), ("rdmx", "register_send", s, "msg_s"), None, True),
                    # The reply revoking the window (send-with-invalidate) or the client itself
                    # (an unsignalled invalidate after a plain reply).
                    (f"{n} object: round trip, the reply revokes the window vs the client does (median)", b,
                     ("rdmx", "window_send", s, "lat_us"), ("rdmx", "window_send_local", s, "lat_us"), None, False),
                    (f"{n} object: round trip, window revoked by the client vs a region per object (median)", b,
                     ("rdmx", "window_send_local", s, "lat_us"), ("rdmx", "register_send", s, "lat_us"), None, False),
                    # register_send plus the window posts of a window never sent: those calls' cost
                    (f"{n} object: round trip, a region per object plus an unused window's bind and invalidate "
                     f"posts vs without (median)", b,
                     ("rdmx", "register_send_bind", s, "lat_us"), ("rdmx", "register_send", s, "lat_us"), None, False),
                    (f"{n} object: round trip, window revoked by the client vs a region per object plus the "
                     f"same window posts (median)", b,
                     ("rdmx", "window_send_local", s, "lat_us"), ("rdmx", "register_send_bind", s, "lat_us"), None, False)]
    # How each grows with the object: a registration pins every page (ibv_reg_mr), a bind does not.
    for t in ("register", "window_bind"):
        windows.append((f"{t} per op, 1 MiB vs 4 KiB object (median)", b,
                        ("rdmx", t, 1 << 20, "lat_us"), ("rdmx", t, 4096, "lat_us"), None, False))
narrow = a.many_conn or a.atomics or a.windows
if a.many_conn:
    targets, others = [], many
elif a.atomics:
    targets, others = [], atomics
elif a.windows:
    targets, others = [], windows
else:
    others += [m for m in many if m not in others]

def ratio_range(mine, peer, draws=10000):
    """5th and 95th percentile of the ratio of medians when each tool's runs are resampled
    (bootstrap, a fixed seed: the same raw data give the same report). How far the spread of
    this run's reps alone could move the ratio; None with fewer than 3 runs of either."""
    if len(mine) < 3 or len(peer) < 3:
        return None
    rng = random.Random(1)
    rs = []
    for _ in range(draws):
        y = statistics.median(rng.choices(peer, k=len(peer)))
        if y > 0:
            rs.append(statistics.median(rng.choices(mine, k=len(mine))) / y)
    rs.sort()
    return [rs[len(rs) // 20], rs[len(rs) * 19 // 20]] if rs else None


checked = []
for desc, backend, mine, peer, goal, higher in targets + others:
    x, y = get(backend, *mine), get(backend, *peer)
    ratio = x / y if x is not None and y else None
    ok = None if ratio is None or goal is None else (ratio >= goal if higher else ratio <= goal)
    # Each tool's runs in rep order: a median of few reps can hide a split (rxe under TCG
    # has latency modes, profile-2026-11-29.md sections 12-15), the runs show it.
    mine_runs, peer_runs = vals.get((backend, *mine), []), vals.get((backend, *peer), [])
    checked.append({"target": desc, "backend": backend, "rdmx": x, "peer": y, "ratio": ratio,
                    "goal": "-" if goal is None else (">= " if higher else "<= ") + f"{goal}x", "met": ok,
                    "ratio_90": ratio_range(mine_runs, peer_runs),
                    "unit": {"mb_s": "MB/s", "msg_s": "msg/s"}.get(mine[3], "us"),
                    "rdmx_runs": mine_runs, "peer_runs": peer_runs})

# rxe under TCG: a run whose median sits at one 4 ms host tick stalled as a whole (a vCPU
# waiting for a host CPU); listed so that a median can be read with that in mind.
stalled = [r for r in rows if r["backend"] == "verbs" and r["metric"] == "lat_us" and 3800 <= float(r["value"]) <= 4200]

doc = {"machine": a.machine, "reps": a.reps, "tcp_lat_pairs": a.tcp_lat_pairs, "guest_reps": a.guest_reps,
       "guest_bw_iters": a.guest_bw_iters, "guest_lat_reps": a.guest_lat_reps, "seconds": a.seconds, "stalled_runs": stalled,
       "regime": "server pinned to CPU 0, client to CPU 1 (taskset, all threads), loopback; "
                 "verbs: rdma_rxe in a 2-vCPU QEMU (TCG) guest, server vCPU 0, client vCPU 1",
       "units": {"lat_us": "microseconds, one way (read: round trip), median of the tool's samples",
                 "mb_s": "1e6 bytes per second", "cpu_s_per_gb": "CPU seconds per 1e9 bytes, whole process",
                 "msg_s": "messages per second, all connections", "cpu_us_per_msg": "CPU microseconds per message, whole process",
                 "server_cpu_us_per_msg": "the server's CPU microseconds per message, whole process",
                 "ratio_90": "5th-95th percentile of the ratio of medians, each tool's runs resampled "
                             "(bootstrap, 10000 draws)"},
       "load_at_rep_start": loads, "targets": checked,
       "medians": [{"backend": k[0], "tool": k[1], "test": k[2], "size": k[3], "metric": k[4], "median": v,
                    "min": min(vals[k]), "max": max(vals[k]), "n": len(vals[k])} for k, v in sorted(med.items())],
       "errors": errors}
with open(a.out + ".json", "w") as f:
    json.dump(doc, f, indent=1)


def fmt(v, unit=""):
    return "-" if v is None else f"{v:.2f}{unit}"


def fmt_range(r):
    return "-" if r is None else f"{r[0]:.2f}-{r[1]:.2f}x"


md = [f"# rdmx benchmark, {os.path.basename(a.out)}", "",
      f"Machine: {a.machine}. Reps: {a.reps} TCP (each with {a.tcp_lat_pairs} 8 B send/recv latency pairs, "
      f"rdmx_perf and ucx_perftest back to back), {a.guest_reps} verbs bandwidth ({a.guest_bw_iters} messages "
      f"per run), {a.guest_lat_reps} verbs latency (interleaved), {a.seconds} s in all. "
      f"Regime: {doc['regime']}.",
      "Load average at the start of each rep: " + "; ".join(f"{b}: {', '.join(map(str, l))}" for b, l in loads.items()) + ".",
      "Produced by `bench/compare.sh`. Bandwidth in MB/s (1e6 B/s); latency in us one way "
      "(read: round trip), medians over reps.", "", "## Targets (ratio = rdmx / peer)", "",
      "The 90 % range resamples each tool's runs of this report (bootstrap): how far the spread of",
      "the reps alone could move the ratio. A goal inside it is not settled by this run either way.", "",
      "| target | rdmx | peer | ratio | 90 % range | goal | met |", "| --- | ---: | ---: | ---: | --- | --- | --- |"]
if narrow:
    what = ("many connections and event mode (issue 17)" if a.many_conn else
            "memory windows vs a region per object (issue 19)" if a.windows else "8 B remote atomics (issue 19)")
    md = [f"# rdmx benchmark, {os.path.basename(a.out)}: {what}", "",
          f"Machine: {a.machine}. Reps: {a.reps} TCP" +
          (f", {a.guest_reps} verbs (rxe)" if any(r["backend"] == "verbs" for r in rows) else ", no rxe guest") +
          f", interleaved, {a.seconds} s in all. "
          f"Regime: {doc['regime']}.",
          "Load average at the start of each rep: " + "; ".join(f"{b}: {', '.join(map(str, l))}" for b, l in loads.items()) + ".",
          ("Produced by `bench/compare.sh --many-conn`. Bandwidth in MB/s (1e6 B/s), message rate in msg/s "
           "(all connections), latency in us one way, CPU in us per message or per round trip; medians over reps."
           if a.many_conn else
           "Produced by `bench/compare.sh --windows`. Latency in us per operation (register + deregister; bind + "
           "invalidate, each waited for; the _send tests: the whole round trip), rate in operations per second "
           "over the measured time (samples back to back); medians over reps. Both sides are rdmx on one backend."
           if a.windows else
           "Produced by `bench/compare.sh --atomics`. Latency in us, the whole round trip of one atomic (as "
           "perftest and ucx_perftest report it for atomics); rate in atomics per second; medians over reps."),
          *(["Host load average during the guest run (every 30 s, 1/5/15 min): " +
              "; ".join(l.split("load average:")[-1].strip() for l in open(os.path.join(a.raw, "host-load.txt")) if "load average" in l) + "."]
            if os.path.exists(os.path.join(a.raw, "host-load.txt")) else []),
          "", "## Rows (ratio = first / second)", "",
          "The 90 % range resamples each side's runs (bootstrap): a ratio whose range holds 1 is parity.", "",
          "| comparison | first | second | ratio | 90 % range |", "| --- | ---: | ---: | ---: | --- |"]
for i, c in enumerate(checked):
    if narrow:
        md.append(f"| {c['backend']}: {c['target']} | {fmt(c['rdmx'])} {c['unit']} | {fmt(c['peer'])} {c['unit']} | "
                  f"{fmt(c['ratio'], 'x')} | {fmt_range(c['ratio_90'])} |")
        continue
    if i == len(targets):
        md += ["", "Other comparisons (no target):", "",
               "| comparison | rdmx | peer | ratio | 90 % range | goal | met |",
               "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    met = "n/a" if c["met"] is None else ("yes" if c["met"] else "**no**")
    md.append(f"| {c['backend']}: {c['target']} | {fmt(c['rdmx'])} {c['unit']} | {fmt(c['peer'])} {c['unit']} | "
              f"{fmt(c['ratio'], 'x')} | {fmt_range(c['ratio_90'])} | {c['goal']} | {met} |")
if stalled:
    md += ["", "Verbs runs stalled at ~4 ms per message (one host tick; a guest vCPU waiting for a host "
           "CPU under TCG, seen for perftest and rdmx alike): " +
           ", ".join(f"{r['tool']} {r['test']} {size_name(int(r['size']))} rep {r['rep']} ({float(r['value']):.0f} us)"
                     for r in stalled) + "."]
md += ["", "## The runs behind each target (rep order; a failed run leaves no value)", ""]
for c in (checked if narrow else checked[:len(targets)]):
    md.append(f"- {c['backend']}: {c['target']}: rdmx " + (" ".join(f"{v:.4g}" for v in c["rdmx_runs"]) or "-") +
              "; peer " + (" ".join(f"{v:.4g}" for v in c["peer_runs"]) or "-"))
if narrow:  # every run, by rep, with the load average at the rep's start
    by = defaultdict(dict)
    nrep = max((int(r["rep"]) for r in rows), default=0)
    for r in rows:
        by[(r["backend"], r["tool"], r["test"], int(r["size"]), r["metric"])][int(r["rep"])] = float(r["value"])
    md += ["", "## Every run by rep (first row: load average at the rep's start)", "",
           "| backend | tool | test | size | metric | " + " | ".join(f"rep {i}" for i in range(1, nrep + 1)) + " |",
           "| --- | --- | --- | ---: | --- |" + " ---: |" * nrep]
    for k in sorted(by, key=lambda k: (k[0], k[1] != "load", k[1:])):
        md.append(f"| {k[0]} | {k[1]} | {k[2]} | {size_name(k[3])} | {k[4]} | " +
                  " | ".join(f"{by[k][i]:.4g}" if i in by[k] else "-" for i in range(1, nrep + 1)) + " |")
md += ["", "## All medians", "", "| backend | tool | test | size | metric | median | min | max | n |",
       "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
for m in doc["medians"]:
    md.append(f"| {m['backend']} | {m['tool']} | {m['test']} | {size_name(m['size'])} | {m['metric']} | "
              f"{m['median']:.2f} | {m['min']:.2f} | {m['max']:.2f} | {m['n']} |")
if errors:
    md += ["", "## Runs that failed", ""]
    seen = set()
    for e in errors:
        key = (e["tool"], e["test"], e["error"][:80])
        if key in seen:
            continue
        seen.add(key)
        md.append(f"- {e['backend']} {e['tool']} {e['test']} (rep {e['rep']}): `{e['error']}`")
if not a.no_plot:
    md += ["", f"![bandwidth and latency against size]({os.path.basename(a.out)}.png)"]
md.append("")
with open(a.out + ".md", "w") as f:
    f.write("\n".join(md))
if a.no_plot:
    raise SystemExit(0)

# --- plot: gnuplot, 2 x 2 panels
series = {
    "tcp_bw": [("rdmx", "write_bw"), ("rdmx", "send_bw"), ("rdmx", "read_bw"), ("ucx", "ucp_put_bw"),
               ("ucx", "tag_bw"), ("ucx", "ucp_get"), ("iperf3", "stream"), ("qperf", "tcp_bw")],
    "tcp_lat": [("rdmx", "send_lat"), ("rdmx", "write_lat"), ("ucx", "tag_lat"), ("ucx", "ucp_put_lat"),
                ("qperf", "tcp_lat"), ("fi_tcp_msg", "pingpong"), ("fi_tcp_rxm_rdm", "pingpong")],
    "verbs_bw": [("rdmx", t) for t in ("write_bw", "read_bw", "send_bw")] +
                [("perftest", t) for t in ("write_bw", "read_bw", "send_bw")],
    "verbs_lat": [("rdmx", t) for t in ("send_lat", "write_lat", "read_lat")] +
                 [("perftest", t) for t in ("send_lat", "write_lat", "read_lat")],
}
tmp = tempfile.mkdtemp()
plots = {}
for panel, ss in series.items():
    backend, kind = panel.split("_")
    metric = "mb_s" if kind == "bw" else "lat_us"
    cmds = []
    for tool, test in ss:
        pts = sorted((k[3], v) for k, v in med.items() if k[:3] == (backend, tool, test) and k[4] == metric)
        if not pts:
            continue
        fn = os.path.join(tmp, f"{panel}_{tool}_{test}.dat")
        with open(fn, "w") as f:
            f.writelines(f"{s} {v}\n" for s, v in pts)
        dash = "dt 1" if tool == "rdmx" else "dt 2"
        cmds.append(f"'{fn}' using 1:2 with linespoints lw 2 {dash} title '{tool} {test}'")
    plots[panel] = cmds
titles = {"tcp_bw": "TCP loopback: bandwidth (MB/s)", "tcp_lat": "TCP loopback: latency (us)",
          "verbs_bw": "soft-RoCE: bandwidth (MB/s)", "verbs_lat": "soft-RoCE: latency (us)"}
gp = [f"set terminal pngcairo noenhanced size 1400,1000 font ',10'", f"set output '{os.path.abspath(a.out)}.png'",
      "set multiplot layout 2,2", "set logscale x 2", "set grid", "set key left top font ',8'",
      "set xlabel 'message size'",
      # Sizes as the tools name them; gnuplot shows those inside each panel's range, which
      # a margin keeps from cutting the end ones.
      "set offsets graph 0.03, graph 0.03, 0, 0",
      "set xtics (" + ", ".join(f"'{n}' {v}" for n, v in (
          ("2 B", 2), ("8 B", 8), ("64 B", 64), ("512 B", 512), ("4 KiB", 4096), ("64 KiB", 65536),
          ("256 KiB", 262144), ("1 MiB", 1048576), ("4 MiB", 4194304), ("8 MiB", 8388608))) + ")"]
for panel in ("tcp_bw", "tcp_lat", "verbs_bw", "verbs_lat"):
    gp.append(f"set title \"{titles[panel]}\"")
    gp.append("set logscale y" if panel.endswith("lat") else "unset logscale y")
    if plots[panel]:
        gp.append("plot " + ", ".join(plots[panel]))
    else:
        gp.append("set label 1 'no data' at graph 0.45,0.5")
        gp.append("unset logscale y")
        gp.append("plot [1:2] [0:1] -1 notitle")
        gp.append("unset label 1")
gp.append("unset multiplot")
subprocess.run(["gnuplot"], input="\n".join(gp), text=True, check=True)
