#!/bin/sh
# rdmx_ep_service (samples/asio_ep_service.cpp) as a user runs it: the service on one thread,
# 4 clients (tests/endpoint_peer rpc: requests of 1 B .. 300 kB, every byte of every echo
# checked), one more client killed with SIGKILL mid-run, a flooder of tags the service
# drops; then SIGTERM, and the service's counters must add up. Over TCP on this host; the
# same service runs on rxe and siw in asio_endpoint_service (conformance).
# Usage: ep_service.sh BUILD_DIR
set -u
build=$1
server=$build/samples/rdmx_ep_service
peer=$build/tests/endpoint_peer
out=$(mktemp -d)
me=ep_service
. "$(dirname "$0")/common.sh"

start_server "$server" tcp://127.0.0.1:0
addr=$(listening_address)

good=""
for id in 1 2 3 4; do
    timeout 180 "$peer" tcp://127.0.0.1:0 rpc "$addr" $id 60 >"$out/client$id.log" 2>&1 &
    good="$good $!"
done
"$peer" tcp://127.0.0.1:0 rpc "$addr" 100 100000 >"$out/victim.log" 2>&1 &
victim=$!
"$peer" tcp://127.0.0.1:0 flood "$addr" 2000 >"$out/flooder.log" 2>&1 &
flooder=$!
others="$victim $flooder"
i=0
until [ "$(tr -cd . <"$out/victim.log" | wc -c)" -ge 3 ]; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "the victim made no progress"; sleep 0.1
done
kill -9 $victim
for pid in $good; do
    wait "$pid" || fail "a client failed (exit $?)"
done
for id in 1 2 3 4; do
    [ "$(tr -cd . <"$out/client$id.log" | wc -c)" -eq 60 ] || fail "client $id did not get 60 echoes"
done
kill -9 $flooder
wait $victim $flooder 2>/dev/null
others=
kill -TERM $spid
i=0
while kill -0 $spid 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the service did not exit after SIGTERM"; sleep 0.1
done
wait $spid || fail "the service exited $?"
spid=
line=$(grep "done:" "$out/server.log") || fail "no counters"
served=$(echo "$line" | sed -n 's/.*done: \([0-9]*\) served.*/\1/p')
down=$(echo "$line" | sed -n 's/.* \([0-9]*\) peers down.*/\1/p')
# 4 x 60 echoes at least (a client resends a request whose echo was lost with a restart;
# none here, but a resend is served again), and the killed client and the flooder retired.
[ "$served" -ge 240 ] || fail "only $served served"
[ "$down" -ge 1 ] || fail "the killed client was not retired (peer_down)"
echo "ep_service: tcp: 4 clients verified, 1 killed, 1 flooder; service: $(echo "$line" | sed 's/.*done: //')"
rm -rf "$out"
