#!/bin/sh
# Guest A of the two-host fault run: keeps one fault_peer listening per backend on
# eth1 (192.168.79.2), starting a fresh one whenever the last one ended (the tests kill,
# stop or disconnect it). A peer that has been stopped (SIGSTOP) for 5 s is killed, so
# that the next test gets a fresh one. Stops when DONE_FILE appears (guest B writes it)
# or after 600 s.
# Usage: peer-agent.sh FAULT_PEER DONE_FILE
set -u
peer=$1; done_file=$2
export RDMX_FAULT_PEER_LINK=eth1
serve() { # ADDRESS
    while [ ! -e "$done_file" ]; do
        tc qdisc del dev eth1 root 2>/dev/null # a failed test may have left netem behind
        timeout -s KILL 300 taskset -c 1 "$peer" "$1" 64 >/dev/null 2>&1
    done
}
serve "rdma://$RDMX_LINK_IP:7000" &
serve "tcp://$RDMX_LINK_IP:7001" &
echo "[rdmx] two-host peer agent up on $RDMX_LINK_IP (rxe1 on eth1)"
i=0
while [ ! -e "$done_file" ] && [ $i -lt 600 ]; do
    sleep 1
    i=$((i + 1))
    for pid in $(pgrep -f "$peer"); do
        [ "$(cut -d' ' -f3 /proc/"$pid"/stat 2>/dev/null)" = T ] || continue
        n=$(($(cat /tmp/stopped.$pid 2>/dev/null || echo 0) + 1))
        echo $n >/tmp/stopped.$pid
        [ $n -lt 5 ] || kill -KILL "$pid"
    done
done
pkill -KILL -f "$peer" 2>/dev/null
echo "[rdmx] two-host peer agent done"
exit 0
