#!/bin/sh
# 1024 connections to one single-threaded server, with queues of their own and with one
# shared completion queue and receive queue (tests/scale/conn_scale.cpp): every connection
# must work, and each run prints the memory per connection on both sides.
# Usage: conn_scale.sh BUILD_DIR tcp|rdma [N]
#   rdma: inside the test guest, over rdma://$RDMX_GUEST_IP (rxe0)
set -u
build=$1; kind=$2; n=${3:-1024}
# Each connection holds a socket or QP and a completion channel on both sides.
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
if [ "$kind" = rdma ]; then
    addr="rdma://${RDMX_GUEST_IP:?not in the test guest}:0"
else
    addr="tcp://127.0.0.1:0"
fi
# One ping per connection, one connection at a time; then three rounds of pings on every
# connection at once, in mixed sizes, which one thread must all answer (none starves).
for run in "own" "shared" "shared --rounds 3 --together" "own --rounds 2 --together"; do
    # shellcheck disable=SC2086 # the run's words are options
    timeout 600 "$build/tests/conn_scale" "$addr" -n "$n" --queues $run || {
        echo "conn_scale: FAIL: $kind $run (exit $?)"; exit 1; }
done
