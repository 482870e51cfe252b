// The responses a TCP connection owes its peer (lib/tcp/tcp_response_queue.hpp): order,
// bounds, the coalescing of cumulative ACKs, and how long a shared queue's poller holds
// one (ack_hold).
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

TEST(tcp_ack_hold, a_visit_that_carried_out_requests_holds_the_ack_and_starts_the_count_over)
{
    ack_hold h;
    EXPECT_TRUE(h.may_wait(false, true, true, false)); // one idle visit of the pending list
    EXPECT_EQ(h.idle_visits(), 1);
    EXPECT_TRUE(h.may_wait(true, false, true, false)); // a socket visit that read requests
    EXPECT_EQ(h.idle_visits(), 0);
    EXPECT_TRUE(h.may_wait(true, true, true, true));
    EXPECT_EQ(h.idle_visits(), 0);
}

TEST(tcp_ack_hold, an_idle_queue_sends_at_the_second_idle_visit)
{
    ack_hold h;
    EXPECT_TRUE(h.may_wait(true, false, true, false));
    EXPECT_TRUE(h.may_wait(false, true, true, false));
    EXPECT_FALSE(h.may_wait(false, true, true, false)) << "a sender waiting for it is answered";
    h.sent();
    EXPECT_EQ(h.idle_visits(), 0);
    EXPECT_TRUE(h.may_wait(false, true, true, false)) << "counted again from the send";
}

TEST(tcp_ack_hold, a_busy_queue_holds_it_for_busy_visits_minus_one_idle_visits)
{
    ack_hold h;
    for (int i = 1; i < ack_hold::busy_visits; ++i)
        EXPECT_TRUE(h.may_wait(false, true, true, true)) << i;
    EXPECT_FALSE(h.may_wait(false, true, true, true));
    // The count is of visits in a row: a busy run after an idle one counts on.
    h.sent();
    EXPECT_TRUE(h.may_wait(false, true, true, false));
    EXPECT_TRUE(h.may_wait(false, true, true, true)) << "2nd idle visit, but the last run was busy";
    EXPECT_FALSE(h.may_wait(false, true, true, false)) << "3rd, the last run idle";
}

TEST(tcp_ack_hold, only_the_pending_list_holds_without_news_and_only_what_is_owed)
{
    ack_hold h;
    EXPECT_FALSE(h.may_wait(false, false, true, true)) << "a socket or ring visit that brought nothing";
    EXPECT_FALSE(h.may_wait(false, true, false, true)) << "nothing owed: nothing to hold";
    EXPECT_TRUE(h.may_wait(true, false, false, false)) << "fresh requests: their ACK is coming";
}

} // namespace
} // namespace rdmx::tcp
