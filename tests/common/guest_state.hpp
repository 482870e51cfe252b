// What a test prints when connections stall inside a QEMU guest of tests/guest/: the
// kernel's view of them (TCP sockets, siw's included; rdma_cm ids with their states; QPs),
// for a failure that rdmx's own logs cannot explain. Nothing outside a guest: the host's
// sockets are not the test's to list.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace rdmx::test
{

/// Prints, once per call and only inside a guest (RDMX_GUEST_IP set), `ss -tanoi`,
/// `rdma res show cm_id` and `rdma res show qp` under a heading naming `why`.
inline void print_guest_state(const char* why)
{
    if (!std::getenv("RDMX_GUEST_IP"))
        return;
    std::printf("[ guest    ] %s: the kernel's connections follow\n", why);
    std::fflush(stdout);
    [[maybe_unused]] int rc =
        std::system("echo '--- ss -tanoi'; ss -tanoi 2>&1; echo '--- rdma res show cm_id'; "
                    "rdma res show cm_id 2>&1; echo '--- rdma res show qp'; rdma res show "
                    "qp 2>&1; echo '--- end'");
    std::fflush(stdout);
}

} // namespace rdmx::test
