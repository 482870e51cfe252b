#!/bin/sh
# Endpoints (rdmx/endpoint.hpp) beside their peers, in interleaved rounds (round 1 runs every
# row once, then round 2 ...) so that each ratio compares rows measured side by side.
# On TCP loopback:
#   8 B tagged ping-pong     rdmx_ep_perf tag_lat (and with -B, endpoint_options::busy_poll;
#                            with -F, fd() taken: the queue kept armed for a sleeper; with
#                            -e, both sides sleep on fd() between messages: event mode)
#                            vs  fi_pingpong -p "tcp;ofi_rxm" -e rdm -m tagged (and -m msg),
#                            fabtests' fi_rdm_tagged_pingpong, ucx_perftest tag_lat
#   64 B message rate        rdmx_ep_perf tag_bw   vs  ucx_perftest tag_bw, fi_rdm_tagged_bw
#   rendezvous 1 MiB, 4 MiB  rdmx_ep_perf tag_bw   vs  ucx_perftest tag_bw (UCX's rendezvous),
#                            also with -1 (every message from and into one buffer, as the
#                            peer tools do) and UCX on lo only (by default it stripes over
#                            every interface: docs/performance.md),
#                            fi_rdm_tagged_bw -p "tcp;ofi_rxm" (rxm's rendezvous), and
#                            fi_rma_bw -o read at 1 MiB (rxm's RMA read: what rdmx's rendezvous
#                            does underneath)
#   first message to a new peer (lazy connect): rdmx_ep_perf first_msg (no peer tool)
#   connections to 1024 peers, 64 at once: rdmx_ep_perf conn_rate (no peer tool: fabtests'
#   fi_rdm_* connect one peer)
# In the rxe guest (unless --no-guest): the same rdmx rows over rdma:// against
# fi_rdm_tagged_pingpong / fi_rdm_tagged_bw -p "verbs;ofi_rxm" with FI_UNIVERSE_SIZE=32
# (rxm sizes its verbs CQ rx_size x universe + tx_size x universe entries, which with the
# default universe of 256 is more than rxe gives: "vrb_cq_open(): Unable to create verbs CQ",
# fi_enable -22), with smaller counts (rxe under TCG moves about 30 MB/s), and conn_rate to
# 1024 peers (the guest's hard RLIMIT_NOFILE of 4096 is raised first: ~9 fds per endpoint).
# fabtests come from bench/fabtests.sh (build/fabtests); rows whose tool is missing say so.
# Server pinned to CPU 0, client to CPU 1 (in the guest too), as bench/compare.sh; every run
# bounded by timeout. The load average is printed with each round (in the guest: the
# guest's own; the host's before and after the boot).
# With CC=NAME in the environment the TCP rows run under that congestion control on every
# socket of every program (tcp_congestion_shim.c, LD_PRELOADed; this host's default is BBR,
# which paces even on loopback: docs/performance.md), the guest rows as they are.
# Usage: [CC=cubic] bench/endpoints.sh BUILD_DIR [ROUNDS] [GUEST_ROUNDS|--no-guest] > results.txt
#        (inside the guest: bench/endpoints.sh --guest BUILD_DIR ROUNDS)
set -u
guest=0
[ "$1" = --guest ] && { guest=1; shift; }
build=$1; rounds=${2:-5}; guest_rounds=${3:-3}
perf=$build/samples/rdmx_ep_perf
ft=$build/fabtests
port=7700
# Where the runs go: TCP loopback, or rxe in the guest (slower: longer waits, fewer iterations)
scheme=tcp host=127.0.0.1 fiprov="tcp;ofi_rxm" settle=0.5 limit=120
if [ $guest = 1 ]; then
    scheme=rdma host=$RDMX_GUEST_IP fiprov="verbs;ofi_rxm" settle=2 limit=300
    export FI_UNIVERSE_SIZE=32
    ulimit -Hn 65536 && ulimit -n 65536
