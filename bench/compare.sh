#!/usr/bin/env bash
# One command that measures rdmx side by side with its peers and writes
# bench/results/<date>.md, .json and .png (bandwidth and latency against size):
#
#   bench/compare.sh [--reps N] [--tcp-lat-pairs N] [--guest-reps N] [--guest-bw-iters N]
#                    [--guest-lat-reps N] [--no-guest] [--no-tcp] [--many-conn] [--atomics] [--windows]
#                    [--out NAME]
#
#   --windows narrows both parts to the other rows of issue 19's "Measure": what handing a
#   peer one object of 4 KiB, 64 KiB or 1 MiB costs, a region registered per object against
#   a memory window bound over it in one pool region (rdmx_perf, both sides on one backend,
#   the runs interleaved; no peer tool measures this): register (register_memory + destroy),
#   window_bind (post_bind_window + its completion, post_invalidate_window + its completion),
#   and the object store's round trip, window_send (an unsignalled bind in front of the
#   request, the reply revoking it; window_send_local: a plain reply, the client revoking it
#   with an unsignalled invalidate) against register_send (register, send the descriptor,
#   plain reply, destroy; register_send_bind: that plus window_send_local's two window posts
#   of a window never sent, to tell what those post() calls cost). Per-op latency (median) and rate (ops/s over the measured time).
#   Run lengths (environment): WINDOW_ITERS, WINDOW_RT_ITERS (TCP), GUEST_WINDOW_ITERS,
#   GUEST_WINDOW_RT_ITERS (rxe).
#   --atomics narrows both parts to the rows of issue 19's "Measure" (8 B remote atomics):
#   TCP: rdmx_perf fetch_add_lat / compare_swap_lat (one at a time) and fetch_add_bw /
#   compare_swap_bw (a window of 128, 128 executing: -d 128 -o 128, every one signalled, as
#   each of UCX's has its own completion) vs ucx_perftest ucp_fadd / ucp_cswap (-O 1, and
#   -O 128) and ucp_add -O 128 (no fetch), over UCX_TLS=tcp. rxe: the same rdmx_perf tests
#   vs ib_atomic_lat and ib_atomic_bw -t 128 -o 128 (perftest's -Q 100 kept: rdmx_perf -c 100).
#   TCP also: the rdmx_perf server busy-polling meanwhile (--target-poll, as ucx_perftest's
#   responder progresses its worker; its thread then serves the atomics, not the engine
#   thread), and rdmx_perf read_lat 8 B, the same round trip through the target's engine.
#   Run lengths (environment): ATOMIC_LAT_ITERS (TCP, both tools), ATOMIC_BW_ITERS (TCP,
#   rdmx_perf), UCX_ATOMIC_BW_ITERS (TCP, ucx_perftest), GUEST_ATOMIC_LAT_ITERS,
#   GUEST_ATOMIC_BW_ITERS (rxe, both tools).
#   --many-conn narrows both parts to the rows of issue 17 (bench/many_conn_tcp.sh runs it):
#   TCP: rdmx_perf -q 8 (8 CQs, one shared CQ, shared CQ in event mode) vs iperf3 -P 8 and
#   ucx_perftest tag_bw -T 8; 8 B send/recv latency and the server's CPU, busy polling vs
#   event mode, vs ucx_perftest tag_lat (-E poll, -I -E sleep) and fi_pingpong (busy only:
#   it has no wait-object option). rxe: ib_send_bw -q 8 vs rdmx_perf -q 8 (8 CQs, shared).
#   --out NAME writes bench/results/NAME.{md,json} instead of <date> (.png: full runs only).
#
#   TCP backend on loopback  rdmx_perf  vs  ucx_perftest (UCX_TLS=tcp,self, lo: tag_lat,
#                            ucp_put_lat, tag_bw, ucp_put_bw, ucp_get), fi_pingpong
#                            (tcp msg, tcp;ofi_rxm rdm), iperf3 (one stream), qperf
#   verbs on soft-RoCE       rdmx_perf  vs  perftest (ib_{send,write,read}_{lat,bw}), in one
#                            QEMU guest boot (tests/guest/rxe-guest.sh)
#
# Regime: every pair runs its server pinned to CPU 0 and its client to CPU 1 (taskset; all
# threads of a process, rdmx's engine thread included, share that CPU), the same for every
# tool. Reps are interleaved: rep 1 runs every measurement once, then rep 2, ...; the load
# average is recorded at the start of each rep. Every run is bounded by `timeout`. Medians
# over reps are reported, with ratios rdmx / peer and the range a bootstrap over each tool's
# runs gives each ratio (bench/summarize.py). A peer that cannot run is reported with its
# error instead of a number.
set -euo pipefail
cd "$(dirname "$0")/.."
readonly ROOT=$PWD
readonly BUILD=${RDMX_BUILD_DIR:-build}
REPS=5 # TCP: a rep is about 45 s; with 3, two slow reps of one tool set its median
# TCP 8 B send/recv latency: a run measures about 40 ms, and the host moves both tools'
# runs over about 3.0-5.1 us from run to run (runs of 50000 iterations spread as widely as
# runs of 5000), so each rep runs this pair (rdmx_perf send_lat, ucx_perftest tag_lat)
# this many times, back to back, the order alternating.
TCP_LAT_PAIRS=3
GUEST_REPS=7 # rxe under TCG: whole runs stall at ~4 ms per message when a vCPU waits for
             # a host CPU (either tool, at random); more reps keep the median honest.
