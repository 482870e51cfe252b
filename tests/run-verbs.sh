#!/bin/sh
# Runs a test binary on the verbs backend: directly when this host has an RDMA device with
# an IPv4 address (set RDMX_TEST_RDMA_ADDR to choose one), otherwise inside a QEMU guest on
# soft-RoCE (tests/guest/rxe-guest.sh). Usage: run-verbs.sh BUILD_DIR BINARY XML_OUT [ARGS...]
# RDMX_GUEST_PROVIDER=siw: always in a guest, on soft-iWARP (siw0) instead.
set -eu
build=$1; bin=$2; xml=$3; shift 3
provider=${RDMX_GUEST_PROVIDER:-rxe}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$(dirname "$xml")"

if [ "$provider" = rxe ] && [ -z "${RDMX_TEST_RDMA_ADDR:-}" ] && command -v rdma >/dev/null 2>&1 && [ -d /sys/class/infiniband ] \
    && [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
    # Pick the IPv4 address of the first netdev under an RDMA link.
    dev=$(rdma link show 2>/dev/null | sed -n 's/.*netdev \([^ ]*\).*/\1/p' | head -n 1)
    [ -n "$dev" ] && RDMX_TEST_RDMA_ADDR=$(ip -4 -o addr show dev "$dev" | awk '{sub(/\/.*/, "", $4); print $4; exit}')
fi
if [ "$provider" = rxe ] && [ -n "${RDMX_TEST_RDMA_ADDR:-}" ]; then
    echo "[rdmx] running on this host's RDMA device, address $RDMX_TEST_RDMA_ADDR"
    RDMX_TEST_BACKENDS=verbs RDMX_TEST_RDMA_ADDR=$RDMX_TEST_RDMA_ADDR GTEST_OUTPUT="xml:$xml" exec "$bin" "$@"
fi

if [ "$provider" = rxe ]; then
    echo "[rdmx] no RDMA device on this host: booting a QEMU guest with soft-RoCE (rdma_rxe)"
else
    echo "[rdmx] booting a QEMU guest with $provider"
fi
# RDMX_GUEST_CACHE lets a second build directory (the sanitizer build) reuse the kernel
# that the first one downloaded.
# A GTEST_FILTER of the caller's (dev.sh's ASan pass) goes into the guest with the run (as
# one word: no globbing of its stars, and it has no spaces).
set -f
exec "$here/guest/rxe-guest.sh" --provider "$provider" --cache "${RDMX_GUEST_CACHE:-$build/guest-cache}" --share "$build" --timeout 1100 -- \
    env RDMX_TEST_BACKENDS=verbs GTEST_OUTPUT="xml:$xml" ${GTEST_FILTER:+GTEST_FILTER="$GTEST_FILTER"} \
    sh -c 'RDMX_TEST_RDMA_ADDR=$RDMX_GUEST_IP exec "$0" "$@"' "$bin" "$@"