elif [ -n "${CC:-}" ]; then
    shim=$build/tcp_congestion_shim.so
    cc -O2 -shared -fPIC -o "$shim" "$(dirname "$0")/tcp_congestion_shim.c" -ldl || exit 1
    export LD_PRELOAD=$shim RDMX_BENCH_CC=$CC
    echo "# every TCP socket under $CC ($(sysctl -n net.ipv4.tcp_congestion_control) is the host's default)"
fi

rdmx() { # label args...; SRV="..." adds server options
    label=$1; shift
    port=$((port + 1))
    taskset -c 0 timeout $((limit + 30)) "$perf" --server -s 4M ${SRV:-} "$scheme://$host:$port" >/dev/null 2>&1 &
    spid=$!
    sleep $settle
    out=$(timeout $limit taskset -c 1 "$perf" "$scheme://$host:$port" --json "$@" 2>&1 | grep -v LAST_WQE_REACHED)
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
    echo "$label $(echo "$out" | tr -d '\n')"
}

fab() { # label tool args...: a fabtests benchmark over rxm; prints the client's result line
    label=$1; tool=$2; shift 2
    [ -x "$ft/$tool" ] || { echo "$label skipped: no $ft/$tool (bench/fabtests.sh)"; return; }
    taskset -c 0 timeout $limit "$ft/$tool" -p "$fiprov" "$@" -s "$host" -B 47700 >/dev/null 2>&1 &
    spid=$!
    sleep $settle
    out=$(timeout $limit taskset -c 1 "$ft/$tool" -p "$fiprov" "$@" -P 47700 "$host" 2>&1)
    wait $spid 2>/dev/null
    line=$(echo "$out" | awk '$1 ~ /^[0-9]+[km]?$/ && NF == 7' | tail -n 1)
    echo "$label ${line:-failed: $(echo "$out" | tail -n 2 | tr '\n' ' ')}"
}

if [ $guest = 1 ]; then
    for r in $(seq 1 "$rounds"); do
        echo "# guest round $r load $(cut -d' ' -f1 /proc/loadavg)"
        rdmx rxe_tag_lat_8B -t tag_lat -s 8 -n 1000 -w 100
        SRV=-B rdmx rxe_tag_lat_8B_busy -t tag_lat -s 8 -n 1000 -w 100 -B
        SRV=-F rdmx rxe_tag_lat_8B_fd -t tag_lat -s 8 -n 1000 -w 100 -F
        fab rxe_fi_rdm_tagged_pingpong_8B fi_rdm_tagged_pingpong -S 8 -I 1000 -w 100
        rdmx rxe_tag_bw_1M -t tag_bw -s 1M -n 100 -W 16
        fab rxe_fi_rdm_tagged_bw_1M fi_rdm_tagged_bw -S 1048576 -I 100 -W 16
        rdmx rxe_tag_bw_4M -t tag_bw -s 4M -n 30 -W 8
        fab rxe_fi_rdm_tagged_bw_4M fi_rdm_tagged_bw -S 4194304 -I 30 -W 8
        rdmx rxe_first_msg -t first_msg -n 20 -w 0
        SRV="--peers 1024" rdmx rxe_conn_rate_1024 -t conn_rate -n 1024 -W 64 --timeout-ms 60000
    done
    exit 0
fi

fi_pp() { # label mode
    label=$1
    command -v fi_pingpong >/dev/null || { echo "$label skipped: no fi_pingpong"; return; }
    taskset -c 0 timeout 60 fi_pingpong -p "tcp;ofi_rxm" -e rdm -m "$2" -S 8 -I 20000 -B 47600 >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(timeout 60 taskset -c 1 fi_pingpong -p "tcp;ofi_rxm" -e rdm -m "$2" -S 8 -I 20000 -P 47600 127.0.0.1 2>&1 |
        awk '$1 == "8" { print $7 " us/xfer" }')
    wait $spid 2>/dev/null
    echo "$label ${out:-failed}"
}

