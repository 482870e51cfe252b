#!/bin/sh
# The GPU check, for a machine with an NVIDIA GPU and driver (docs/gpu.md):
#
#   tests/gpu/device-check.sh [BUILD_DIR]
#
# Builds the GPU tests into BUILD_DIR (default build-gpu; a build already there is used as
# it is, for machines without meson, Boost or GoogleTest: build it elsewhere with
# -Drdma=disabled and carry it), runs them with the driver and with the driver hidden, and
# prints one closing line: "device-check: ok ..." or "device-check: FAILED ...".
set -u
build=${1:-build-gpu}
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here" || exit 1

echo "== the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(no nvidia-smi)"
uname -r
if [ ! -x "$build/tests/gpu/gpu_test" ]; then
    echo "== building $build"
    { [ -d "$build" ] || meson setup "$build" -Drdma=disabled -Dsamples=disabled -Dtests=enabled; } &&
        ninja -C "$build" tests/gpu/gpu_test ||
        { echo "device-check: FAILED (build)"; exit 1; }
fi

status=0
echo "== GPU tests (RDMX_LOG=info)"
RDMX_LOG=info "$build/tests/gpu/gpu_test" --gtest_filter='-no_driver.*' --gtest_brief=0 >"${TMPDIR:-/tmp}/gpu.log" 2>&1 || status=1
cat "${TMPDIR:-/tmp}/gpu.log"
echo "== the same with the driver hidden"
RDMX_CUDA_DRIVER=/nonexistent/libcuda.so.1 "$build/tests/gpu/gpu_test" --gtest_filter='no_driver.*' || status=1

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
