#!/bin/sh
# Endpoints (rdmx/endpoint.hpp) on TCP loopback, beside their peers, in interleaved rounds
# so that each ratio compares rows measured side by side:
#   8 B tagged ping-pong     rdmx_ep_perf tag_lat  vs  fi_pingpong -p "tcp;ofi_rxm" -e rdm -m tagged
#                            (and -m msg), ucx_perftest tag_lat
#   64 B message rate        rdmx_ep_perf tag_bw   vs  ucx_perftest tag_bw
#   rendezvous 1 MiB, 4 MiB  rdmx_ep_perf tag_bw   vs  ucx_perftest tag_bw (UCX's rendezvous)
#   first message to a new peer (lazy connect): rdmx_ep_perf first_msg (no peer tool: fabtests'
#   connection benchmarks are not packaged in Debian 12)
# Server pinned to CPU 0, client to CPU 1, as bench/compare.sh. The load average is printed
# with each round.
# Usage: bench/endpoints.sh BUILD_DIR [ROUNDS] > results.txt
set -u
build=$1; rounds=${2:-5}
perf=$build/samples/rdmx_ep_perf
port=7700

rdmx() { # label args...
    label=$1; shift
    port=$((port + 1))
    taskset -c 0 "$perf" --server -s 4M "tcp://127.0.0.1:$port" >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(timeout 120 taskset -c 1 "$perf" "tcp://127.0.0.1:$port" --json "$@" 2>&1)
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
    echo "$label $(echo "$out" | tr -d '\n')"
}

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
    UCX_TLS=tcp,self taskset -c 0 timeout 60 ucx_perftest -p 13340 >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(UCX_TLS=tcp,self timeout 60 taskset -c 1 ucx_perftest -p 13340 -t "$2" -s "$3" -n "$4" 127.0.0.1 2>&1 |
        grep -A2 'Final:' | tr -s ' ' | tr '\n' ' ')
    wait $spid 2>/dev/null
    echo "$label ${out:-failed}"
}

for r in $(seq 1 "$rounds"); do
    echo "# round $r load $(cut -d' ' -f1 /proc/loadavg)"
    rdmx tag_lat_8B -t tag_lat -s 8 -n 20000 -w 1000
    fi_pp fi_rxm_tagged_lat_8B tagged
    fi_pp fi_rxm_msg_lat_8B msg
    ucx ucx_tag_lat_8B tag_lat 8 20000
    rdmx tag_rate_64B -t tag_bw -s 64 -n 200000 -W 64
    ucx ucx_tag_rate_64B tag_bw 64 200000
    rdmx tag_bw_1M -t tag_bw -s 1M -n 2000 -W 16
    ucx ucx_tag_bw_1M tag_bw 1048576 2000
    rdmx tag_bw_4M -t tag_bw -s 4M -n 500 -W 8
    ucx ucx_tag_bw_4M tag_bw 4194304 500
    rdmx first_msg -t first_msg -n 50
done
