#!/bin/sh
# The samples' runs over rxe0, in one test guest (a guest each cost CI a boot each): the
# sample pair, the object store, bulk RPC over endpoints, and rdmx_perf's atomics and
# windows, each run as its own script runs it over tcp and shm. Every part runs; the test
# fails if any part fails, naming each; a part that skips (exit 77: the device lacks the
# feature) makes the whole a skip, never a pass, once the others passed.
# Usage: verbs_samples.sh BUILD_DIR   (inside the test guest: tests/run-guest-script.sh)
set -u
build=${1:?usage: verbs_samples.sh BUILD_DIR}
here=$(dirname "$0")
failed="" skipped=""
for part in "sample_pair.sh rdma" "object_store.sh rdma" "bulk_rpc.sh rdma" "perf_smoke.sh rdma atomics" \
    "perf_smoke.sh rdma windows"; do
    # shellcheck disable=SC2086 # the part's words: the script and its arguments
    set -- $part
    script=$1; shift
    echo "=== verbs samples: $part"
    sh "$here/$script" "$build" "$@"
    case $? in
    0) ;;
    77) skipped="$skipped [$part]" ;;
    *) failed="$failed [$part]" ;;
    esac
done
if [ -n "$failed" ]; then
    echo "=== verbs samples: FAILED:$failed"
    exit 1
fi
if [ -n "$skipped" ]; then
    echo "=== verbs samples: skipped:$skipped; the others passed"
    exit 77
fi
echo "=== verbs samples: all five parts passed"
