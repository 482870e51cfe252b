#!/usr/bin/env bash
# Runs inside the rxe guest (tests/guest/rxe-guest.sh): latency pairs of perftest and
# rdmx_perf, pinned like bench/compare.sh (server vCPU 0, client vCPU 1), with the rxe
# hw_counters, /proc/interrupts (LOC RES CAL TLB), softirq counts and ksoftirqd switches
# diffed around each run, and /usr/bin/time (wall, CPU, context switches) of both sides.
#   bench/rxe_latency_probe.sh RAW_DIR BUILD_DIR REPS "test:size ..." [ITERS]
set -uo pipefail
RAW=$1 BUILD=$2 REPS=$3 CASES=$4 ITERS=${5:-1000}
PERF=$BUILD/samples/rdmx_perf
HW=/sys/class/infiniband/rxe0/ports/1/hw_counters
IP=$RDMX_GUEST_IP
snap() { # -> key value lines
    for f in "$HW"/*; do echo "hw.${f##*/} $(cat "$f")"; done
    awk '$1 ~ /^(LOC|RES|CAL|TLB):$/ { print "irq." $1 "0 " $2; print "irq." $1 "1 " $3 }' /proc/interrupts
    awk '/TASKLET|NET_RX|TIMER|HI:/ { print "softirq." $1 "0 " $2; print "softirq." $1 "1 " $3 }' /proc/softirqs
    for c in 0 1; do
        p=$(pgrep -x "ksoftirqd/$c" | head -1)
        [ -n "$p" ] && echo "ksoftirqd$c.switches $(awk '/nr_switches/ { print $3 }' /proc/$p/sched)"
    done
}
diffsnap() { # the guest has no /dev/fd: no process substitution
    sort "$1" >"$1.s"; sort "$2" >"$2.s"
    join "$1.s" "$2.s" | awk '$3 != $2 { printf " %s=%d", $1, $3 - $2 }'; echo
}
pair() { # server client
    local TF="%e s wall, %U user %S sys, %c invol %w vol switches"
    timeout 60 taskset -c 0 /usr/bin/time -o "$RAW/server.time" -f "$TF" bash -c "$1" >"$RAW/server.log" 2>&1 &
    local spid=$!
    sleep 0.4
    timeout 60 taskset -c 1 /usr/bin/time -o "$RAW/client.time" -f "$TF" bash -c "$2" 2>&1
    wait "$spid" 2>/dev/null
    echo "server: $(cat "$RAW/server.time")" >"$RAW/times"
    echo "client: $(cat "$RAW/client.time")" >>"$RAW/times"
}
run() { # tool test size extra...
    local tool=$1 t=$2 s=$3 out
    shift 3
    snap >"$RAW/a"
    local g0=$(date +%s.%N)
    if [ "$tool" = perftest ]; then
        out=$(pair "ib_$t -d rxe0 -R -s $s -n $ITERS $*" "ib_$t -d rxe0 -R -s $s -n $ITERS $* $IP" | awk -v s="$s" '$1 == s' | tail -1)
        # bytes iters t_min t_max t_typical t_avg t_stdev 99% 99.9%
        out=$(awk '{ printf "min %s typical %s avg %s p99 %s max %s", $3, $5, $6, $8, $4 }' <<<"$out")
    else
        out=$(pair "$PERF --server rdma://$IP:18600" "$PERF rdma://$IP:18600 -t $t -s $s -n $ITERS -w 100 --json $*" |
            python3 -c 'import json,sys; s=sys.stdin.read(); d=json.loads(s[s.index("{"):]); r=d["results"][0]; print("min %.2f median %.2f p99 %.2f max %.2f" % (r["min_us"], r["median_us"], r["p99_us"], r["max_us"]))' 2>&1)
    fi
    snap >"$RAW/b"
    echo "$tool $t $s $* : $out   (guest wall $(awk -v a="$g0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f s", b - a }'))"
    echo "   delta:$(diffsnap "$RAW/a" "$RAW/b")"
    sed 's/^/   /' "$RAW/times"
}
uname -r; cat /proc/cmdline; grep -c processor /proc/cpuinfo
echo "clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
dmesg | grep -iE 'tsc|clocksource' | tail -5
for ((rep = 1; rep <= REPS; rep++)); do
    echo "=== rep $rep"
    for c in $CASES; do
        t=${c%%:*} rest=${c#*:} s=${rest%%:*} extra=""
        [ "$rest" != "$s" ] && extra=${rest#*:} && extra=${extra//,/ }
        run perftest "$t" "$s"
        run rdmx "$t" "$s" $extra
    done
done
