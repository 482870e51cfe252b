#!/bin/sh
# Guest B of the two-host fault run: the fault suite on both backends against the peers
# that guest A (another kernel, its own rxe1) serves on 192.168.79.2 over the QEMU socket
# link eth1. Writes DONE_FILE at the end so that guest A stops.
# Usage: two-host-tests.sh FAULT_TEST XML_DIR DONE_FILE
set -u
test_bin=$1; xml_dir=$2; done_file=$3
echo "[rdmx] fault suite across two guests: $RDMX_LINK_IP -> 192.168.79.2 (rxe1 on eth1 each)"
# Guest A boots at the same time: wait (bounded) until its eth1 answers, so that a dead
# link fails here, once and clearly, rather than as every test's connect timeout.
i=0
until busybox ping -c 1 -W 1 192.168.79.2 >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -ge 120 ]; then
        echo "[rdmx] two-host link: 192.168.79.2 (guest A) did not answer on eth1 in 120 tries" >&2
        touch "$done_file"
        exit 1
    fi
    sleep 1
done
# No default route: 10.255.255.1 is unroutable. 192.168.79.99 is on the link and nobody
# has it. The link is a socket between the two QEMU processes on 127.0.0.1: nothing else.
env RDMX_TEST_BACKENDS=tcp,verbs \
    RDMX_TEST_RDMA_ADDR="$RDMX_LINK_IP" \
    RDMX_FAULT_REMOTE_PORT_VERBS=7000 \
    RDMX_FAULT_REMOTE_PORT_TCP=7001 \
    RDMX_FAULT_PEER_ADDR=192.168.79.2 \
    RDMX_FAULT_LINK=eth1 \
    RDMX_FAULT_LINK_RDMA_DEVICE=rxe1 \
    RDMX_FAULT_UNUSED_ADDR=192.168.79.99 \
    RDMX_FAULT_NO_ROUTE_ADDR=10.255.255.1 \
    GTEST_OUTPUT="xml:$xml_dir/fault-two-hosts.xml" \
    taskset -c 0 "$test_bin"
rc=$?
touch "$done_file"
exit $rc
