// A connection's claim on its shared receive queue (lib/tcp/tcp_srq_claim.hpp), on a real
// TCP domain's queue without an engine: the receive taken is the oldest posted and stays
// the connection's until completed, an empty queue is receiver-not-ready, the queue's room
// comes back only when a completion is retired, and a released claim touches the queue no
// more.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <memory>

#include <rdmx/rdmx.hpp>

#include "tcp/tcp_srq.hpp"
#include "tcp/tcp_srq_claim.hpp"

namespace rdmx::test
{
namespace
{

using tcp::srq_claim;

class tcp_srq_claim : public testing::Test
{
protected:
    void SetUp() override
    {
        dom_ = domain::open("tcp://127.0.0.1:0");
        mr_ = dom_->register_memory(mem_.data(), mem_.size(), access::local_write);
        shared_receive_queue_options o;
        o.depth = 4;
        o.max_sge = 2;
        q_ = dom_->create_shared_receive_queue(o);
        srq_ = dynamic_cast<tcp::tcp_srq*>(q_.get());
        ASSERT_NE(srq_, nullptr);
    }
    /// Posts receive `wr_id` of two SGEs: 16 bytes at 64 * wr_id, and `second` more after.
    std::error_code post(std::uint64_t wr_id, std::size_t second = 8)
    {
        std::array<sge, 2> s{sge{mr_.get(), 64 * wr_id, 16}, sge{mr_.get(), 64 * wr_id + 16, second}};
        return q_->post_recv(s, wr_id);
    }

    std::array<std::byte, 4096> mem_{};
    std::unique_ptr<domain> dom_;
    std::unique_ptr<memory_region> mr_;
    std::shared_ptr<shared_receive_queue> q_;
    tcp::tcp_srq* srq_ = nullptr;
};

TEST_F(tcp_srq_claim, without_a_queue_it_is_none_and_never_ready)
{
    srq_claim c(nullptr);
    EXPECT_EQ(c.current(), srq_claim::state::none);
    EXPECT_FALSE(c.shared());
    EXPECT_FALSE(c.ready());
    c.retire(3); // no queue: nothing to give back, and no crash
    EXPECT_EQ(c.queue(), nullptr);
}

TEST_F(tcp_srq_claim, takes_the_oldest_and_keeps_it_until_completed)
{
    srq_claim c(srq_);
    EXPECT_EQ(c.current(), srq_claim::state::idle);
    ASSERT_FALSE(post(1, 8));
    ASSERT_FALSE(post(2, 24));
    ASSERT_TRUE(c.ready());
    EXPECT_EQ(c.current(), srq_claim::state::held);
    EXPECT_EQ(c.head().wr_id, 1u);
    EXPECT_EQ(c.head().length, 24u);
    ASSERT_EQ(c.head().nseg, 2u);
    EXPECT_EQ(c.segs()[0].ptr, mem_.data() + 64);
    EXPECT_EQ(c.segs()[1].ptr, mem_.data() + 80);
    EXPECT_EQ(c.segs()[1].len, 8u);
    // Asked again before its frame completed it: the same receive, the second stays posted.
    ASSERT_TRUE(c.ready());
    EXPECT_EQ(c.head().wr_id, 1u);
    c.completed();
    EXPECT_EQ(c.current(), srq_claim::state::idle);
    ASSERT_TRUE(c.ready());
    EXPECT_EQ(c.head().wr_id, 2u);
    EXPECT_EQ(c.head().length, 40u);
}

TEST_F(tcp_srq_claim, an_empty_queue_is_not_ready_until_a_receive_is_posted)
{
    srq_claim c(srq_);
    EXPECT_FALSE(c.ready());
    EXPECT_EQ(c.current(), srq_claim::state::idle);
    ASSERT_FALSE(post(3));
    ASSERT_TRUE(c.ready());
    EXPECT_EQ(c.head().wr_id, 3u);
    c.completed();
    EXPECT_FALSE(c.ready()) << "the one receive was taken";
}

TEST_F(tcp_srq_claim, a_taken_receive_holds_its_room_until_its_completion_is_retired)
{
    srq_claim c(srq_);
    for (std::uint64_t i = 1; i <= 4; ++i)
        ASSERT_FALSE(post(i));
    EXPECT_EQ(post(5), errc::would_block) << "depth 4";
    ASSERT_TRUE(c.ready());
    c.completed(); // its completion is in a queue, not polled yet
    EXPECT_EQ(post(5), errc::would_block) << "taken is not polled: the room is still used";
    c.retire(1); // polled
    EXPECT_FALSE(post(5));
    EXPECT_EQ(post(6), errc::would_block);
}

TEST_F(tcp_srq_claim, released_it_gives_back_the_dropped_and_touches_the_queue_no_more)
{
    srq_claim c(srq_);
    for (std::uint64_t i = 1; i <= 4; ++i)
        ASSERT_FALSE(post(i));
    ASSERT_TRUE(c.ready());
    c.completed();
    c.release(1); // the connection went with that completion unpolled
    EXPECT_EQ(c.current(), srq_claim::state::none);
    EXPECT_FALSE(c.shared());
    EXPECT_FALSE(c.ready()) << "a released claim takes nothing";
    EXPECT_FALSE(post(5)) << "the dropped completion's room is free";
    c.retire(1); // a late retire after the release frees nothing
    EXPECT_EQ(post(6), errc::would_block);
    // The three receives it did not take are still there for other connections.
    srq_claim other(srq_);
    for (std::uint64_t want : {2u, 3u, 4u, 5u}) {
        ASSERT_TRUE(other.ready());
        EXPECT_EQ(other.head().wr_id, want);
        other.completed();
    }
    EXPECT_FALSE(other.ready());
}

} // namespace
} // namespace rdmx::test