# Each bandwidth run moves 1500 x 64 KiB (about 3 s at rxe's 30 MB/s here): in one boot,
# runs of 500 messages spread with a coefficient of variation of 0.08-0.21 per tool and
# test, runs of 2000 with 0.07-0.15.
GUEST_BW_ITERS=1500
# rxe latency under TCG is bimodal from run to run (about 15 or about 25 us at 2 B, either
# tool, in proportions that change from boot to boot): a median of 5 runs follows how many
# land in each mode, so the latency pairs (a few seconds each) run more reps.
GUEST_LAT_REPS=9
GUEST=1
TCP=1
MANY=0
ATOMICS=0
WINDOWS=0
OUT=""
while (($#)); do
    case $1 in
    --reps) REPS=$2; shift 2 ;;
    --tcp-lat-pairs) TCP_LAT_PAIRS=$2; shift 2 ;;
    --guest-reps) GUEST_REPS=$2; shift 2 ;;
    --guest-bw-iters) GUEST_BW_ITERS=$2; shift 2 ;;
    --guest-lat-reps) GUEST_LAT_REPS=$2; shift 2 ;;
    --no-guest) GUEST=0; shift ;;
    --no-tcp) TCP=0; shift ;;
    --many-conn) MANY=1; shift ;;
    --atomics) ATOMICS=1; shift ;;
    --windows) WINDOWS=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    guest-verbs) shift; guest_mode=1; break ;;
    guest-atomics) shift; guest_mode=2; break ;;
    guest-windows) shift; guest_mode=3; break ;;
    *) echo "usage: $0 [--reps N] [--tcp-lat-pairs N] [--guest-reps N] [--guest-bw-iters N]" \
        "[--guest-lat-reps N] [--no-guest] [--no-tcp] [--many-conn] [--atomics] [--windows] [--out NAME]" >&2
        exit 2 ;;
    esac
done

readonly SCPU=0 CCPU=1
PERF=$ROOT/$BUILD/samples/rdmx_perf

# One result line: tool test size metric value (latency in us one way, as each tool
# reports it; bandwidth in MB/s = 1e6 B/s).
record() { printf '{"rep": %s, "backend": "%s", "tool": "%s", "test": "%s", "size": %s, "metric": "%s", "value": %s}\n' \
    "$rep" "$backend" "$1" "$2" "$3" "$4" "$5" >>"$RAW/results.jsonl"; }
fail_note() { # tool test message
    local msg=${3//\"/\'}
    msg=$(printf '%s' "$msg" | tr '\n\t' '  ' | cut -c1-300)
    printf '{"rep": %s, "backend": "%s", "tool": "%s", "test": "%s", "error": "%s"}\n' \
        "$rep" "$backend" "$1" "$2" "$msg" >>"$RAW/errors.jsonl"
    echo "    ! $1 $2: $msg" >&2
}
load_now() { cut -d' ' -f1 /proc/loadavg; }

# Runs a server (pinned to SCPU, in the background) and a client (pinned to CCPU), each
# bounded; prints the client's output. The server's output goes to $RAW/server.log.
# SRV_CPU=1: the server runs under GNU time, which leaves its user and system CPU seconds
# (whole process, set-up included) and its wall seconds in $RAW/server.time.
pair() { # seconds 'server command' 'client command'
    local t=$1 srv=$2 cli=$3 rc=0
    if [ -n "${SRV_CPU:-}" ]; then
        rm -f "$RAW/server.time"
        srv="/usr/bin/time -f '%U %S %e' -o '$RAW/server.time' $srv"
    fi
    timeout "$t" taskset -c $SCPU bash -c "$srv" >"$RAW/server.log" 2>&1 &
    local spid=$!
    sleep "${PAIR_DELAY:-0.4}"
    timeout "$t" taskset -c $CCPU bash -c "$cli" 2>&1 || rc=$?
    wait "$spid" 2>/dev/null || true
    return "$rc"
}

rdmx_run() { # backend-address test size iters [extra args]; AS=name records under another test name,
    # SRV="args" gives the server arguments too (-q N, --shared-cq: both sides need them)
    local addr=$1 test=$2 size=$3 iters=$4 out as=${AS:-}
    shift 4
    if ! out=$(pair 60 "$PERF --server $addr ${SRV:-}" "$PERF $addr -t $test -s $size -n $iters --json $*"); then
        fail_note rdmx "$test" "$out"
        return
    fi
    python3 - "$out" <<'EOF' | while read -r t s m v; do record rdmx "${as:-$t}" "$s" "$m" "$v"; done
import json, sys
doc = json.loads(sys.argv[1][sys.argv[1].index('{'):])
for r in doc["results"]:
    if "connections" in r:  # -q N: the message rate and each side's CPU per message
        print(r["test"], r["size"], "msg_s", r["msg_per_s"])
        print(r["test"], r["size"], "mb_s", r["mb_per_s"])
        print(r["test"], r["size"], "cpu_us_per_msg", r["cpu_us_per_msg"])
        print(r["test"], r["size"], "server_cpu_us_per_msg", r["server_cpu_us_per_msg"])
    elif "median_us" in r:
        print(r["test"], r["size"], "lat_us", r["median_us"])
        if "mean_us" in r:  # against fi_pingpong, which gives only the mean
            print(r["test"], r["size"], "lat_avg_us", r["mean_us"])
        if "ops_per_s" in r:  # the window-or-region tests: operations over the measured time
            print(r["test"], r["size"], "msg_s", r["ops_per_s"])
    else:
        print(r["test"], r["size"], "mb_s", r["mb_per_s"])
        print(r["test"], r["size"], "cpu_s_per_gb", r["cpu_s_per_gb"])
        if r["test"] in ("fetch_add_bw", "compare_swap_bw"):  # atomics: the rate is the row
            print(r["test"], r["size"], "msg_s", r["msg_per_s"])
EOF
    [ -z "${SRV_CPU:-}" ] || server_cpu rdmx "${as:-$test}" "$size"
}

# ---------------------------------------------------------------------------------------
# TCP backend on loopback

ucx_run() { # test size iters [client args: -T 8 -M multi, -I -E sleep]; AS=name records under another test name
    # (the ucx_perftest server takes the test's parameters from its client)
    local test=$1 size=$2 iters=$3 out line as=${AS:-$1} f
    shift 3
    if ! out=$(UCX_TLS=tcp,self UCX_NET_DEVICES=lo pair 60 "ucx_perftest -p 13337" \
        "ucx_perftest 127.0.0.1 -p 13337 -t $test -s $size -n $iters $*"); then
        fail_note ucx "$as" "$out"
        return
    fi
    line=$(grep '^Final:' <<<"$out" || true)
    [ -n "$line" ] || { fail_note ucx "$as" "$out"; return; }
    # Final: iters lat50% lat_avg lat_overall bw_avg bw_overall(MiB/s) rate_avg rate_overall,
    # then (1.13, latency tests) text; with -T N (threads) only: iters lat_overall bw_overall
    # rate_overall, summed over the threads.
    read -r -a f <<<"$(awk '{ for (i = 2; i <= NF && $i ~ /^[0-9.]+$/; i++) printf "%s ", $i }' <<<"$line")"
    local lat50=${f[1]} bw=${f[5]:-${f[2]:-}} rate=${f[7]:-${f[3]:-}}
    case $test in
    *lat) record ucx "$as" "$size" lat_us "$lat50"
        [ -z "${AS:-}" ] || record ucx "$as" "$size" lat_avg_us "${f[3]}" ;; # the mean, as fi_pingpong's
    *) record ucx "$as" "$size" mb_s "$(awk -v b="$bw" 'BEGIN { printf "%.2f", b * 1.048576 }')"
        [ -z "${AS:-}" ] || record ucx "$as" "$size" msg_s "$rate" ;;
    esac
    [ -z "${SRV_CPU:-}" ] || server_cpu ucx "$as" "$size"
}

