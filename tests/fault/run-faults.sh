#!/bin/sh
# Inside the test guest: runs the fault suite on both backends, in two set-ups.
#
# TCP: two "hosts" for real, network namespaces ns1 and ns2 joined by a veth pair; the
# suite runs in ns1 against fault_peer processes in ns2, and cuts or degrades the veth.
#
# verbs: on rxe0 (eth0, 192.168.77.1), both processes in the guest's own namespace. The
# guest kernel (Debian 12, Linux 6.1) has no network-namespace support in rdma_rxe: its
# UDP socket exists in the initial namespace only, so rxe devices on veths in ns1/ns2
# cannot reach each other (rdma_connect ends in RDMA_CM_EVENT_UNREACHABLE). Between two
# addresses of one namespace rxe short-cuts through its loopback, never the netdev, so
# link-down and netem cannot touch it either: those two tests are skipped for verbs, with
# that reason. Kill, stop, refused, silent and unroutable peers run for real.
#
# Usage: run-faults.sh FAULT_TEST FAULT_PEER XML_DIR
set -eu
test_bin=$1; peer_bin=$2; xml_dir=$3

ip netns add ns1
ip netns add ns2
ip link add veth1 type veth peer name veth2
ip link set veth1 netns ns1
ip link set veth2 netns ns2
ip -n ns1 addr add 192.168.78.1/24 dev veth1
ip -n ns2 addr add 192.168.78.2/24 dev veth2
for ns in ns1 ns2; do ip -n $ns link set lo up; done
ip -n ns1 link set veth1 up
ip -n ns2 link set veth2 up

# ns1 has no default route: 10.255.255.1 is unroutable there, and 192.168.78.99 is on the
# veth link with nobody behind it. No packet can leave the guest either way. The two
# busy processes are pinned to different vCPUs: under TCG a busy poller sharing a vCPU
# with its peer stalls on the timer tick.
rc=0
echo "[rdmx] fault suite, TCP backend: ns1 -> ns2 over veth1/veth2"
ip netns exec ns1 env \
    RDMX_TEST_BACKENDS=tcp \
    RDMX_FAULT_PEER="$peer_bin" \
    RDMX_FAULT_PEER_PREFIX="ip netns exec ns2 taskset -c 1" \
    RDMX_FAULT_PEER_ADDR=192.168.78.2 \
    RDMX_FAULT_LINK=veth1 \
    RDMX_FAULT_PEER_LINK=veth2 \
    RDMX_FAULT_UNUSED_ADDR=192.168.78.99 \
    RDMX_FAULT_NO_ROUTE_ADDR=10.255.255.1 \
    GTEST_OUTPUT="xml:$xml_dir/fault-tcp.xml" \
    taskset -c 0 "$test_bin" || rc=1

# The guest has no default route either; 192.168.77.99 is on eth0, whose user-mode
# network is restricted (nothing leaves QEMU) and has nobody at that address.
echo "[rdmx] fault suite, verbs backend: rxe0 (192.168.77.1), peer in the same namespace"
env RDMX_TEST_BACKENDS=verbs \
    RDMX_TEST_RDMA_ADDR=192.168.77.1 \
    RDMX_FAULT_PEER="$peer_bin" \
    RDMX_FAULT_PEER_PREFIX="taskset -c 1" \
    RDMX_FAULT_PEER_ADDR=192.168.77.1 \
    RDMX_FAULT_NO_LINK_REASON="rdma_rxe in this guest kernel (6.1) has no netns support, and rxe between local addresses never touches the netdev: no link to cut or degrade" \
    RDMX_FAULT_UNUSED_ADDR=192.168.77.99 \
    RDMX_FAULT_NO_ROUTE_ADDR=10.255.255.1 \
    GTEST_OUTPUT="xml:$xml_dir/fault-verbs.xml" \
    taskset -c 0 "$test_bin" || rc=1
exit $rc
