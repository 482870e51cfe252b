// The initiator's reliability rules (lib/tcp/tcp_reliability.hpp) without a socket or a
// clock: RNR retries per request and when they are due, and the dead-peer rule fed
// made-up times.
#include <gtest/gtest.h>

#include "tcp/tcp_reliability.hpp"

namespace rdmx::tcp
{
namespace
{

using namespace std::chrono_literals;

/// Any time: the retry counts do not depend on it.
const rnr_retry::clock::time_point any_time = rnr_retry::clock::time_point{} + std::chrono::hours(1);

TEST(tcp_rnr_retry, a_request_is_retried_its_limit_of_times_then_fails)
{
    rnr_retry r(2);
    EXPECT_EQ(r.current(), rnr_retry::state::clear);
    ASSERT_TRUE(r.on_nak(5, any_time));
    EXPECT_TRUE(r.waiting());
    r.waited();
    EXPECT_FALSE(r.waiting());
    ASSERT_TRUE(r.on_nak(5, any_time));
    r.waited();
    EXPECT_FALSE(r.on_nak(5, any_time)); // the third NAK of the same request: retries spent
}

TEST(tcp_rnr_retry, tries_count_per_request)
{
    rnr_retry r(1);
    ASSERT_TRUE(r.on_nak(5, any_time));
    r.waited();
    ASSERT_TRUE(r.on_nak(6, any_time)); // a later request starts from none
    r.waited();
    EXPECT_FALSE(r.on_nak(6, any_time));
}

TEST(tcp_rnr_retry, seven_retries_forever_and_zero_never)
{
    rnr_retry forever(7);
    for (int i = 0; i < 1000; ++i) {
        ASSERT_TRUE(forever.on_nak(1, any_time)) << i;
        forever.waited();
    }
    rnr_retry never(0);
    EXPECT_FALSE(never.on_nak(1, any_time));
    EXPECT_FALSE(never.waiting());
    rnr_retry clamped(200); // above 7 means 7, as on verbs' three bits
    for (int i = 0; i < 1000; ++i)
        ASSERT_TRUE(clamped.on_nak(1, any_time)) << i;
}

TEST(tcp_rnr_retry, a_retry_is_due_once_its_delay_is_over_and_only_while_waiting)
{
    const auto t0 = any_time;
    rnr_retry r(7);
    EXPECT_FALSE(r.due(t0 + 1h)) << "nothing to retry";
    ASSERT_TRUE(r.on_nak(3, t0 + 640us));
    EXPECT_FALSE(r.due(t0));
    EXPECT_FALSE(r.due(t0 + 639us));
    EXPECT_TRUE(r.due(t0 + 640us));
    EXPECT_TRUE(r.due(t0 + 1s));
    r.waited(); // whoever came first (a poll, the engine's timer) retried
    EXPECT_FALSE(r.due(t0 + 1s)) << "retried twice";
    // The next NAK waits its own delay from when it came.
    ASSERT_TRUE(r.on_nak(3, t0 + 2s));
    EXPECT_FALSE(r.due(t0 + 1s));
    EXPECT_TRUE(r.due(t0 + 2s));
}

struct unread_bytes {
    long long n = 0;
    int asked = 0;
    long long operator()() { return ++asked, n; }
};

TEST(tcp_liveness, silence_with_requests_outstanding_is_death_after_the_timeout)
{
    const auto t0 = liveness::clock::time_point{} + 1h;
    liveness l(1s, t0);
    unread_bytes u;
    EXPECT_TRUE(l.alive(t0 + 500ms, 0, 0, true, u));
    EXPECT_TRUE(l.alive(t0 + 999ms, 0, 0, true, u));
    EXPECT_EQ(u.asked, 0); // the socket is asked only once the timeout has passed
    EXPECT_FALSE(l.alive(t0 + 1s, 0, 0, true, u));
    EXPECT_EQ(u.asked, 1);
    EXPECT_EQ(l.check_interval(), 250ms);
}

TEST(tcp_liveness, bytes_moving_either_way_or_an_idle_queue_keep_it_alive)
{
    const auto t0 = liveness::clock::time_point{} + 1h;
    liveness l(1s, t0);
    unread_bytes u;
    EXPECT_TRUE(l.alive(t0 + 900ms, 10, 0, true, u));  // bytes sent since the last look
    EXPECT_TRUE(l.alive(t0 + 1800ms, 10, 0, true, u)); // 900 ms of silence since then
    EXPECT_FALSE(l.alive(t0 + 1900ms, 10, 0, true, u));

    liveness idle(1s, t0);
    EXPECT_TRUE(idle.alive(t0 + 5s, 0, 0, false, u));    // nothing outstanding: not silence
    EXPECT_TRUE(idle.alive(t0 + 5900ms, 0, 0, true, u)); // silence counts from the idle look
    EXPECT_FALSE(idle.alive(t0 + 6s, 0, 0, true, u));
}

TEST(tcp_liveness, bytes_waiting_unread_count_once_per_arrival)
{
    // A slow payload below the wake threshold, or a socket left to a poller that stopped:
    // bytes that arrived since the last look keep the peer alive; the same bytes again do not.
    const auto t0 = liveness::clock::time_point{} + 1h;
    liveness l(1s, t0);
    unread_bytes u{.n = 100};
    EXPECT_TRUE(l.alive(t0 + 1s, 0, 0, true, u));
    EXPECT_FALSE(l.alive(t0 + 2s, 0, 0, true, u)); // nothing new arrived
    liveness m(1s, t0);
    EXPECT_TRUE(m.alive(t0 + 1s, 0, 0, true, u));
    u.n = 150; // 50 more arrived
    EXPECT_TRUE(m.alive(t0 + 2s, 0, 0, true, u));
    EXPECT_TRUE(m.alive(t0 + 2500ms, 150, 150, true, u)); // and were read: moved
    u.n = -1;                                             // the socket cannot say
    EXPECT_FALSE(m.alive(t0 + 3500ms, 150, 150, true, u));
}

TEST(tcp_liveness, a_short_timeout_is_looked_at_every_five_milliseconds_at_least)
{
    liveness l(8ms, liveness::clock::now());
    EXPECT_EQ(l.check_interval(), 5ms);
    EXPECT_EQ(l.timeout(), 8ms);
}

} // namespace
} // namespace rdmx::tcp