# SRV_CPU=1 runs: the server's CPU seconds over its whole life (set-up included), recorded
# and left in SRV_CPU_S for per_rt (empty when the run failed).
server_cpu() { # tool test size
    local u s e
    [ -s "$RAW/server.time" ] || { fail_note "$1" "$2" "no server CPU time: $(cat "$RAW/server.time" 2>/dev/null)"; return; }
    read -r u s e <"$RAW/server.time"
    SRV_CPU_S=$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.3f", u + s }')
    record "$1" "$2" "$3" server_cpu_s "$SRV_CPU_S"
}

# The server's CPU per round trip without its set-up: a short run and a long run of the
# same tool back to back, (CPU(long) - CPU(short)) / (the round trips between them): the
# set-up (a few hundredths of a CPU second here, more on a loaded host) drops out.
per_rt() { # tool test size short-cpu extra-round-trips
    [ -n "$4" ] && [ -n "${SRV_CPU_S:-}" ] || return 0
    record "$1" "$2" "$3" server_cpu_us_per_rt "$(awk -v a="$4" -v b="$SRV_CPU_S" -v n="$5" 'BEGIN { printf "%.3f", (b - a) * 1e6 / n }')"
}

fi_run() { # name provider endpoint size [iterations (2000)]; AS=name records under another test name
    local out line n=${5:-2000} t=${AS:-pingpong}
    if ! out=$(pair 30 "fi_pingpong -p '$2' -e $3 -I $n -S $4" "fi_pingpong -p '$2' -e $3 -I $n -S $4 127.0.0.1"); then
        fail_note "$1" "$t" "$out"
        return
    fi
    # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec  (usec/xfer: one way, the
    # mean over the run: total time / transfers, where rdmx_perf and ucx_perftest give medians)
    line=$(awk -v s="$4" '$1 == s { print $7 }' <<<"$out" | tail -n 1)
    [ -n "$line" ] && record "$1" "$t" "$4" lat_us "$line" || { fail_note "$1" "$t" "$out"; return; }
    [ -z "${SRV_CPU:-}" ] || server_cpu "$1" "$t" "$4"
}

iperf_run() { # size
    local out
    if ! out=$(pair 30 "iperf3 -s -1 -p 5299" "iperf3 -c 127.0.0.1 -p 5299 -l $1 -O 1 -t 2 -J ${IPERF_ARGS:-}"); then
        fail_note iperf3 "${AS:-stream}" "$out"
        return
    fi
    record iperf3 "${AS:-stream}" "$1" mb_s "$(python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("%.2f" % (d["end"]["sum_received"]["bits_per_second"] / 8e6))' <<<"$out")"
}

qperf_run() { # test size
    local out v
    if ! out=$(PAIR_DELAY=0.6 pair 30 "qperf" "qperf 127.0.0.1 -t 1 -m $2 $1; qperf 127.0.0.1 quit"); then
        fail_note qperf "$1" "$out"
        return
    fi
    case $1 in
    tcp_lat) v=$(awk '$1 == "latency" { x = $3; if ($4 == "ms") x *= 1000; if ($4 == "ns") x /= 1000; print x }' <<<"$out")
        [ -n "$v" ] && record qperf tcp_lat "$2" lat_us "$v" || fail_note qperf "$1" "$out" ;;
    tcp_bw) v=$(awk '$1 == "bw" { x = $3; if ($4 == "GB/sec") x *= 1000; if ($4 == "KB/sec") x /= 1000; print x }' <<<"$out")
        [ -n "$v" ] && record qperf tcp_bw "$2" mb_s "$v" || fail_note qperf "$1" "$out" ;;
    esac
}