ucx() { # label test size iters
    label=$1
    command -v ucx_perftest >/dev/null || { echo "$label skipped: no ucx_perftest"; return; }
    UCX_TLS=tcp,self taskset -c 0 timeout 60 env ${UCXENV:-} ucx_perftest -p 13340 >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(UCX_TLS=tcp,self timeout 60 taskset -c 1 env ${UCXENV:-} ucx_perftest -p 13340 -t "$2" -s "$3" -n "$4" 127.0.0.1 2>&1 |
        grep -A2 'Final:' | tr -s ' ' | tr '\n' ' ')
    wait $spid 2>/dev/null
    echo "$label ${out:-failed}"
}

for r in $(seq 1 "$rounds"); do
    echo "# round $r load $(cut -d' ' -f1 /proc/loadavg)"
    rdmx tag_lat_8B -t tag_lat -s 8 -n 20000 -w 1000
    SRV=-B rdmx tag_lat_8B_busy -t tag_lat -s 8 -n 20000 -w 1000 -B
    SRV=-F rdmx tag_lat_8B_fd -t tag_lat -s 8 -n 20000 -w 1000 -F
    SRV=-e rdmx tag_lat_8B_event -t tag_lat -s 8 -n 20000 -w 1000 -e
    fi_pp fi_rxm_tagged_lat_8B tagged
    fi_pp fi_rxm_msg_lat_8B msg
    ucx ucx_tag_lat_8B tag_lat 8 20000
    rdmx tag_rate_64B -t tag_bw -s 64 -n 200000 -W 64
    SRV=-F rdmx tag_rate_64B_fd -t tag_bw -s 64 -n 200000 -W 64 -F
    ucx ucx_tag_rate_64B tag_bw 64 200000
    rdmx tag_bw_1M -t tag_bw -s 1M -n 2000 -W 16
    SRV=-1 rdmx tag_bw_1M_one_buffer -t tag_bw -s 1M -n 2000 -W 16 -1
    ucx ucx_tag_bw_1M tag_bw 1048576 2000
    UCXENV=UCX_NET_DEVICES=lo ucx ucx_tag_bw_1M_lo tag_bw 1048576 2000
    rdmx tag_bw_4M -t tag_bw -s 4M -n 500 -W 8
    SRV=-1 rdmx tag_bw_4M_one_buffer -t tag_bw -s 4M -n 500 -W 8 -1
    ucx ucx_tag_bw_4M tag_bw 4194304 500
    UCXENV=UCX_NET_DEVICES=lo ucx ucx_tag_bw_4M_lo tag_bw 4194304 500
    rdmx first_msg -t first_msg -n 50
    fab fi_rdm_tagged_pingpong_8B fi_rdm_tagged_pingpong -S 8 -I 20000 -w 1000
    fab fi_rdm_tagged_bw_64B fi_rdm_tagged_bw -S 64 -I 200000 -W 64
    fab fi_rdm_tagged_bw_1M fi_rdm_tagged_bw -S 1048576 -I 2000 -W 16
    fab fi_rdm_tagged_bw_4M fi_rdm_tagged_bw -S 4194304 -I 500 -W 8
    fab fi_rma_bw_read_1M fi_rma_bw -e rdm -o read -S 1048576 -I 2000 -W 16
    SRV="--peers 1024" rdmx conn_rate_1024 -t conn_rate -n 1024 -W 64
done

[ "$guest_rounds" = --no-guest ] && exit 0
unset LD_PRELOAD RDMX_BENCH_CC
root=$(cd "$(dirname "$0")/.." && pwd)
echo "# guest: one rxe boot, $guest_rounds rounds; host load before $(cut -d' ' -f1 /proc/loadavg)"
"$root/tests/guest/rxe-guest.sh" --cache "${RDMX_GUEST_CACHE:-$build/guest-cache}" --share "$(realpath "$build")" \
    --timeout 1200 -- sh "$root/bench/endpoints.sh" --guest "$(realpath "$build")" "$guest_rounds" ||
    echo "# guest: rxe-guest.sh exited with $?"
echo "# guest: host load after $(cut -d' ' -f1 /proc/loadavg)"
