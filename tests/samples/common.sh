# Sourced by the sample scripts: failing with every log shown, and starting a server that
# prints "listening on ...". The caller sets `me` (its name in messages) and `out` (its log
# directory); `spid` is the server, `victims` and `others` more processes to kill on failure.
spid=; victims=; others=

fail() {
    echo "$me: FAIL: $*"
    for f in "$out"/*.log; do echo "--- $(basename "$f")"; sed 's/^/    /' "$f"; done
    for pid in $spid $victims $others; do kill -9 "$pid" 2>/dev/null; done
    exit 1
}

# start_server COMMAND...: runs it in the background with its output in $out/server.log
# (its pid in spid) and waits up to 30 s for its "listening" line.
start_server() {
    "$@" >"$out/server.log" 2>&1 &
    spid=$!
    i=0
    until grep -q listening "$out/server.log"; do
        i=$((i + 1)); [ $i -lt 300 ] || fail "server did not start"; sleep 0.1
        kill -0 $spid 2>/dev/null || fail "server exited"
    done
}

# The address the server printed after "listening on".
listening_address() {
    sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$out/server.log" | head -n 1
}