tcp_rep() {
    local a=tcp://127.0.0.1:18600
    echo "  8 B send/recv latency pairs: rdmx_perf send_lat, ucx_perftest tag_lat"
    local k
    for ((k = 0; k < TCP_LAT_PAIRS; k++)); do
        if (((rep + k) % 2)); then
            rdmx_run $a send_lat 8 5000
            ucx_run tag_lat 8 5000
        else
            ucx_run tag_lat 8 5000
            rdmx_run $a send_lat 8 5000
        fi
    done
    echo "  rdmx_perf (tcp)"
    rdmx_run $a send_lat 4096 5000 -s 65536
    rdmx_run $a write_lat 8 5000
    AS=write_lat_spin rdmx_run $a write_lat 8 5000 --spin-only # memory only, as perftest
    # Bandwidth runs last about a second or more each, for every tool: on this machine a
    # 0.25 s run of either rdmx_perf or iperf3 measures about 20 % below a 2 s run (the
    # host ramps up), which once made the iperf3 comparison a comparison of run lengths.
    for s in 65536 1048576 4194304; do
        local n=$((s == 65536 ? 40000 : s == 1048576 ? 6000 : 1500)) # 2.6-6.3 GB per run
        for t in write_bw send_bw read_bw; do rdmx_run $a $t $s $n; done
    done
    echo "  rdmx_perf -q 8 (one server thread, 8 connections: per-connection CQs vs one shared CQ)"
    SRV="-q 8" AS=send_bw_q8 rdmx_run $a send_bw 64 20000 -q 8
    SRV="-q 8 --shared-cq" AS=send_bw_q8_shared rdmx_run $a send_bw 64 20000 -q 8 --shared-cq
    SRV="-q 8 --shared-cq" AS=send_bw_q8_shared_event rdmx_run $a send_bw 64 20000 -q 8 --shared-cq -e
    echo "  ucx_perftest"
    for s in 4096 65536; do ucx_run tag_lat $s 5000; done
    ucx_run ucp_put_lat 8 5000
    for s in 65536 1048576 4194304; do
        # UCX over TCP is slower: put_bw and tag_bw runs last about 1-3 s with these counts,
        # ucp_get (about 0.06, 0.6 and 1.2 GB/s at these sizes) gets fewer, for 1.5-2.5 s.
        local n=$((s == 65536 ? 40000 : s == 1048576 ? 4000 : 1000))
        for t in ucp_put_bw tag_bw; do ucx_run $t $s $n; done
        ucx_run ucp_get $s $((s == 65536 ? 2000 : n * 2 / 5))
    done
    echo "  fi_pingpong"
    fi_run fi_tcp_msg tcp msg 8
    fi_run fi_tcp_rxm_rdm 'tcp;ofi_rxm' rdm 8
    echo "  iperf3, qperf"
    for s in 65536 1048576; do iperf_run $s; done # iperf3 writes at most 1 MiB per call
    AS=stream_p8 IPERF_ARGS="-P 8" iperf_run 65536     # 8 streams, against rdmx_perf -q 8
    for s in 8 4096 65536; do qperf_run tcp_lat $s; done
    for s in 65536 1048576 4194304; do qperf_run tcp_bw $s; done
}

