#!/bin/sh
# Runs a POSIX sh test script inside the soft-RoCE guest (tests/guest/rxe-guest.sh), with
# the build directory shared read-write. The script is copied into the build directory
# first: the guest sees the host's / read-only but replaces /tmp, where a checkout may live.
# Usage: run-guest-script.sh BUILD_DIR SCRIPT [ARGS...]
set -eu
build=$1; script=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$build/guest-scripts"
cp "$script" "$build/guest-scripts/"
# and the scripts beside it, which it may source (tests/samples/common.sh) or run
# (tests/samples/verbs_samples.sh runs the others)
cp "$(dirname "$script")"/*.sh "$build/guest-scripts/"
# RDMX_GUEST_PROVIDER=siw: on soft-iWARP instead; RDMX_GUEST_CACHE: another build's cache.
exec "$here/guest/rxe-guest.sh" --provider "${RDMX_GUEST_PROVIDER:-rxe}" --cache "${RDMX_GUEST_CACHE:-$build/guest-cache}" \
    --share "$build" --timeout 850 -- \
    sh "$build/guest-scripts/$(basename "$script")" "$@"
