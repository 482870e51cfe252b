#!/usr/bin/env bash
# Two hosts for real: two QEMU guests (two kernels, each with its own rxe device on eth1)
# joined by a QEMU socket network that runs over 127.0.0.1 between the two QEMU processes.
# Guest A serves fault_peer instances (peer-agent.sh); guest B runs the fault suite
# (two-host-tests.sh). Exit status: guest B's.
# Usage: run-two-hosts.sh BUILD_DIR FAULT_TEST FAULT_PEER XML_DIR
set -euo pipefail
build=$1 test_bin=$2 peer_bin=$3 xml_dir=$4
here=$(cd "$(dirname "$0")" && pwd)
guest=$here/../guest/rxe-guest.sh
mkdir -p "$build/guest-scripts" "$xml_dir"
cp "$here/peer-agent.sh" "$here/two-host-tests.sh" "$build/guest-scripts/"
done_file=$build/guest-scripts/two-hosts.done
rm -f "$done_file"
# A free port on 127.0.0.1 for the QEMU socket network.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 20000)))

"$guest" --cache "$build/guest-cache" --share "$build" --timeout 700 --link "listen:$port:192.168.79.2" -- \
    sh "$build/guest-scripts/peer-agent.sh" "$peer_bin" "$done_file" 2>&1 | sed 's/^/[guest A] /' &
a=$!
# Guest B's QEMU connects to guest A's, and it must not start before A's QEMU listens:
# a QEMU whose connect is refused still boots, with a dead eth1 (the connect is
# non-blocking). A may wait minutes first, for the cache lock and an empty cache's
# kernel download, so wait for as long as A's side is alive (bounded by its timeout).
waited=0
until ss -ltn "sport = :$port" 2>/dev/null | grep -q LISTEN; do
    if ! kill -0 "$a" 2>/dev/null; then
        echo "run-two-hosts.sh: guest A ended before its QEMU listened on 127.0.0.1:$port" >&2
        exit 125
    fi
    if ((waited >= 7200)); then # 720 s: A's own --timeout is 700 s
        echo "run-two-hosts.sh: guest A's QEMU did not listen on 127.0.0.1:$port within 720 s" >&2
        kill "$a" 2>/dev/null
        exit 125
    fi
    sleep 0.1
    waited=$((waited + 1))
done
rc=0
"$guest" --cache "$build/guest-cache" --share "$build" --timeout 700 --link "connect:$port:192.168.79.1" -- \
    sh "$build/guest-scripts/two-host-tests.sh" "$test_bin" "$xml_dir" "$done_file" || rc=$?
touch "$done_file"
wait "$a" || true
exit "$rc"
