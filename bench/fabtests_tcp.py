#!/usr/bin/env python3
"""bench/fabtests_tcp.sh's raw lines as a table: medians over the rounds, and the ratio
rdmx / fabtests per round (median and range)."""
import re
import statistics
import sys

rows = {}
rnd = 0
for line in open(sys.argv[1]):
    if line.startswith('# round'):
        rnd += 1
        continue
    if line.startswith('#'):
        print(line.strip('# \n'))
        continue
    parts = line.split()
    if len(parts) < 2:
        continue
    value = None
    if parts[0].startswith('fi_'):
        if len(parts) > 5:  # fabtests: bytes iters total time MB/sec ...
            value = float(parts[5])
    else:
        m = re.search(r'"mb_per_s": ([0-9.]+)', line)
        value = float(m.group(1)) if m else None
    rows.setdefault(parts[0], {})[rnd] = value

print('| row | rdmx (MB/s) | fabtests tcp (MB/s) | rdmx / fabtests (rounds) |')
print('|---|---|---|---|')
for size in ['64K', '1M', '4M']:
    for mine, theirs in [('write_imm', 'writedata'), ('read', 'read'), ('send', 'msg')]:
        a = rows.get(f'rdmx_{mine}_{size}', {})
        b = rows.get(f'fi_{theirs}_{size}', {})
        ratios = [a[k] / b[k] for k in a if a[k] and b.get(k)]
        if not ratios:
            print(f'| {mine} {size} | - | - | failed |')
            continue
        ma = statistics.median([v for v in a.values() if v])
        mb = statistics.median([v for v in b.values() if v])
        print(f'| {mine} {size} | {ma:.0f} | {mb:.0f} | '
              f'{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |')
