// The TCP backend's completion ring and notification arming (lib/tcp/tcp_completion.hpp).
#include <gtest/gtest.h>

#include <array>

#include <rdmx/error.hpp>

#include "tcp/tcp_completion.hpp"

namespace rdmx::tcp
{
namespace
{

completion make(std::uint64_t id, rdmx::opcode op = opcode::send)
{
    return {.wr_id = id, .opcode = op, .status = {}};
}

TEST(tcp_completion_ring, fifo_across_the_wrap)
{
    completion_ring r(3);
    std::array<completion, 4> out{};
    std::uint64_t next_in = 0, next_out = 0;
    for (int round = 0; round < 5; ++round) {
        ASSERT_TRUE(r.push(make(next_in++)));
        ASSERT_TRUE(r.push(make(next_in++)));
        ASSERT_EQ(r.size(), 2u);
        std::size_t n = r.pop(out);
        ASSERT_EQ(n, 2u);
        for (std::size_t i = 0; i < n; ++i)
            EXPECT_EQ(out[i].wr_id, next_out++);
        EXPECT_TRUE(r.empty());
    }
}

TEST(tcp_completion_ring, full_refuses_and_keeps_what_it_has)
{
    completion_ring r(2);
    EXPECT_EQ(r.capacity(), 2u);
    ASSERT_TRUE(r.push(make(1)));
    ASSERT_TRUE(r.push(make(2)));
    EXPECT_TRUE(r.full());
    EXPECT_FALSE(r.push(make(3)));
    std::array<completion, 1> one{};
    ASSERT_EQ(r.pop(one), 1u);
    EXPECT_EQ(one[0].wr_id, 1u);
    ASSERT_TRUE(r.push(make(4)));
    std::array<completion, 4> out{};
    ASSERT_EQ(r.pop(out), 2u);
    EXPECT_EQ(out[0].wr_id, 2u);
    EXPECT_EQ(out[1].wr_id, 4u);
    EXPECT_EQ(r.pop(out), 0u);
    EXPECT_EQ(r.pop(std::span<completion>{}), 0u);
}

TEST(tcp_notify_arm, unarmed_never_fires)
{
    notify_arm n;
    EXPECT_FALSE(n.armed());
    EXPECT_FALSE(n.fire(make(1, opcode::recv), true));
}

TEST(tcp_notify_arm, any_fires_once_on_the_next_completion)
{
    notify_arm n;
    n.arm(false);
    EXPECT_TRUE(n.armed());
    EXPECT_TRUE(n.fire(make(1, opcode::write), false));
    EXPECT_FALSE(n.armed());
    EXPECT_FALSE(n.fire(make(2, opcode::write), false));
}

TEST(tcp_notify_arm, solicited_only_fires_on_solicited_receives_and_errors)
{
    notify_arm n;
    n.arm(true);
    EXPECT_FALSE(n.fire(make(1, opcode::send), true)) << "a send completion is no solicited event";
    EXPECT_FALSE(n.fire(make(2, opcode::recv), false)) << "unsolicited receive";
    EXPECT_TRUE(n.armed());
    EXPECT_TRUE(n.fire(make(3, opcode::recv_with_imm), true));
    EXPECT_FALSE(n.armed());
    n.arm(true);
    completion err{.wr_id = 4, .opcode = opcode::unknown, .status = errc::flushed};
    EXPECT_TRUE(n.fire(err, false)) << "an error wakes a solicited-only waiter";
}

} // namespace
} // namespace rdmx::tcp
