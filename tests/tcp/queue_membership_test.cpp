// A connection's place in its shared queues' domain progress (lib/tcp/tcp_queue_membership.hpp),
// socket-free: the watch's transitions (a stall pauses and resumes it, leaving is for good),
// one mark per pending list until its run takes it off, and the count of the queues' polls.
#include <gtest/gtest.h>

#include "tcp/tcp_queue_membership.hpp"

namespace rdmx::test
{
namespace
{

using tcp::queue_membership;
using watch = queue_membership::watch;

TEST(tcp_queue_membership, a_connection_on_its_own_queues_is_in_no_set_and_never_enters_one)
{
    queue_membership m(false);
    EXPECT_EQ(m.current(), watch::none);
    EXPECT_FALSE(m.reaches());
    EXPECT_FALSE(m.pause());
    EXPECT_FALSE(m.resume());
    EXPECT_FALSE(m.leave()) << "nothing to take out of the sets";
    EXPECT_EQ(m.current(), watch::none);
}

TEST(tcp_queue_membership, a_stall_pauses_the_watch_and_reading_again_resumes_it)
{
    queue_membership m(true);
    EXPECT_EQ(m.current(), watch::watched);
    EXPECT_TRUE(m.watched());
    EXPECT_FALSE(m.resume()) << "not paused";
    ASSERT_TRUE(m.pause());
    EXPECT_EQ(m.current(), watch::paused);
    EXPECT_FALSE(m.watched());
    EXPECT_TRUE(m.reaches()) << "out for a stall only: the sets still know the socket";
    EXPECT_FALSE(m.pause()) << "paused once";
    ASSERT_TRUE(m.resume());
    EXPECT_EQ(m.current(), watch::watched);
}

TEST(tcp_queue_membership, leaving_is_for_good_from_watched_or_paused)
{
    for (bool stalled : {false, true}) {
        queue_membership m(true);
        if (stalled) {
            ASSERT_TRUE(m.pause());
        }
        ASSERT_TRUE(m.leave());
        EXPECT_EQ(m.current(), watch::gone);
        EXPECT_FALSE(m.reaches());
        EXPECT_FALSE(m.leave()) << "the sets were told once";
        EXPECT_FALSE(m.resume()) << "a stall's end does not bring it back";
        EXPECT_FALSE(m.pause());
        EXPECT_EQ(m.current(), watch::gone);
    }
}

TEST(tcp_queue_membership, a_refusal_ends_the_watch_whatever_it_was)
{
    queue_membership m(true);
    ASSERT_TRUE(m.pause());
    ASSERT_TRUE(m.resume()); // watched again in our state, then a set refused the socket
    m.refused();
    EXPECT_EQ(m.current(), watch::gone);
    EXPECT_FALSE(m.leave()) << "a refused socket is in no set to leave";
}

TEST(tcp_queue_membership, one_mark_per_pending_list_until_its_run_takes_it_off)
{
    queue_membership m(true);
    EXPECT_FALSE(m.marked(0));
    EXPECT_TRUE(m.mark(0));
    EXPECT_FALSE(m.mark(0)) << "once per list: its reserved room suffices";
    EXPECT_TRUE(m.marked(0));
    EXPECT_FALSE(m.marked(1)) << "the lists are independent";
    EXPECT_TRUE(m.mark(1));
    m.unmark(0);
    EXPECT_FALSE(m.marked(0));
    EXPECT_TRUE(m.marked(1));
    EXPECT_TRUE(m.mark(0));
}

TEST(tcp_queue_membership, only_a_new_poll_count_says_the_polls_moved)
{
    queue_membership m(true);
    EXPECT_FALSE(m.polls_moved(0));
    EXPECT_TRUE(m.polls_moved(3));
    EXPECT_FALSE(m.polls_moved(3)) << "kept";
    EXPECT_TRUE(m.polls_moved(4));
}

} // namespace
} // namespace rdmx::test
