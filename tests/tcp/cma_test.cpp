// Cross-memory attach on shm:// between two processes (lib/tcp/tcp_cma.cpp): one-sided data
// that the target moves itself where the kernel lets it reach the initiator's memory, and
// through the socket, with the same results, where it does not.
#include <sys/prctl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

#include "common/test_util.hpp"
#include "tcp/cma_target_link.hpp"
#include "tcp/tcp_engine.hpp"

namespace rdmx::test
{
namespace
{

constexpr std::size_t mib = 1 << 20;

std::string target_address()
{
    static int n = 0;
    return "shm://cma-" + std::to_string(::getpid()) + ":" + std::to_string(7000 + n++);
}

/// What one run saw: CMA requests completed, refusals received.
struct cma_counts {
    std::uint64_t completed = 0;
    std::uint64_t refusals = 0;
};

/// Against a cma_target in `mode`: a 1 MiB write from three SGEs, a 1 MiB read back into two,
/// a 4 KiB write (below tcp::connection_engine::cma_min_bytes), and a 256 KiB send into the
/// receive it posted over the region's start, read back; every byte checked.
void write_and_read_back(const std::string& mode, cma_counts& seen)
{
    cma_target_link t;
    ASSERT_NO_FATAL_FAILURE(open_cma_target(target_address(), mode, t));
    ASSERT_EQ(t.region.length, mib);

    std::vector<std::byte> src(mib), back(mib, std::byte{0});
    for (std::size_t i = 0; i < mib; ++i)
        src[i] = static_cast<std::byte>((i * 7 + i / 4096) & 0xff);
    auto ms = t.dom->register_memory(src.data(), src.size(), access::local_write);
    auto mb = t.dom->register_memory(back.data(), back.size(), access::local_write);
    const std::uint64_t done0 = tcp::cma_requests_completed();
    const std::uint64_t refused0 = tcp::cma_refusals();

    const sge w[3] = {{ms.get(), 0, 100000}, {ms.get(), 100000, 500000}, {ms.get(), 600000, mib - 600000}};
    ASSERT_FALSE(t.conn->post_write(w, t.region, 1));
    expect_ok(*t.conn, 1);
    const sge r[2] = {{mb.get(), 0, 300000}, {mb.get(), 300000, mib - 300000}};
    ASSERT_FALSE(t.conn->post_read(r, t.region, 2));
    expect_ok(*t.conn, 1);
    EXPECT_EQ(std::memcmp(src.data(), back.data(), mib), 0) << "the 1 MiB read back differs from the write";

    // Below the CMA size: in the frames, whatever the peer can reach.
    std::memset(back.data(), 0, 4096);
    const std::uint64_t done1 = tcp::cma_requests_completed();
    const sge small{ms.get(), mib - 4096, 4096};
    ASSERT_FALSE(t.conn->post_write({&small, 1}, t.region, 3));
    expect_ok(*t.conn, 1);
    const sge small_back{mb.get(), 0, 4096};
    ASSERT_FALSE(t.conn->post_read({&small_back, 1}, *t.region.slice(0, 4096), 4));
    expect_ok(*t.conn, 1);
    EXPECT_EQ(std::memcmp(src.data() + mib - 4096, back.data(), 4096), 0);
    EXPECT_EQ(tcp::cma_requests_completed(), done1) << "a 4 KiB request went by CMA";

    constexpr std::size_t msg = 256 * 1024;
    for (std::size_t i = 0; i < msg; ++i)
        src[i] = static_cast<std::byte>((i * 11 + 3) & 0xff);
    const sge m[2] = {{ms.get(), 0, 1000}, {ms.get(), 1000, msg - 1000}};
    ASSERT_FALSE(t.conn->post_send(m, 5));
    expect_ok(*t.conn, 1);
    std::memset(back.data(), 0, msg);
    const sge mback{mb.get(), 0, msg};
    ASSERT_FALSE(t.conn->post_read({&mback, 1}, *t.region.slice(0, msg), 6));
    expect_ok(*t.conn, 1);
    EXPECT_EQ(std::memcmp(src.data(), back.data(), msg), 0) << "the 256 KiB send did not land in the receive";

    seen = {tcp::cma_requests_completed() - done0, tcp::cma_refusals() - refused0};
    t.conn->disconnect();
    EXPECT_EQ(t.child->wait(), 0) << "cma_target did not see a clean disconnect";
}

TEST(cma, a_peer_that_can_reach_this_process_moves_the_data_itself)
{
    cma_counts seen;
    ASSERT_NO_FATAL_FAILURE(write_and_read_back("reach", seen));
    EXPECT_EQ(seen.completed, 4u)
        << "the 1 MiB write and read, the send and its read-back did not all go by CMA";
    EXPECT_EQ(seen.refusals, 0u);
}

TEST(cma, a_peer_that_cannot_reach_this_process_gets_the_data_through_the_socket)
{
    // As root the target drops to another user (cma_target); otherwise the kernel refuses
    // it because this process is not dumpable meanwhile (ptrace access rules).
    const int dumpable = ::prctl(PR_GET_DUMPABLE);
    if (::geteuid() != 0) {
        ASSERT_EQ(::prctl(PR_SET_DUMPABLE, 0), 0) << std::strerror(errno);
    }
    cma_counts seen;
    write_and_read_back("unreachable", seen);
    if (::geteuid() != 0)
        ::prctl(PR_SET_DUMPABLE, dumpable);
    EXPECT_EQ(seen.refusals, 1u) << "the first CMA request was not refused, or later ones were tried again";
    EXPECT_EQ(seen.completed, 0u) << "a CMA request completed although the peer cannot reach this process";
}

} // namespace
} // namespace rdmx::test
