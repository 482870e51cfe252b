#!/bin/sh
# Endpoints on one host (issue 29's "endpoints over shm against libfabric's shm RDM"):
# rdmx_ep_perf over shm:// against fabtests over libfabric 1.17's shm provider (an RDM
# endpoint: fi_rdm_tagged_pingpong, fi_rdm_tagged_bw) and UCX 1.13 with UCX_TLS=sm
# (ucx_perftest tag_lat, tag_bw), interleaved per round: 8 B tagged ping-pong (rdmx also
# with -B, busy polling), 64 B message rate, 1 MiB and 4 MiB bandwidth (rendezvous; rdmx
# also with -1, one buffer on each side, which is how fabtests and ucx_perftest move them).
# Server on CPU 0, client on CPU 1. fabtests come from bench/fabtests.sh; each fabtests side
# needs a name of its own (-B PORT on the server, -B PORT+1 -P PORT on the client, -E).
# Usage: sh bench/endpoints_shm.sh BUILD_DIR FABTESTS_DIR [ROUNDS]
# Rows: "label JSON" (rdmx_ep_perf --json), "label fabtests-row" (bytes iters total time
# MB/sec usec/xfer Mxfers/sec), "label UCX Final line" (iterations, typical / average /
# overall latency us, bandwidth average / overall MB/s, message rate average / overall).
set -eu
build=${1:?usage: endpoints_shm.sh BUILD_DIR FABTESTS_DIR [ROUNDS]}
ft=${2:?usage: endpoints_shm.sh BUILD_DIR FABTESTS_DIR [ROUNDS]}
rounds=${3:-3}
perf=$build/samples/rdmx_ep_perf
port=7800

rdmx() { # label args...; SRV="..." adds server options
    label=$1; shift
    port=$((port + 2))
    taskset -c 0 timeout 150 "$perf" --server -s 4M ${SRV:-} "shm://epshm:$port" >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(timeout 120 taskset -c 1 "$perf" "shm://epshm:$port" --json "$@" 2>&1)
    kill $spid 2>/dev/null; wait $spid 2>/dev/null || true
    echo "$label $(echo "$out" | tr -d '\n')"
}

fab() { # label tool args...
    label=$1; tool=$2; shift 2
    port=$((port + 2))
    taskset -c 0 timeout 120 "$ft/$tool" -p shm -E -B $port "$@" >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(timeout 120 taskset -c 1 "$ft/$tool" -p shm -E -B $((port + 1)) -P $port "$@" 127.0.0.1 2>&1)
    wait $spid 2>/dev/null || true
    line=$(echo "$out" | awk '$1 ~ /^[0-9]+[km]?$/ && NF == 7' | tail -n 1)
    echo "$label ${line:-failed: $(echo "$out" | tail -n 2 | tr '\n' ' ')}"
}

ucx() { # label test size iters
    label=$1
    port=$((port + 2))
    UCX_TLS=sm taskset -c 0 timeout 60 ucx_perftest -p $port >/dev/null 2>&1 &
    spid=$!
    sleep 0.5
    out=$(UCX_TLS=sm timeout 60 taskset -c 1 ucx_perftest -p $port -t "$2" -s "$3" -n "$4" localhost 2>&1 |
        grep 'Final:' | tr -s ' ')
    wait $spid 2>/dev/null || true
    echo "$label ${out:-failed}"
}

for r in $(seq 1 "$rounds"); do
    echo "# round $r load $(cut -d' ' -f1 /proc/loadavg)"
    rdmx tag_lat_8B -t tag_lat -s 8 -n 20000 -w 1000
    SRV=-B rdmx tag_lat_8B_busy -t tag_lat -s 8 -n 20000 -w 1000 -B
    fab fi_shm_tagged_pingpong_8B fi_rdm_tagged_pingpong -S 8 -I 20000 -w 1000
    ucx ucx_sm_tag_lat_8B tag_lat 8 20000
    rdmx tag_rate_64B -t tag_bw -s 64 -n 200000 -W 64
    fab fi_shm_tagged_bw_64B fi_rdm_tagged_bw -S 64 -I 200000 -W 64
    ucx ucx_sm_tag_rate_64B tag_bw 64 200000
    rdmx tag_bw_1M -t tag_bw -s 1M -n 2000 -W 16
    SRV=-1 rdmx tag_bw_1M_one_buffer -t tag_bw -s 1M -n 2000 -W 16 -1
    fab fi_shm_tagged_bw_1M fi_rdm_tagged_bw -S 1048576 -I 2000 -W 16
    ucx ucx_sm_tag_bw_1M tag_bw 1048576 2000
    rdmx tag_bw_4M -t tag_bw -s 4M -n 500 -W 8
    SRV=-1 rdmx tag_bw_4M_one_buffer -t tag_bw -s 4M -n 500 -W 8 -1
    fab fi_shm_tagged_bw_4M fi_rdm_tagged_bw -S 4194304 -I 500 -W 8
    ucx ucx_sm_tag_bw_4M tag_bw 4194304 500
done
