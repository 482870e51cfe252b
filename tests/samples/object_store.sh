#!/bin/sh
# The object-store sample under load: one single-threaded server, 8 clients PUTting and
# GETting objects of 4 KiB .. 1 MiB (every byte checked by the client), 3 more clients
# killed with SIGKILL in the middle of their transfers, and afterwards new clients that
# still PUT, GET and verify, and verifiers that read back what the first 8 stored; then 4
# clients racing to add 25 versions each to one shared key by compare-and-swap of its
# version word (no update may be lost: it ends at version 100). Then a SHUTDOWN RPC: the
# server must exit 0 and its counters must add up. Where the device has memory windows
# every request's buffer is a window the server's reply revokes (the clients check).
# Usage: object_store.sh BUILD_DIR tcp|shm|rdma   (OBJECT_STORE_SERVER_ARGS: more server options, e.g. --no-srq)
#   tcp:  on this host, over tcp://127.0.0.1
#   shm:  on this host, over shm://object-store (docs/shm.md)
#   rdma: inside the test guest, over rdma://$RDMX_GUEST_IP (rxe0 or siw0)
set -u
build=$1; kind=$2
server=$build/samples/object_store_server
client=$build/samples/object_store_client
out=$(mktemp -d)
me=object_store
. "$(dirname "$0")/common.sh"
# Every client is bounded: a hang is a failure, not a stuck test.
run_client() { # LOG ARGS...
    log=$1; shift
    timeout 180 "$client" "$caddr" "$@" >"$out/$log.log" 2>&1
}

if [ "$kind" = rdma ]; then
    addr="rdma://${RDMX_GUEST_IP:?not in the test guest}:7480"
elif [ "$kind" = shm ]; then
    addr="shm://object-store:0"
else
    addr="tcp://127.0.0.1:0"
fi

start_server "$server" "$addr" --max-clients 32 ${OBJECT_STORE_SERVER_ARGS:-}
port=$(sed -n 's/.*port \([0-9]*\)).*/\1/p' "$out/server.log" | head -n 1)
caddr=$(echo "$addr" | sed "s/:[0-9]*\$/:$port/")

# 1. Eight clients, 6 objects each (mixed sizes), two rounds; three victims that loop.
good=""
for id in 1 2 3 4 5 6 7 8; do
    run_client "client$id" --id $id --objects 6 --rounds 2 &
    good="$good $!"
done
for id in 101 102 103; do
    # Not under `timeout`: $! must be the client itself, for kill -9.
    "$client" "$caddr" --id $id --objects 8 --rounds 0 >"$out/victim$id.log" 2>&1 &
    victims="$victims $!"
done
# Kill each victim once it has finished a round, so that it is busy transferring; the
# next round's first PUTs and GETs are in flight at that moment.
n=0
for pid in $victims; do
    id=$((101 + n)); n=$((n + 1)); i=0
    until grep -q "round 0" "$out/victim$id.log" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 1200 ] || fail "victim $id made no progress"; sleep 0.1
    done
    sleep 0.$((n * 2))
    kill -9 "$pid" 2>/dev/null || fail "victim $id had already exited"
done
for pid in $good; do
    wait "$pid" || fail "a client failed (exit $?)"
done
for pid in $victims; do wait "$pid" 2>/dev/null; done
for id in 1 2 3 4 5 6 7 8; do
    grep -q "client $id: done" "$out/client$id.log" || fail "client $id did not finish"
done
echo "object_store: $kind: 8 clients verified, 3 killed mid-transfer"

# 2. The server keeps serving: new clients, and the first clients' objects read back.
pids=""
for id in 201 202 203; do
    run_client "after$id" --id $id --objects 6 --rounds 1 &
    pids="$pids $!"
done
for id in 1 2 3 4 5 6 7 8; do
    run_client "verify$id" --id $id --objects 6 --verify-version 1 &
    pids="$pids $!"
done
for pid in $pids; do
    wait "$pid" || fail "a client after the kills failed (exit $?)"
done
for id in 1 2 3 4 5 6 7 8; do
    grep -q "verified 6 objects of version 1" "$out/verify$id.log" || fail "objects of client $id lost"
done
echo "object_store: $kind: after the kills, 3 new clients and 8 verifiers succeeded"

# 3. One key, four writers: each increment is GET, compare-and-swap, PUT; lost races retry.
run_client create --id 300 --create-shared || fail "creating the shared key failed"
pids=""
for id in 301 302 303 304; do
    run_client "inc$id" --id $id --increment 25 &
    pids="$pids $!"
done
for pid in $pids; do
    wait "$pid" || fail "an incrementing client failed (exit $?)"
done
run_client verify-shared --id 0 --objects 1 --verify-version 100 || fail "the shared key is not at version 100"
races=0
for n in $(sed -n 's/.*times, \([0-9]*\) races lost.*/\1/p' "$out"/inc*.log); do races=$((races + n)); done
echo "object_store: $kind: 4 writers x 25 increments of one key: version 100, $races races lost and retried"

# 4. SHUTDOWN: the server exits 0, within bounded time, with counters that add up.
run_client shutdown --shutdown || fail "shutdown failed"
i=0
while kill -0 $spid 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "server did not exit after SHUTDOWN"; sleep 0.1
done
wait $spid || fail "server exited $?"
spid=
line=$(grep "done: accepted" "$out/server.log") || fail "no counters"
num() { echo "$line" | sed -n "s/.* $1 \([0-9]*\).*/\1/p"; }
accepted=$(num accepted); closed=$(num closed); lost=$(num lost); puts=$(num puts); gets=$(num gets)
open=$(num open)
# 29 connections: 8 + 3 victims + 3 new + 8 verifiers + 6 of the shared key + the shutdown
# client.
[ "$accepted" -eq 29 ] || fail "accepted $accepted connections, expected 29"
[ $((closed + lost + open)) -eq "$accepted" ] || fail "closed + lost + open != accepted"
# Clean ones: 8 + 3 + 8 + 6 that disconnected (the shutdown client may still be open).
[ "$closed" -ge 25 ] || fail "only $closed clean disconnects"
# The victims died: they are lost (a crash), or closed where the kernel's clean-up of the
# dead process disconnects in its name; either way none is left open.
[ "$open" -le 1 ] || fail "$open connections left open"
# PUTs stored by the good clients alone: 8 * 6 * 2 + 3 * 6, each verified by 2 GETs; and
# the shared key's 1 + 100, each increment after a GET.
[ "$puts" -ge $((114 + 101)) ] || fail "only $puts PUTs"
[ "$gets" -ge $((114 * 2 + 48 + 100 + 1)) ] || fail "only $gets GETs"
echo "object_store: $kind: server: $(echo "$line" | sed 's/.*done: //')"
rm -rf "$out"
