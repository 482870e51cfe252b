# Shared by the bench scripts (sourced): one rdmx_perf pair, pinned.
# rdmx_pair ADDRESS TEST ARGS...: the server on CPU 0 at ADDRESS (port 0: it picks one and
# says which), the client on CPU 1 at the port the server took; prints the client's rows.
# Needs $perf (rdmx_perf) and $log (a file for the server's output).
rdmx_pair() {
    _a=$1; _t=$2; shift 2
    "$perf" --server --cpu 0 -t "$_t" "$@" "$_a" >"$log" 2>&1 &
    _i=0
    until grep -q listening "$log"; do
        _i=$((_i + 1)); [ $_i -lt 100 ] || { cat "$log"; exit 1; }; sleep 0.1
    done
    _port=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$log" | head -n 1)
    "$perf" --cpu 1 -t "$_t" "$@" "$(echo "$_a" | sed "s/:0\$/:$_port/")" | grep -E '^ *[0-9]'
    wait
}
