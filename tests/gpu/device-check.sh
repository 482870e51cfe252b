#!/bin/sh
# The GPU check, for a machine with an NVIDIA GPU and driver (docs/gpu.md):
#
#   tests/gpu/device-check.sh [BUILD_DIR]
#
# Builds the GPU tests and rdmx_perf into BUILD_DIR (default build-gpu; a build already
# there is used as it is, for machines without meson, Boost, CLI11 or GoogleTest: build it
# elsewhere with -Drdma=disabled and carry it), runs them with the driver and with the
# driver hidden, then a short benchmark: cuMemcpy bandwidth (copy_bw), and rdmx_perf's TCP
# write_bw and send_bw on loopback with device memory at both ends and with host memory,
# interleaved, two rounds. Prints one closing line: "device-check: ok ..." or
# "device-check: FAILED ..." (the tests decide it; the benchmark only reports).
set -u
build=${1:-build-gpu}
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here" || exit 1

echo "== the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(no nvidia-smi)"
uname -r
if [ ! -x "$build/tests/gpu/gpu_test" ] || [ ! -x "$build/samples/rdmx_perf" ]; then
    echo "== building $build"
    { [ -d "$build" ] || meson setup "$build" -Drdma=disabled -Dsamples=enabled -Dtests=enabled; } &&
        ninja -C "$build" tests/gpu/gpu_test tests/gpu/copy_bw samples/rdmx_perf ||
        { echo "device-check: FAILED (build)"; exit 1; }
fi

status=0
echo "== GPU tests (RDMX_LOG=info)"
RDMX_LOG=info "$build/tests/gpu/gpu_test" --gtest_filter='-no_driver.*' --gtest_brief=0 >"${TMPDIR:-/tmp}/gpu.log" 2>&1 || status=1
cat "${TMPDIR:-/tmp}/gpu.log"
echo "== the same with the driver hidden"
RDMX_CUDA_DRIVER=/nonexistent/libcuda.so.1 "$build/tests/gpu/gpu_test" --gtest_filter='no_driver.*' || status=1

echo "== cuMemcpy bandwidth (copy_bw)"
timeout 120 "$build/tests/gpu/copy_bw"

# One rdmx_perf pair on loopback: MEM (host or cuda) at both ends, TEST, the sizes.
# MEM: host; cuda (device memory at both ends, staged through 256 KiB chunks); cuda-1M
# (through 1 MiB chunks, RDMX_TCP_STAGING_CHUNK); staged (host memory through the staging
# path, RDMX_TCP_FORCE_STAGING, memcpy for the driver's copies: what chunking costs alone).
perf_pair() { # MEM TEST
    local port=$((18600 + RANDOM % 1000)) flag= staged=0 chunk=262144
    case $1 in
    cuda) flag=--cuda ;;
    cuda-1M) flag=--cuda chunk=1048576 ;;
    staged) staged=1 ;;
    esac
    export RDMX_TCP_FORCE_STAGING=$staged RDMX_TCP_STAGING_CHUNK=$chunk
    timeout 60 "$build/samples/rdmx_perf" --server "tcp://127.0.0.1:$port" $flag >/dev/null 2>&1 &
    local srv=$!
    sleep 0.3
    echo "-- $1 memory at both ends: $2"
    timeout 60 "$build/samples/rdmx_perf" "tcp://127.0.0.1:$port" $flag -t "$2" -s 64K -s 1M -s 4M -s 16M \
        -n 200 || echo "(rdmx_perf $2 $1: failed)"
    wait "$srv"
    unset RDMX_TCP_FORCE_STAGING RDMX_TCP_STAGING_CHUNK
}
if [ -x "$build/samples/rdmx_perf" ]; then
    echo "== rdmx TCP on loopback, device-to-device (two chunk sizes), host-to-host and host staged, interleaved (2 rounds)"
    for round in 1 2; do
        for t in write_bw send_bw; do
            for mem in cuda host cuda-1M staged; do
                echo "round $round"
                perf_pair "$mem" "$t"
            done
        done
    done
fi

# One line per test ends in its time: "[  SKIPPED ] gpu.x (0 ms)".
count() { grep -cE "^\[ *$1 *\] .* \([0-9]+ ms\)\$" "${TMPDIR:-/tmp}/gpu.log"; }
passed=$(count OK) skipped=$(count SKIPPED) failed=$(count FAILED)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [ "$status" = 0 ]; then
    echo "device-check: ok on ${gpu:-no GPU}: $passed passed, $skipped skipped, $failed failed"
else
    echo "device-check: FAILED on ${gpu:-no GPU}: $passed passed, $skipped skipped, $failed failed"
fi
exit "$status"
