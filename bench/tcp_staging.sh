#!/usr/bin/env bash
# What the TCP backend's staging (docs/gpu.md) costs by itself, without a GPU: rdmx_perf's
# write_bw and send_bw on loopback with host memory, direct and staged through the chunks
# (RDMX_TCP_FORCE_STAGING=1 on both sides, memcpy in place of the driver's copies),
# interleaved round by round. Server on CPU 0, client on CPU 1.
#   bench/tcp_staging.sh ROUNDS [BUILD_DIR] > results.tsv
# Prints round, test, mode, size, MB/s per line; the medians and ranges per row go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=$1
PERF=${2:-build}/samples/rdmx_perf
port=18800
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
printf 'round\ttest\tmode\tsize\tmb_per_s\n'
for ((r = 1; r <= ROUNDS; ++r)); do
    for t in write_bw send_bw; do
        for mode in direct staged; do
            staged=0
            [ "$mode" = staged ] && staged=1
            port=$((port + 1))
            while ss -Hltn "sport = :$port" | grep -q .; do port=$((port + 1)); done
            RDMX_TCP_FORCE_STAGING=$staged "$PERF" --server "tcp://127.0.0.1:$port" --cpu 0 >/dev/null 2>&1 &
            srv=$!
            for ((i = 0; i < 100; ++i)); do
                ss -Hltn "sport = :$port" | grep -q . && break
                sleep 0.05
            done
            RDMX_TCP_FORCE_STAGING=$staged "$PERF" "tcp://127.0.0.1:$port" --cpu 1 -t "$t" \
                -s 64K -s 1M -s 4M -s 16M -n 300 --json |
                python3 -c '
import json, sys
for x in json.load(sys.stdin)["results"]:
    print("\t".join([sys.argv[1], sys.argv[2], sys.argv[3], str(x["size"]), "%.0f" % x["mb_per_s"]]))
' "$r" "$t" "$mode"
            wait "$srv"
        done
    done
done | tee "$rows"
python3 -c '
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, t, mode, size, mbs = line.split("\t")
    rows[(t, int(size), mode)].append(float(mbs))
for (t, size, mode) in sorted(k for k in rows if k[2] == "direct"):
    d, s = rows[(t, size, "direct")], rows[(t, size, "staged")]
    ratios = [b / a for a, b in zip(d, s)]
    print(f"{t:9} {size:>9} direct {statistics.median(d):7.0f} ({min(d):.0f}-{max(d):.0f})  staged "
          f"{statistics.median(s):7.0f} ({min(s):.0f}-{max(s):.0f})  staged/direct {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})", file=sys.stderr)
' "$rows"
