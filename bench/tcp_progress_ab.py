#!/usr/bin/env python3
"""Medians and ratios (B / A) of bench/tcp_progress_ab.sh's output, with a 90 % range of
the ratio by bootstrap over the rounds. Latency rows compare median latency (lower is
better), the others the message or byte rate. Usage: tcp_progress_ab.py results.txt"""
import json
import random
import statistics
import sys

rows = {}
for line in open(sys.argv[1]):
    if line.startswith("#") or len(line.split(" ", 2)) < 3:
        continue
    build, label, rest = line.split(" ", 2)
    try:
        doc = json.loads(rest[rest.index("{"):])
    except ValueError:
        print(f"{build} {label}: failed: {rest.strip()[:120]}")
        continue
    results = doc.get("results", [doc])
    r = results[0]
    if "lat_us" in r or "median_us" in r:
        v, unit = r.get("median_us", r.get("lat_us")), "us"
    elif "msg_per_s" in r:
        v, unit = r["msg_per_s"], "msg/s"
    elif "msg_s" in r and r["size"] < 4096:
        v, unit = r["msg_s"], "msg/s"
    else:
        v, unit = r.get("mb_per_s", r.get("mb_s")), "MB/s"
    rows.setdefault(label, {"unit": unit}).setdefault(build, []).append(float(v))

random.seed(1)
print(f"{'row':22} {'A (median)':>14} {'B (median)':>14} {'B/A':>6} {'90% range':>13} rounds")
for label, d in rows.items():
    a, b = d.get("A", []), d.get("B", [])
    if not a or not b:
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    boot = sorted(
        statistics.median(random.choices(b, k=len(b))) / statistics.median(random.choices(a, k=len(a)))
        for _ in range(2000))
    lo, hi = boot[100], boot[1899]
    print(f"{label:22} {ma:10.1f} {d['unit']:>4}{mb:10.1f} {d['unit']:>4}"
          f" {mb / ma:6.2f} {lo:6.2f}-{hi:<6.2f} {len(a)}/{len(b)}")
