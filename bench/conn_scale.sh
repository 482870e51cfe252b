#!/bin/sh
# 1024 connections to one single-threaded server, memory per connection with and without
# shared queues (tests/scale/conn_scale.sh), on TCP here and on rxe in the test guest (too
# slow there for the test suite: the connects alone take minutes under TCG).
#   bench/conn_scale.sh [BUILD_DIR] [N]
set -eu
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}"); n=${2:-1024}
sh tests/scale/conn_scale.sh "$build" tcp "$n"
RDMX_GUEST_CACHE=${RDMX_GUEST_CACHE:-$build/guest-cache} \
    sh tests/run-guest-script.sh "$build" tests/scale/conn_scale.sh "$build" rdma "$n"
