#!/usr/bin/env bash
# Consecutive TCP bandwidth runs of rdmx_perf on loopback, the tests interleaved run by run,
# with what each run cost besides its speed (docs/performance.md, "TCP bandwidth runs"):
# CPU seconds and context switches per GB on each side (perf stat over the whole process,
# set-up included) and the host's TCP retransmissions, tail loss probes and SACK reorder
# events over the run (nstat: host-wide, so other loopback traffic counts too).
#   bench/tcp_bw_runs.sh RUNS SIZE ITERS TESTS... > results.tsv
#   bench/tcp_bw_runs.sh 50 1M 3000 write_bw send_bw
# Server on CPU 0, client on CPU 1, as compare.sh. RDMX_BUILD_DIR (build) names the build;
# RDMX_PERF_ARGS adds client options (e.g. "--tcp-congestion cubic"). The summary (median,
# range, runs below 0.6 x the median, per test) goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=$1 SIZE=$2 ITERS=$3
shift 3
PERF=${RDMX_BUILD_DIR:-build}/samples/rdmx_perf
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
port=18700

printf 'run\ttest\tsize\tmb_per_s\tcli_cpu_s_per_gb\tcli_cs_per_gb\tsrv_cpu_s_per_gb\tsrv_cs_per_gb\tretrans_segs\tloss_probes\tsack_reorder\tload1\n'
for ((run = 1; run <= RUNS; ++run)); do
    for t in "$@"; do
        port=$((port + 1))
        while ss -Hltn "sport = :$port" | grep -q .; do port=$((port + 1)); done # taken
        nstat -n >/dev/null
        perf stat -x, -e task-clock,context-switches -o "$RAW/srv" \
            "$PERF" --server "tcp://127.0.0.1:$port" --cpu 0 >/dev/null 2>&1 &
        srv=$!
        # Until it listens (a loaded host may take a while to start it).
        for ((i = 0; i < 100; ++i)); do
            ss -Hltn "sport = :$port" | grep -q . && break
            sleep 0.05
        done
        # shellcheck disable=SC2086
        perf stat -x, -e task-clock,context-switches -o "$RAW/cli" \
            "$PERF" "tcp://127.0.0.1:$port" --cpu 1 -t "$t" -s "$SIZE" -n "$ITERS" --json \
            ${RDMX_PERF_ARGS:-} >"$RAW/json"
        wait "$srv"
        nstat -z TcpRetransSegs TcpExtTCPLossProbes TcpExtTCPSACKReorder >"$RAW/nstat"
        python3 - "$RAW" "$run" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
raw, run, load = sys.argv[1:]
r = json.load(open(f"{raw}/json"))["results"][0]
def stat(side):
    d = {}
    for line in open(f"{raw}/{side}"):
        p = line.strip().split(",")
        if len(p) > 3 and not line.startswith("#"):
            d[p[2]] = float(p[0])
    return d
gb = r["mb_per_s"] * r["seconds"] / 1e3
c, s = stat("cli"), stat("srv")
ns = {l.split()[0]: l.split()[1] for l in open(f"{raw}/nstat") if not l.startswith("#")}
print("\t".join(str(x) for x in [run, r["test"], r["size"], f"{r['mb_per_s']:.0f}",
      f"{c['task-clock'] / 1e3 / gb:.3f}", f"{c['context-switches'] / gb:.0f}",
      f"{s['task-clock'] / 1e3 / gb:.3f}", f"{s['context-switches'] / gb:.0f}",
      ns["TcpRetransSegs"], ns["TcpExtTCPLossProbes"], ns["TcpExtTCPSACKReorder"], load]), flush=True)
PY
    done
done | tee "$RAW/all.tsv"

python3 - "$RAW/all.tsv" >&2 <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if not l.startswith("run")]
for t in dict.fromkeys(r[1] for r in rows):
    v = [float(r[3]) for r in rows if r[1] == t]
    med = statistics.median(v)
    low = sum(x < 0.6 * med for x in v)
    print(f"{t}: {len(v)} runs, median {med:.0f} MB/s, {min(v):.0f}-{max(v):.0f}, "
          f"{low} below 0.6 x the median ({0.6 * med:.0f})")
PY
