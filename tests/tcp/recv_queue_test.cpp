// A TCP connection's own receive queue (lib/tcp/tcp_recv_queue.hpp) without an engine.
#include <gtest/gtest.h>

#include "tcp/tcp_recv_queue.hpp"

namespace rdmx::tcp
{
namespace
{

TEST(tcp_recv_queue, receives_are_consumed_in_posting_order_around_the_ring)
{
    recv_queue q(2, 3);
    EXPECT_TRUE(q.empty());
    for (std::uint64_t id = 1; id <= 5; ++id) {
        q.back() = {.wr_id = id, .length = id * 10, .nseg = 1};
        q.back_segs()[0].len = id * 10;
        q.push();
        EXPECT_EQ(q.size(), 1u);
        EXPECT_EQ(q.front().wr_id, id);
        EXPECT_EQ(q.front_segs()[0].len, id * 10);
        EXPECT_EQ(q.pop().length, id * 10);
        EXPECT_TRUE(q.empty());
    }
    q.back().wr_id = 6;
    q.push();
    EXPECT_NE(q.back_segs(), q.front_segs());      // the next slot, with SGEs of its own
    EXPECT_EQ(q.back_segs() - q.front_segs(), -3); // 6 is in slot 1, 7 goes to slot 0
    q.back().wr_id = 7;
    q.push();
    EXPECT_EQ(q.size(), 2u); // full: back() is not to be used until a pop
    EXPECT_EQ(q.pop().wr_id, 6u);
    EXPECT_EQ(q.pop().wr_id, 7u);
}

TEST(tcp_recv_queue, a_connection_on_a_shared_receive_queue_has_an_empty_one)
{
    recv_queue q(0, 0);
    EXPECT_TRUE(q.empty());
    EXPECT_EQ(q.size(), 0u);
}

} // namespace
} // namespace rdmx::tcp