# --many-conn: the rows of issue 17 only. Each group of runs rotates its order from rep to
# rep, so that no tool always runs first (or right after the same neighbour).
rotate() { # rep command... : runs the commands (each one word, a function) rotated by rep
    local n=$(($# - 1)) r=$1 i
    shift
    for ((i = 0; i < n; i++)); do
        local k=$(((i + r) % n + 1))
        "${!k}"
    done
}
mc_own() { SRV="-q 8" AS=send_bw_q8 rdmx_run $MCA send_bw 64 100000 -q 8; }
mc_shared() { SRV="-q 8 --shared-cq" AS=send_bw_q8_shared rdmx_run $MCA send_bw 64 100000 -q 8 --shared-cq; }
mc_event() { SRV="-q 8 --shared-cq" AS=send_bw_q8_shared_event rdmx_run $MCA send_bw 64 100000 -q 8 --shared-cq -e; }
mc_ucx1() { AS=tag_bw_T1 ucx_run tag_bw 64 400000; }
mc_ucx8() { AS=tag_bw_T8 ucx_run tag_bw 64 50000 -T 8 -M multi; } # 8 threads, one endpoint each
mc_own_64k() { SRV="-q 8" AS=send_bw_q8 rdmx_run $MCA send_bw 65536 8000 -q 8; }
mc_shared_64k() { SRV="-q 8 --shared-cq" AS=send_bw_q8_shared rdmx_run $MCA send_bw 65536 8000 -q 8 --shared-cq; }
mc_event_64k() { SRV="-q 8 --shared-cq" AS=send_bw_q8_shared_event rdmx_run $MCA send_bw 65536 8000 -q 8 --shared-cq -e; }
mc_iperf() { AS=stream_p8 IPERF_ARGS="-P 8" iperf_run 65536; }
# 8 B send/recv latency and the server's CPU per round trip: a run of 5000 round trips
# (recorded as NAME_short), then one of 50000, whose latency is the row's.
ev() { # tool test run-function args... (the function takes: name iterations)
    local tool=$1 test=$2 c0
    shift 2
    SRV_CPU_S=""
    SRV_CPU=1 "$@" "${test}_short" 5000
    c0=$SRV_CPU_S SRV_CPU_S=""
    SRV_CPU=1 "$@" "$test" 50000
    per_rt "$tool" "$test" 8 "$c0" 45000
}
lat_rdmx() { AS=$2 rdmx_run $MCA send_lat 8 "$3" ${1:+"$1"}; }
lat_ucx() { AS=$2 ucx_run tag_lat 8 "$3" -w 1000 $1; }
ev_poll() { ev rdmx send_lat lat_rdmx ""; }
ev_event() { ev rdmx send_lat_event lat_rdmx -e; }
ev_ucx_poll() { ev ucx tag_lat lat_ucx ""; }
ev_ucx_sleep() { ev ucx tag_lat_sleep lat_ucx "-I -E sleep"; }
lat_fi_msg() { AS=$2 fi_run fi_tcp_msg tcp msg 8 "$3"; }
lat_fi_rdm() { AS=$2 fi_run fi_tcp_rxm_rdm 'tcp;ofi_rxm' rdm 8 "$3"; }
ev_fi_msg() { ev fi_tcp_msg pingpong lat_fi_msg ""; }
ev_fi_rdm() { ev fi_tcp_rxm_rdm pingpong lat_fi_rdm ""; }
many_conn_rep() {
    MCA=tcp://127.0.0.1:18600
    echo "  64 B x 8 connections: rdmx_perf -q 8 (8 CQs, shared, shared + event), ucx_perftest tag_bw -T 1, -T 8"
    rotate "$rep" mc_own mc_shared mc_event mc_ucx1 mc_ucx8
    echo "  64 KiB x 8 connections: rdmx_perf -q 8 (8 CQs, shared, shared + event), iperf3 -P 8"
    rotate "$rep" mc_own_64k mc_shared_64k mc_event_64k mc_iperf
    echo "  8 B latency + server CPU: rdmx_perf (poll, -e), ucx_perftest tag_lat (poll, -I -E sleep), fi_pingpong"
    rotate "$rep" ev_poll ev_event ev_ucx_poll ev_ucx_sleep ev_fi_msg ev_fi_rdm
}

# --atomics, TCP: 8 B atomics against UCX's, over UCX's tcp transport alone (its atomics are
# then emulated in software by the target's worker, as rdmx's TCP engine serves them).
ucx_atomic_run() { # test iters [client args: -O N]; AS=name records under another test name
    local test=$1 iters=$2 out line as=${AS:-$1} f
    shift 2
    if ! out=$(UCX_TLS=tcp UCX_NET_DEVICES=lo pair 90 "ucx_perftest -p 13338" \
        "ucx_perftest 127.0.0.1 -p 13338 -t $test -s 8 -n $iters -w 1000 $*"); then
        fail_note ucx "$as" "$out"
        return
    fi
    line=$(grep '^Final:' <<<"$out" || true)
    [ -n "$line" ] || { fail_note ucx "$as" "$out"; return; }
    # Final: iters lat50% lat_avg lat_overall bw_avg bw_overall(MiB/s) rate_avg rate_overall:
    # with -O 1 the per-iteration time is one whole atomic round trip (as rdmx_perf's).
    read -r -a f <<<"$(awk '{ for (i = 2; i <= NF && $i ~ /^[0-9.]+$/; i++) printf "%s ", $i }' <<<"$line")"
    record ucx "$as" 8 lat_us "${f[1]}"
    record ucx "$as" 8 lat_avg_us "${f[3]}" # the mean over the whole run
    record ucx "$as" 8 msg_s "${f[7]}"
}
# Each run lasts about 0.5-6 s here: UCX's atomics over tcp run at some thousands per
# second with long stalls (means far above medians), rdmx's at some hundred thousands, so
# the windowed runs get different counts.
ATOMIC_LAT_ITERS=${ATOMIC_LAT_ITERS:-10000}
ATOMIC_BW_ITERS=${ATOMIC_BW_ITERS:-200000}
UCX_ATOMIC_BW_ITERS=${UCX_ATOMIC_BW_ITERS:-20000}
at_fadd_lat() { rdmx_run $ATA fetch_add_lat 8 "$ATOMIC_LAT_ITERS" -w 1000; }
at_cswap_lat() { rdmx_run $ATA compare_swap_lat 8 "$ATOMIC_LAT_ITERS" -w 1000; }
at_fadd_bw() { SRV="-o 128" rdmx_run $ATA fetch_add_bw 8 "$ATOMIC_BW_ITERS" -w 1000 -d 128 -o 128 -c 1; }
at_cswap_bw() { SRV="-o 128" rdmx_run $ATA compare_swap_bw 8 "$ATOMIC_BW_ITERS" -w 1000 -d 128 -o 128 -c 1; }
at_fadd_lat_tp() { AS=fetch_add_lat_target_poll rdmx_run $ATA fetch_add_lat 8 "$ATOMIC_LAT_ITERS" -w 1000 --target-poll; }
at_cswap_lat_tp() { AS=compare_swap_lat_target_poll rdmx_run $ATA compare_swap_lat 8 "$ATOMIC_LAT_ITERS" -w 1000 --target-poll; }
at_fadd_bw_tp() { SRV="-o 128" AS=fetch_add_bw_target_poll rdmx_run $ATA fetch_add_bw 8 "$ATOMIC_BW_ITERS" -w 1000 -d 128 -o 128 -c 1 --target-poll; }
at_read_lat() { rdmx_run $ATA read_lat 8 "$ATOMIC_LAT_ITERS" -w 1000; }
at_ucx_fadd() { ucx_atomic_run ucp_fadd "$ATOMIC_LAT_ITERS"; }
at_ucx_cswap() { ucx_atomic_run ucp_cswap "$ATOMIC_LAT_ITERS"; }
at_ucx_fadd_w() { AS=ucp_fadd_O128 ucx_atomic_run ucp_fadd "$UCX_ATOMIC_BW_ITERS" -O 128; }
at_ucx_cswap_w() { AS=ucp_cswap_O128 ucx_atomic_run ucp_cswap "$UCX_ATOMIC_BW_ITERS" -O 128; }
at_ucx_add_w() { AS=ucp_add_O128 ucx_atomic_run ucp_add "$UCX_ATOMIC_BW_ITERS" -O 128; }
atomics_tcp_rep() {
    ATA=tcp://127.0.0.1:18600
    echo "  8 B atomics, one at a time: rdmx_perf fetch_add_lat, compare_swap_lat; ucx_perftest ucp_fadd, ucp_cswap"
    rotate "$rep" at_fadd_lat at_ucx_fadd at_cswap_lat at_ucx_cswap at_fadd_lat_tp at_cswap_lat_tp at_read_lat
    echo "  8 B atomics, a window of 128: rdmx_perf fetch_add_bw, compare_swap_bw; ucx_perftest -O 128 ucp_fadd, ucp_cswap, ucp_add"
    rotate "$rep" at_fadd_bw at_ucx_fadd_w at_cswap_bw at_ucx_cswap_w at_ucx_add_w at_fadd_bw_tp
}

# --windows: a region per object against a window over it, each test one run over the three
# object sizes (-s 4K -s 64K -s 1M, in that order), the tests rotating from rep to rep. TCP:
# a register or a bind costs about a microsecond here, a round trip some 10-20 us, so a
# run of each lasts some tens of milliseconds to a second.
WINDOW_ITERS=${WINDOW_ITERS:-20000}
WINDOW_RT_ITERS=${WINDOW_RT_ITERS:-5000}
WINDOW_SIZES="-s 65536 -s 1048576" # after rdmx_run's own 4096
w_register() { rdmx_run "$WA" register 4096 "$W_ITERS" -w 200 $WINDOW_SIZES; }
w_bind() { rdmx_run "$WA" window_bind 4096 "$W_ITERS" -w 200 $WINDOW_SIZES; }
w_send() { rdmx_run "$WA" window_send 4096 "$W_RT_ITERS" -w 100 $WINDOW_SIZES; }
w_send_local() { rdmx_run "$WA" window_send_local 4096 "$W_RT_ITERS" -w 100 $WINDOW_SIZES; }
w_register_send_bind() { rdmx_run "$WA" register_send_bind 4096 "$W_RT_ITERS" -w 100 $WINDOW_SIZES; }
w_register_send() { rdmx_run "$WA" register_send 4096 "$W_RT_ITERS" -w 100 $WINDOW_SIZES; }
windows_rep() { # address iters round-trip-iters
    WA=$1 W_ITERS=$2 W_RT_ITERS=$3
    echo "  a region per object vs a window over it (4 KiB, 64 KiB, 1 MiB): register, window_bind, window_send, window_send_local, register_send, register_send_bind"
    rotate "$rep" w_register w_bind w_send w_send_local w_register_send w_register_send_bind
}

# ---------------------------------------------------------------------------------------
# verbs on soft-RoCE: runs inside the guest (compare.sh guest-verbs RAW BW_REPS LAT_REPS [BW_ITERS])

perftest_run() { # tool size iters; PT_ARGS="-q 8" for both sides, AS=name records under another name
    local out line x=${PT_ARGS:-}
    # One retry: perftest's rdma_cm connect is now and then rejected when its server is
    # not listening yet in the slow guest.
    if ! out=$(pair 120 "$1 -d rxe0 -R -s $2 -n $3 $x" "$1 -d rxe0 -R -s $2 -n $3 $x $RDMX_GUEST_IP") &&
        ! out=$(PAIR_DELAY=1.5 pair 120 "$1 -d rxe0 -R -s $2 -n $3 $x" "$1 -d rxe0 -R -s $2 -n $3 $x $RDMX_GUEST_IP"); then
        fail_note perftest "$1" "$out"
        return
    fi
    line=$(awk -v s="$2" '$1 == s' <<<"$out" | tail -n 1)
    [ -n "$line" ] || { fail_note perftest "$1" "$out"; return; }
    case $1 in
    *lat) record perftest "${1#ib_}" "$2" lat_us "$(awk '{ print $5 }' <<<"$line")" ;; # t_typical
    *) record perftest "${AS:-${1#ib_}}" "$2" mb_s "$(awk '{ printf "%.2f", $4 * 1.048576 }' <<<"$line")" # MiB/s
        [ -z "$x" ] || record perftest "${AS:-${1#ib_}}" "$2" msg_s "$(awk '{ printf "%.0f", $5 * 1e6 }' <<<"$line")" ;; # Mpps
    esac
}

