// A TCP connection's send queue (lib/tcp/tcp_send_queue.hpp) without an engine: positions,
// slots, reads in flight, and the binds and invalidations that complete in posting order.
#include <gtest/gtest.h>

#include "tcp/tcp_send_queue.hpp"

namespace rdmx::tcp
{
namespace
{

void post(send_queue& q, std::uint64_t wr_id, rdmx::opcode op = opcode::write)
{
    q.at(q.tail()) = {};
    q.at(q.tail()).wr_id = wr_id;
    q.at(q.tail()).op = op;
    q.push();
}

TEST(tcp_send_queue, positions_move_from_posted_to_started_to_done)
{
    send_queue q(4, 2, 16);
    EXPECT_TRUE(q.empty());
    post(q, 1);
    post(q, 2);
    EXPECT_EQ(q.used(), 2u);
    EXPECT_TRUE(q.unstarted());
    EXPECT_FALSE(q.in_flight());
    q.start();
    EXPECT_TRUE(q.in_flight());
    EXPECT_EQ(q.next(), 1u);
    EXPECT_EQ(q.pop().wr_id, 1u);
    EXPECT_FALSE(q.in_flight());
    q.start();
    EXPECT_EQ(q.pop().wr_id, 2u);
    EXPECT_TRUE(q.empty());
    // The ring wraps: position 5 is slot 1, with its own SGEs and inline buffer.
    for (std::uint64_t i = 3; i <= 6; ++i)
        post(q, i);
    EXPECT_EQ(q.used(), 4u);
    EXPECT_EQ(&q.at(5), &q.at(1));
    EXPECT_EQ(q.segs(5), q.segs(1));
    EXPECT_EQ(q.segs(2) - q.segs(1), 2);
    EXPECT_EQ(q.inline_buf(6) - q.inline_buf(5), 16);
}

TEST(tcp_send_queue, reads_and_atomics_in_flight_are_counted_and_a_go_back_clears_them)
{
    send_queue q(8, 1, 0);
    post(q, 1, opcode::read);
    post(q, 2, opcode::write);
    post(q, 3, opcode::fetch_add);
    post(q, 4, opcode::compare_swap);
    q.start();
    q.start();
    q.start();
    EXPECT_EQ(q.reads_in_flight(), 2u); // the read and the fetch-add
    EXPECT_EQ(q.pop().wr_id, 1u);
    EXPECT_EQ(q.reads_in_flight(), 1u);
    // An RNR NAK of request 2 (position 1): it and everything after go again.
    q.go_back(1);
    EXPECT_EQ(q.next(), 1u);
    EXPECT_EQ(q.reads_in_flight(), 0u);
    q.start();
    q.start();
    q.start();
    EXPECT_EQ(q.reads_in_flight(), 2u);
    q.stop_sending();
    EXPECT_EQ(q.next(), q.tail());
    EXPECT_EQ(q.reads_in_flight(), 0u);
}

TEST(tcp_send_queue, a_local_operation_completes_after_the_requests_posted_before_it)
{
    send_queue q(4, 1, 0);
    // Nothing outstanding: its turn is now.
    EXPECT_FALSE(q.push_local(10, opcode::bind_window, true));
    EXPECT_EQ(q.used(), 0u);
    post(q, 1);
    ASSERT_TRUE(q.push_local(11, opcode::bind_window, true));
    post(q, 2);
    ASSERT_TRUE(q.push_local(12, opcode::invalidate_window, false));
    EXPECT_EQ(q.used(), 4u); // locals take slots
    send_queue::local_entry l;
    EXPECT_FALSE(q.pop_local_due(l)); // request 1 is still outstanding
    q.start();
    q.pop();
    ASSERT_TRUE(q.pop_local_due(l));
    EXPECT_EQ(l.wr_id, 11u);
    EXPECT_EQ(l.op, opcode::bind_window);
    EXPECT_FALSE(q.pop_local_due(l)); // 12 waits for request 2
    q.start();
    q.pop();
    ASSERT_TRUE(q.pop_local_due(l));
    EXPECT_EQ(l.wr_id, 12u);
    EXPECT_FALSE(l.signaled);
    EXPECT_EQ(q.used(), 0u);
}

} // namespace
} // namespace rdmx::tcp
