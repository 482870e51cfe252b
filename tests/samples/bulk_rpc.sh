#!/bin/sh
# The bulk RPC sample (Mercury's flow over an rdmx endpoint) under load: one single-threaded
# server, 8 clients PUTting and GETting objects of 4 KiB .. 1 MiB with 4 RPCs in flight each
# (every byte checked by the client), 2 more clients killed with SIGKILL mid-transfer, then
# new clients that still succeed, and a SHUTDOWN whose counters must add up.
# Usage: bulk_rpc.sh BUILD_DIR tcp|shm|rdma
#   tcp:  on this host, over tcp://127.0.0.1
#   shm:  on this host, over shm://bulk-rpc (docs/shm.md)
#   rdma: inside the test guest, over rdma://$RDMX_GUEST_IP (rxe0 or siw0)
set -u
build=$1; kind=$2
server=$build/samples/bulk_rpc_server
client=$build/samples/bulk_rpc_client
out=$(mktemp -d)
me=bulk_rpc
. "$(dirname "$0")/common.sh"
run_client() { # LOG ARGS...
    log=$1; shift
    timeout 180 "$client" "$caddr" "$@" >"$out/$log.log" 2>&1
}

if [ "$kind" = rdma ]; then
    addr="rdma://${RDMX_GUEST_IP:?not in the test guest}:7490"
elif [ "$kind" = shm ]; then
    addr="shm://bulk-rpc:0"
else
    addr="tcp://127.0.0.1:0"
fi
start_server "$server" "$addr"
caddr=$(listening_address)

good=""
for id in 1 2 3 4 5 6 7 8; do
    run_client "client$id" --id $id --objects 6 --rounds 2 --depth 4 &
    good="$good $!"
done
for id in 101 102; do
    "$client" "$caddr" --id $id --objects 8 --rounds 0 --depth 4 >"$out/victim$id.log" 2>&1 &
    victims="$victims $!"
done
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
    grep -q "bulk_rpc_client $id: done" "$out/client$id.log" || fail "client $id did not finish"
done
echo "bulk_rpc: $kind: 8 clients verified, 2 killed mid-transfer"

pids=""
for id in 201 202 203; do
    run_client "after$id" --id $id --objects 6 --rounds 1 &
    pids="$pids $!"
done
for pid in $pids; do
    wait "$pid" || fail "a client after the kills failed (exit $?)"
done
echo "bulk_rpc: $kind: after the kills, 3 new clients succeeded"

run_client shutdown --shutdown || fail "shutdown failed"
i=0
while kill -0 $spid 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "server did not exit after SHUTDOWN"; sleep 0.1
done
wait $spid || fail "server exited $?"
spid=
line=$(grep "done:" "$out/server.log") || fail "no counters"
num() { echo "$line" | sed -n "s/.* \([0-9]*\) $1.*/\1/p"; }
puts=$(num puts); gets=$(num gets); peers=$(num peers)
# 8 * 6 * 2 + 3 * 6 PUTs by the good clients, each GET back once.
[ "$puts" -ge 114 ] || fail "only $puts PUTs"
[ "$gets" -ge 114 ] || fail "only $gets GETs"
# 8 + 2 + 3 + the shutdown client: 14 processes. The server's address vector holds one
# peer per listener address, and a client that got the port of one that had exited is that
# peer again (a restart): so the peers are the distinct addresses the clients printed.
naddr=$(cat "$out"/*.log | grep -c ": endpoint ")
[ "$naddr" -eq 14 ] || fail "$naddr clients printed their address, expected 14"
distinct=$(sed -n 's/.*: endpoint \([^ ]*\)$/\1/p' "$out"/*.log | sort -u | wc -l)
[ "$peers" -eq "$distinct" ] || fail "$peers peers, expected $distinct (the clients' distinct addresses)"
[ "$distinct" -eq 14 ] || echo "bulk_rpc: $kind: $((14 - distinct)) client(s) got the port of one that had exited"
echo "bulk_rpc: $kind: server: $(echo "$line" | sed 's/.*done: //')"
rm -rf "$out"