guest_run() { # perftest|rdmx test size iters [rdmx_perf options...]: one run of either tool
    local tool=$1 t=$2 s=$3 n=$4
    shift 4
    if [ "$tool" = perftest ]; then
        perftest_run "ib_$t" "$s" "$n"
    else
        rdmx_run "rdma://$RDMX_GUEST_IP:18600" "$t" "$s" "$n" "$@"
    fi
}

gq_perftest() { PT_ARGS="-q 8" AS=send_bw_q8 perftest_run ib_send_bw 64 "${GUEST_Q8_ITERS:-2000}"; }
gq_own() { SRV="-q 8" AS=send_bw_q8 guest_run rdmx send_bw 64 "${GUEST_Q8_ITERS:-2000}" -w 0 -q 8; }
gq_shared() { SRV="-q 8 --shared-cq" AS=send_bw_q8_shared guest_run rdmx send_bw 64 "${GUEST_Q8_ITERS:-2000}" -w 0 -q 8 --shared-cq; }

guest_verbs() { # RAW BW_REPS LAT_REPS [BW_ITERS]; env GUEST_LAT_SIZES, GUEST_LAT_TESTS, GUEST_LAT_ITERS
    RAW=$1
    backend=verbs
    local bw_iters=${4:-$GUEST_BW_ITERS}
    local reps=$(($2 > $3 ? $2 : $3))
    # bench/rxe_modes.sh narrows the latency pairs to what it counts
    local lat_sizes=${GUEST_LAT_SIZES:-2 4096} lat_tests=${GUEST_LAT_TESTS:-send_lat write_lat read_lat}
    local lat_iters=${GUEST_LAT_ITERS:-1000}
    for ((rep = 1; rep <= reps; rep++)); do
        echo "verbs rep $rep (load $(load_now))"
        record load - 0 load "$(load_now)"
        # Within a rep each rdmx run sits next to its perftest run; which of the two goes
        # first alternates from rep to rep, so that what one leaves behind in the guest
        # (rxe's deferred QP clean-up, the previous server's exit) weighs on both alike.
        local order=(perftest rdmx)
        ((rep % 2 == 1)) || order=(rdmx perftest)
        if ((rep <= $3)); then
            for s in $lat_sizes; do
                for t in $lat_tests; do
                    # ib_write_lat spins on memory only; so does rdmx_perf here (--spin-only)
                    for tool in "${order[@]}"; do
                        guest_run $tool $t $s $lat_iters -w 100 $([ $t = write_lat ] && echo --spin-only)
                    done
                done
            done
        fi
        ((rep <= $2)) || continue
        # perftest's bandwidth tests time the span from the first post to the last
        # completion, cold start included (its --perform_warm_up exists for write and read
        # only); rdmx_perf without warm-up (-w 0) times the same span.
        for t in ${GUEST_BW_TESTS-send_bw write_bw read_bw}; do
            for tool in "${order[@]}"; do
                guest_run $tool $t 65536 "$bw_iters" -w 0
            done
        done
        # Many connections: 8 of them, 64 B sends (message rate), ib_send_bw -q 8 alongside,
        # the order rotating from rep to rep.
        rotate "$rep" gq_perftest gq_own gq_shared
    done
}

