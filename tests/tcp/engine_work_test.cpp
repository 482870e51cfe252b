// The engine thread's outstanding work per connection (lib/tcp/tcp_engine_work.hpp),
// socket-free: each kind at most once until its handler ran, the kinds independent, and
// "reading soon" meaning a read wait or a posted read run.
#include <gtest/gtest.h>

#include "tcp/tcp_engine_work.hpp"

namespace rdmx::test
{
namespace
{

using tcp::engine_work;
using kind = engine_work::kind;

TEST(tcp_engine_work, each_kind_starts_once_until_its_handler_ran)
{
    engine_work w;
    for (kind k : {kind::read_wait, kind::rx_continue, kind::reclaim, kind::tx_check}) {
        EXPECT_FALSE(w.outstanding(k));
        EXPECT_TRUE(w.start(k)) << "the caller posts it";
        EXPECT_TRUE(w.outstanding(k));
        EXPECT_FALSE(w.start(k)) << "a second would run the work twice";
        w.ran(k);
        EXPECT_FALSE(w.outstanding(k));
        EXPECT_TRUE(w.start(k)) << "the work may start the next one";
        w.ran(k);
    }
}

TEST(tcp_engine_work, the_kinds_are_independent)
{
    engine_work w;
    ASSERT_TRUE(w.start(kind::reclaim));
    ASSERT_TRUE(w.start(kind::tx_check));
    EXPECT_FALSE(w.outstanding(kind::read_wait));
    EXPECT_FALSE(w.outstanding(kind::rx_continue));
    w.ran(kind::reclaim);
    EXPECT_TRUE(w.outstanding(kind::tx_check)) << "one handler ran, not the other";
    w.ran(kind::read_wait); // a handler of work never started (an aborted wait) clears nothing else
    EXPECT_TRUE(w.outstanding(kind::tx_check));
}

TEST(tcp_engine_work, reading_soon_is_an_armed_wait_or_a_posted_read_run)
{
    engine_work w;
    EXPECT_FALSE(w.reading_soon());
    ASSERT_TRUE(w.start(kind::reclaim));
    ASSERT_TRUE(w.start(kind::tx_check));
    EXPECT_FALSE(w.reading_soon()) << "neither reads";
    ASSERT_TRUE(w.start(kind::read_wait));
    EXPECT_TRUE(w.reading_soon());
    ASSERT_TRUE(w.start(kind::rx_continue));
    w.ran(kind::read_wait);
    EXPECT_TRUE(w.reading_soon()) << "the posted run still reads";
    w.ran(kind::rx_continue);
    EXPECT_FALSE(w.reading_soon());
}

} // namespace
} // namespace rdmx::test
