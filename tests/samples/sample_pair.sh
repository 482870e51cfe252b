#!/bin/sh
# Runs the sample client/server pair and checks what a user would look for: the greeting
# both ways, the verified bulk transfer, and clear failures on a bad address or a dead
# peer. Usage: sample_pair.sh BUILD_DIR tcp|shm|rdma
#   tcp:  on this host, over tcp://127.0.0.1
#   shm:  on this host, over shm://sample-pair (a UNIX socket, docs/shm.md)
#   rdma: inside the test guest, over rdma://$RDMX_GUEST_IP (rxe0), processes pinned to
#         different vCPUs (a busy poller sharing a vCPU stalls on the timer tick under TCG)
set -u
build=$1; kind=$2
server=$build/samples/rdmx_server
client=$build/samples/rdmx_client
out=$(mktemp -d)
fail() { echo "sample_pair: FAIL: $*"; sed 's/^/    /' "$out"/*.log; exit 1; }

if [ "$kind" = rdma ]; then
    addr="rdma://${RDMX_GUEST_IP:?not in the test guest}:7471"; pin_s="taskset -c 0"; pin_c="taskset -c 1"
elif [ "$kind" = shm ]; then
    addr="shm://sample-pair:0"; pin_s=""; pin_c=""
else
    addr="tcp://127.0.0.1:0"; pin_s=""; pin_c=""
fi

$pin_s "$server" "$addr" --count 1 >"$out/server.log" 2>&1 &
spid=$!
i=0
until grep -q listening "$out/server.log"; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "server did not start"; sleep 0.1
done
# Port 0 lets the server pick one: read it back from its first line.
port=$(sed -n 's/.*port \([0-9]*\)).*/\1/p' "$out/server.log" | head -n 1)
caddr=$(echo "$addr" | sed "s/:[0-9]*\$/:$port/")
$pin_c "$client" "$caddr" --size 1048576 >"$out/client.log" 2>&1 || fail "client exited $?"
wait $spid || fail "server exited $?"
grep -q 'server replied "Hello client, this is the server"' "$out/client.log" || fail "no reply"
grep -q 'received "Hello server, this is the client"' "$out/server.log" || fail "no greeting"
grep -q 'bulk transfer verified: 1048576 bytes' "$out/client.log" || fail "bulk not verified"
echo "sample_pair: $kind: greeting and 1 MiB bulk transfer verified over $caddr"

# A dead peer (the server is gone now) and a bad address fail clearly, in bounded time.
"$client" "$caddr" --timeout-ms 3000 >"$out/dead.log" 2>&1 && fail "connect to a dead peer succeeded"
grep -Eq 'cannot connect to .*(refused|timed out|unreachable)' "$out/dead.log" || fail "unclear dead-peer error"
"$client" "bogus://x" >"$out/bad.log" 2>&1 && fail "bad address accepted"
grep -q "bad address 'bogus://x'" "$out/bad.log" || fail "unclear bad-address error"
echo "sample_pair: $kind: dead peer -> $(cat "$out/dead.log")"
echo "sample_pair: $kind: bad address -> $(cat "$out/bad.log")"
rm -rf "$out"