# --atomics, in the guest (compare.sh guest-atomics RAW REPS): ib_atomic_lat / ib_atomic_bw
# against rdmx_perf, each pair back to back, the order rotating from rep to rep. rxe has
# atomics (atomic_cap IBV_ATOMIC_HCA); siw has none, and these rows are not run there.
atomic_perftest_run() { # tool FETCH_AND_ADD|CMP_AND_SWAP iters [perftest args]; records under AS
    local tool=$1 op=$2 n=$3 out line
    shift 3
    local args="-d rxe0 -R -A $op -n $n $*"
    if ! out=$(pair 120 "$tool $args" "$tool $args $RDMX_GUEST_IP") &&
        ! out=$(PAIR_DELAY=1.5 pair 120 "$tool $args" "$tool $args $RDMX_GUEST_IP"); then
        fail_note perftest "$AS" "$out"
        return
    fi
    line=$(awk '$1 == 8' <<<"$out" | tail -n 1)
    [ -n "$line" ] || { fail_note perftest "$AS" "$out"; return; }
    case $tool in
    # #bytes #iterations t_min t_max t_typical t_avg ...: the whole round trip, as for reads
    *lat) record perftest "$AS" 8 lat_us "$(awk '{ print $5 }' <<<"$line")"
        record perftest "$AS" 8 lat_avg_us "$(awk '{ print $6 }' <<<"$line")" ;;
    # #bytes #iterations BW_peak BW_average[MiB/s] MsgRate[Mpps]
    *) record perftest "$AS" 8 msg_s "$(awk '{ printf "%.0f", $5 * 1e6 }' <<<"$line")" ;;
    esac
}
GUEST_ATOMIC_LAT_ITERS=${GUEST_ATOMIC_LAT_ITERS:-1000}
# rxe under TCG: some thousands of atomics per second in a window (either tool), so a
# bandwidth run of 5000 (perftest's default -n for bandwidth) lasts one or two seconds.
GUEST_ATOMIC_BW_ITERS=${GUEST_ATOMIC_BW_ITERS:-5000}
ga_pt_fadd_lat() { AS=fetch_add_lat atomic_perftest_run ib_atomic_lat FETCH_AND_ADD "$GUEST_ATOMIC_LAT_ITERS"; }
ga_pt_cswap_lat() { AS=compare_swap_lat atomic_perftest_run ib_atomic_lat CMP_AND_SWAP "$GUEST_ATOMIC_LAT_ITERS"; }
ga_pt_fadd_bw() { AS=fetch_add_bw atomic_perftest_run ib_atomic_bw FETCH_AND_ADD "$GUEST_ATOMIC_BW_ITERS" -t 128 -o 128; }
ga_pt_cswap_bw() { AS=compare_swap_bw atomic_perftest_run ib_atomic_bw CMP_AND_SWAP "$GUEST_ATOMIC_BW_ITERS" -t 128 -o 128; }
# perftest's latency tests have no warm-up; rdmx_perf's usual -w 100, as the other rxe rows.
# Its bandwidth tests time from the first post (rdmx_perf -w 0 too).
ga_fadd_lat() { guest_run rdmx fetch_add_lat 8 "$GUEST_ATOMIC_LAT_ITERS" -w 100; }
ga_cswap_lat() { guest_run rdmx compare_swap_lat 8 "$GUEST_ATOMIC_LAT_ITERS" -w 100; }
ga_fadd_bw() { SRV="-o 128" guest_run rdmx fetch_add_bw 8 "$GUEST_ATOMIC_BW_ITERS" -w 0 -d 128 -o 128 -c 100; }
ga_cswap_bw() { SRV="-o 128" guest_run rdmx compare_swap_bw 8 "$GUEST_ATOMIC_BW_ITERS" -w 0 -d 128 -o 128 -c 100; }
guest_atomics() { # RAW REPS
    RAW=$1
    backend=verbs
    for ((rep = 1; rep <= $2; rep++)); do
        echo "verbs atomics rep $rep (load $(load_now))"
        record load - 0 load "$(load_now)"
        rotate "$rep" ga_pt_fadd_lat ga_fadd_lat
        rotate "$rep" ga_pt_cswap_lat ga_cswap_lat
        rotate "$rep" ga_pt_fadd_bw ga_fadd_bw
        rotate "$rep" ga_pt_cswap_bw ga_cswap_bw
    done
}

