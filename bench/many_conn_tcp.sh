#!/bin/sh
# Many connections from one thread, and event mode, on TCP loopback (issue 17): the rows of
# bench/compare.sh --many-conn without the rxe guest, in its regime (server on CPU 0,
# client on CPU 1, interleaved reps, load average per rep, ratio ranges by bootstrap).
# Usage: bench/many_conn_tcp.sh BUILD_DIR [REPS (5)] [NAME (<date>-many-conn)]
# BUILD_DIR is relative to the repository, as compare.sh's RDMX_BUILD_DIR; writes
# bench/results/NAME.md and .json. rdmx_perf -q 8 rows only: the connection count is fixed
# at 8 there, as the peers' rows (iperf3 -P 8, ucx_perftest -T 8) are.
set -eu
cd "$(dirname "$0")/.."
RDMX_BUILD_DIR=$1 exec bash bench/compare.sh --many-conn --no-guest --reps "${2:-5}" \
    --out "${3:-$(date +%Y-%m-%d)-many-conn}"
