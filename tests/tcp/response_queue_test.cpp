// The responses a TCP connection owes its peer (lib/tcp/tcp_response_queue.hpp): order,
// bounds, and the coalescing of cumulative ACKs.
#include <gtest/gtest.h>

#include "tcp/tcp_response_queue.hpp"

namespace rdmx::tcp
{
namespace
{

response nak(std::uint64_t seq)
{
    return {.op = frame_op::nak, .code = nak_code::rnr, .seq = seq, .data = {}};
}

TEST(tcp_response_queue, acks_coalesce_into_the_newest_ack)
{
    response_queue q(4);
    ASSERT_TRUE(q.push_ack(1, false));
    ASSERT_TRUE(q.push_ack(2, false));
    ASSERT_TRUE(q.push_ack(5, false));
    EXPECT_EQ(q.tail() - q.head(), 1u);
    EXPECT_EQ(q.at(q.head()).op, frame_op::ack);
    EXPECT_EQ(q.at(q.head()).seq, 5u);
    EXPECT_TRUE(q.only_acks());
}

TEST(tcp_response_queue, an_ack_partly_on_the_wire_is_not_changed)
{
    response_queue q(4);
    ASSERT_TRUE(q.push_ack(1, false));
    ASSERT_TRUE(q.push_ack(2, /*head_on_wire=*/true));
    ASSERT_EQ(q.tail() - q.head(), 2u);
    EXPECT_EQ(q.at(q.head()).seq, 1u);
    EXPECT_EQ(q.at(q.head() + 1).seq, 2u);
    // The newest is not the head: it may grow even while the head is on the wire.
    ASSERT_TRUE(q.push_ack(3, true));
    EXPECT_EQ(q.tail() - q.head(), 2u);
    EXPECT_EQ(q.at(q.head() + 1).seq, 3u);
}

TEST(tcp_response_queue, an_ack_after_a_nak_is_a_new_response)
{
    response_queue q(4);
    ASSERT_TRUE(q.push_ack(1, false));
    ASSERT_TRUE(q.push(nak(2)));
    EXPECT_FALSE(q.only_acks());
    ASSERT_TRUE(q.push_ack(3, false));
    ASSERT_EQ(q.tail() - q.head(), 3u);
    EXPECT_EQ(q.at(q.head() + 1).op, frame_op::nak);
    EXPECT_EQ(q.at(q.head() + 2).seq, 3u);
}

TEST(tcp_response_queue, bounded_in_order_and_across_the_wrap)
{
    response_queue q(2);
    for (std::uint64_t seq = 0; seq < 10; seq += 2) {
        ASSERT_TRUE(q.push(nak(seq)));
        ASSERT_TRUE(q.push(nak(seq + 1)));
        EXPECT_TRUE(q.full());
        EXPECT_FALSE(q.push(nak(99)));
        EXPECT_FALSE(q.push_ack(99, false)) << "an ACK cannot join a NAK: full";
        EXPECT_EQ(q.at(q.head()).seq, seq);
        q.pop();
        EXPECT_EQ(q.at(q.head()).seq, seq + 1);
        q.pop();
        EXPECT_TRUE(q.empty());
        EXPECT_TRUE(q.only_acks()) << "nothing owed";
    }
}

TEST(tcp_response_queue, drop_after_keeps_the_given_response_as_the_newest)
{
    response_queue q(4);
    ASSERT_TRUE(q.push(nak(1)));
    ASSERT_TRUE(q.push(nak(2)));
    ASSERT_TRUE(q.push(nak(3)));
    q.drop_after(q.head() + 1);
    EXPECT_EQ(q.tail() - q.head(), 2u);
    EXPECT_EQ(q.at(q.tail() - 1).seq, 2u);
}

} // namespace
} // namespace rdmx::tcp