# --windows, in the guest (compare.sh guest-windows RAW REPS). rxe under TCG: a
# registration pins its pages (ibv_reg_mr), so its cost grows with the object; a bind and
# an invalidation each go through the send queue.
GUEST_WINDOW_ITERS=${GUEST_WINDOW_ITERS:-1000}
GUEST_WINDOW_RT_ITERS=${GUEST_WINDOW_RT_ITERS:-500}
guest_windows() { # RAW REPS
    RAW=$1
    backend=verbs
    for ((rep = 1; rep <= $2; rep++)); do
        echo "verbs windows rep $rep (load $(load_now))"
        record load - 0 load "$(load_now)"
        windows_rep "rdma://$RDMX_GUEST_IP:18600" "$GUEST_WINDOW_ITERS" "$GUEST_WINDOW_RT_ITERS"
    done
}

if [ "${guest_mode:-0}" = 3 ]; then
    guest_windows "$@"
    exit 0
fi
if [ "${guest_mode:-0}" = 2 ]; then
    guest_atomics "$@"
    exit 0
fi
if [ "${guest_mode:-0}" = 1 ]; then
    guest_verbs "$@"
    exit 0
fi

# ---------------------------------------------------------------------------------------
# Host side: packages, build, the runs, the report

need=()
for p in ucx-utils libfabric-bin iperf3 qperf perftest gnuplot-nox python3; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if ((${#need[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    echo "=== installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
[ -x "$PERF" ] || ./dev.sh build

RAW=$(mktemp -d /tmp/rdmx-bench.XXXXXX)
: >"$RAW/results.jsonl"
: >"$RAW/errors.jsonl"
started=$(date +%s)
if ((TCP)); then
    backend=tcp
    for ((rep = 1; rep <= REPS; rep++)); do
        echo "=== TCP rep $rep/$REPS (load $(load_now))"
        record load - 0 load "$(load_now)"
        if ((WINDOWS)); then
            windows_rep tcp://127.0.0.1:18600 "$WINDOW_ITERS" "$WINDOW_RT_ITERS"
        elif ((ATOMICS)); then atomics_tcp_rep; elif ((MANY)); then many_conn_rep; else tcp_rep; fi
    done
fi
if ((GUEST)); then
    # --many-conn: the -q 8 rows only (no latency reps, no 64 KiB bandwidth runs)
    narrow=()
    ((MANY == 0)) || { narrow=(env GUEST_BW_TESTS=); GUEST_LAT_REPS=0; }
    guest_cmd=(guest-verbs "$RAW" "$GUEST_REPS" "$GUEST_LAT_REPS" "$GUEST_BW_ITERS")
    ((ATOMICS == 0)) || guest_cmd=(guest-atomics "$RAW" "$GUEST_REPS")
    ((WINDOWS == 0)) || guest_cmd=(guest-windows "$RAW" "$GUEST_REPS")
    if ((WINDOWS)); then
        echo "=== verbs on soft-RoCE: one guest boot, $GUEST_REPS windows reps"
    elif ((ATOMICS)); then
        echo "=== verbs on soft-RoCE: one guest boot, $GUEST_REPS atomics reps"
    else
        echo "=== verbs on soft-RoCE: one guest boot, $GUEST_REPS bandwidth and $GUEST_LAT_REPS latency reps"
    fi
    backend=verbs rep=0
    # The guest's load average is its own; the host's, every 30 s, goes to host-load.txt.
    (while uptime >>"$RAW/host-load.txt"; do sleep 30; done) &
    sampler=$!
    tests/guest/rxe-guest.sh --cache "${RDMX_GUEST_CACHE:-$BUILD/guest-cache}" --share "$ROOT" --share "$(realpath "$BUILD")" \
        --share "$RAW" --timeout 1200 -- "${narrow[@]}" bash "$ROOT/bench/compare.sh" "${guest_cmd[@]}" ||
        fail_note guest boot "rxe-guest.sh exited with $?"
    kill "$sampler"
fi
mkdir -p bench/results
stamp=${OUT:-$(date +%Y-%m-%d)}
python3 bench/summarize.py "$RAW" "bench/results/$stamp" $(((MANY)) && echo --many-conn --no-plot) $(((ATOMICS)) && echo --atomics --no-plot) $(((WINDOWS)) && echo --windows --no-plot) --reps "$REPS" --tcp-lat-pairs "$TCP_LAT_PAIRS" --guest-bw-iters "$GUEST_BW_ITERS" --guest-reps "$GUEST_REPS" --guest-lat-reps "$GUEST_LAT_REPS" --seconds $(($(date +%s) - started)) \
    --machine "$(nproc) CPUs, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), TCP congestion control $(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo unknown) (the system default, for every tool)"
echo "=== wrote bench/results/$stamp.md, .json$(((MANY || ATOMICS || WINDOWS)) || echo ", .png") (raw data in $RAW)"
