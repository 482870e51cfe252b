// The busy-poll ownership policy (lib/tcp/tcp_poll_ownership.hpp), driven through its states
// with a made-up clock: no socket, no engine thread.
#include <gtest/gtest.h>

#include <chrono>

#include "tcp/tcp_poll_ownership.hpp"

namespace rdmx::tcp
{
namespace
{

using namespace std::chrono_literals;
using clock = poll_ownership::clock;

struct fake_clock {
    clock::time_point now{std::chrono::seconds(1000)};
    clock::time_point advance(clock::duration d) { return now += d; }
};

// One read wake as the engine runs it: both steps, with the probe's verdict given.
bool wake(poll_ownership& p, fake_clock& c, bool app_in_call, bool data_taken, bool app_may_read = true)
{
    return p.wake_may_count(app_in_call, app_may_read) && p.count_wake(data_taken, app_in_call, c.now);
}

TEST(tcp_poll_ownership, starts_with_the_engine_and_an_idle_application)
{
    poll_ownership p;
    EXPECT_EQ(p.owner(), rx_owner::engine);
    EXPECT_FALSE(p.app_owns());
    EXPECT_FALSE(p.app_busy());
    EXPECT_EQ(p.busy_wakes(), 0);
}

TEST(tcp_poll_ownership, post_is_busy_only_within_the_window_of_the_previous_call)
{
    poll_ownership p;
    fake_clock c;
    p.on_post(c.now);
    p.on_call_end(c.now);
    p.on_post(c.advance(poll_ownership::busy_poll_window - 1us));
    EXPECT_TRUE(p.app_busy());
    p.on_call_end(c.now);
    p.on_post(c.advance(poll_ownership::busy_poll_window));
    EXPECT_FALSE(p.app_busy())
        << "a call exactly one window after the previous one ended is not a tight loop";
    p.on_poll(c.now);
    EXPECT_TRUE(p.app_busy()) << "a poll is always busy";
    p.on_app_idle();
    EXPECT_FALSE(p.app_busy());
}

TEST(tcp_poll_ownership, stands_down_after_three_wakes_in_a_row_that_find_the_application_polling)
{
    poll_ownership p;
    fake_clock c;
    for (int i = 1; i < poll_ownership::standdown_wakes; ++i) {
        p.on_poll(c.advance(5us));
        EXPECT_FALSE(wake(p, c, false, true)) << "wake " << i;
        EXPECT_EQ(p.busy_wakes(), i);
    }
    p.on_poll(c.advance(5us));
    EXPECT_TRUE(wake(p, c, false, true));
    p.stand_down();
    EXPECT_EQ(p.owner(), rx_owner::application);
    EXPECT_EQ(p.busy_wakes(), 0);
}

TEST(tcp_poll_ownership, a_wake_without_a_poll_since_the_previous_one_resets_the_count)
{
    poll_ownership p;
    fake_clock c;
    p.on_poll(c.now);
    EXPECT_FALSE(wake(p, c, false, true));
    p.on_poll(c.advance(5us));
    EXPECT_FALSE(wake(p, c, false, true));
    EXPECT_EQ(p.busy_wakes(), 2);
    EXPECT_FALSE(wake(p, c, false, true)) << "no poll since the previous wake";
    EXPECT_EQ(p.busy_wakes(), 0);
    // A call in progress counts as a poll.
    EXPECT_FALSE(wake(p, c, true, false));
    EXPECT_EQ(p.busy_wakes(), 1);
}

TEST(tcp_poll_ownership, an_application_that_may_not_read_keeps_the_engine_reading)
{
    poll_ownership p;
    fake_clock c;
    for (int i = 0; i < 2 * poll_ownership::standdown_wakes; ++i) {
        p.on_poll(c.advance(5us));
        EXPECT_FALSE(wake(p, c, true, true, /*app_may_read=*/false));
        EXPECT_EQ(p.busy_wakes(), 0);
    }
}

TEST(tcp_poll_ownership, data_left_unread_by_a_poller_that_went_quiet_resets_the_count)
{
    poll_ownership p;
    fake_clock c;
    p.on_poll(c.now);
    c.advance(poll_ownership::busy_poll_window - 1us);
    EXPECT_FALSE(wake(p, c, false, /*data_taken=*/false)) << "polling right now: counts";
    EXPECT_EQ(p.busy_wakes(), 1);
    p.on_poll(c.now);
    c.advance(poll_ownership::busy_poll_window);
    EXPECT_FALSE(wake(p, c, false, /*data_taken=*/false)) << "data waiting, last poll a window ago";
    EXPECT_EQ(p.busy_wakes(), 0);
}

TEST(tcp_poll_ownership, the_standdown_check_keeps_a_calling_application_and_reclaims_a_silent_one)
{
    poll_ownership p;
    fake_clock c;
    p.stand_down();
    EXPECT_FALSE(p.still_calling(true)) << "no call since the stand-down";
    p.on_post(c.advance(1us));
    EXPECT_FALSE(p.still_calling(false)) << "calling, but it may not read (e.g. armed a notification)";
    EXPECT_TRUE(p.still_calling(true));
    EXPECT_FALSE(p.still_calling(true)) << "each check needs a call since the previous one";
    p.on_poll(c.advance(1us));
    EXPECT_TRUE(p.still_calling(true));
    p.reclaim();
    EXPECT_EQ(p.owner(), rx_owner::engine);
    // The polls before the reclaim do not count towards the next stand-down.
    EXPECT_FALSE(p.wake_may_count(false, true));
}

// The engine leaves the socket to a poller that sleeps on the queue's sockets only while the
// latest read wake found it alive (connection_engine::sleeper_takes_over): a wake after a
// poll says so, one without a poll since the previous wake does not, and taking the socket
// back (the stand-down check found no polls) forgets it until a wake finds a poll again.
TEST(tcp_poll_ownership, a_wake_says_whether_it_found_the_poller_alive)
{
    poll_ownership p;
    fake_clock c;
    EXPECT_FALSE(p.wake_found_poller()) << "no wake yet";
    p.on_queue_poll(c.advance(5us));
    (void)wake(p, c, false, false);
    EXPECT_TRUE(p.wake_found_poller()) << "polled since the previous wake";
    (void)wake(p, c, false, false);
    EXPECT_FALSE(p.wake_found_poller()) << "no poll since the previous wake";
    (void)wake(p, c, true, false);
    EXPECT_TRUE(p.wake_found_poller()) << "in a call at the wake";
    p.stand_down();
    p.reclaim();
    EXPECT_FALSE(p.wake_found_poller()) << "taken back: forgotten";
    p.on_queue_poll(c.advance(5us));
    (void)wake(p, c, false, false, false);
    EXPECT_TRUE(p.wake_found_poller()) << "alive, whether or not it may read now";
}

TEST(tcp_poll_ownership, stood_down_post_reads_at_most_once_per_interval)
{
    poll_ownership p;
    fake_clock c;
    EXPECT_FALSE(p.post_should_read(c.now)) << "the engine owns the socket: post() never reads";
    p.stand_down();
    EXPECT_TRUE(p.post_should_read(c.now));
    EXPECT_FALSE(p.post_should_read(c.advance(poll_ownership::app_rx_interval - 1us)));
    EXPECT_TRUE(p.post_should_read(c.advance(1us)));
    p.on_poll(c.advance(10us));
    EXPECT_FALSE(p.post_should_read(c.advance(poll_ownership::app_rx_interval - 1us)))
        << "a poll reads too, and restarts the interval";
    p.socket_closed();
    EXPECT_FALSE(p.app_owns());
    EXPECT_FALSE(p.post_should_read(c.advance(1s)));
}

TEST(tcp_poll_ownership, the_transmit_check_sees_calls_since_it_was_armed)
{
    poll_ownership p;
    fake_clock c;
    p.on_post(c.now);
    p.tx_check_armed();
    EXPECT_FALSE(p.called_since_tx_check());
    p.on_poll(c.advance(1us));
    EXPECT_TRUE(p.called_since_tx_check());
    p.tx_check_armed();
    EXPECT_FALSE(p.called_since_tx_check());
}

// A shared completion queue's polls count as the application's (issue 27): the engine
// stands down for a queue's busy poller, stays down while the queue is polled, and takes
// the socket back at the first check after the polls stop. The policy is busy only for
// a poll of the connection's own (the queue's polls do not make post() coalesce).
TEST(tcp_poll_ownership, a_shared_queues_polls_count_as_the_applications)
{
    poll_ownership p;
    fake_clock c;
    for (int i = 1; i < poll_ownership::standdown_wakes; ++i) {
        p.on_queue_poll(c.advance(5us));
        EXPECT_FALSE(wake(p, c, false, true)) << "wake " << i;
    }
    p.on_queue_poll(c.advance(5us));
    ASSERT_TRUE(wake(p, c, false, true)) << "three wakes that found the queue's poller reading";
    p.stand_down();
    EXPECT_FALSE(p.app_busy()) << "the queue's polls are no call of this connection's";
    p.on_queue_poll(c.advance(500us));
    EXPECT_TRUE(p.still_calling(true)) << "polled since the stand-down: it keeps the socket";
    EXPECT_FALSE(p.still_calling(true)) << "no poll since the previous check: the engine takes over";
    // An older time never moves the latest poll back: a wake 10 us after the newest poll
    // finds the poller polling right now.
    p.reclaim();
    p.on_queue_poll(c.now - 1ms);
    c.advance(10us);
    EXPECT_TRUE(p.wake_may_count(false, true));
    EXPECT_FALSE(p.count_wake(false, false, c.now));
    EXPECT_EQ(p.busy_wakes(), 1) << "a poll within the window counts the wake, data taken or not";
}

// A wake that preempts the application in (or just out of) a poll of another connection of
// the domain, or of its shared queue's other sockets, counts though this connection's own
// latest poll is long past and the engine got to the data first: with both threads on one
// CPU the engine always does, and the engine would otherwise never stand down for an
// application that polls many connections (measured: rdmx_perf -q 8, docs/performance.md).
// It counts only for a connection the application polls at all (wake_may_count).
TEST(tcp_poll_ownership, a_poll_elsewhere_in_progress_or_just_ended_counts_as_polling_now)
{
    poll_activity a;
    fake_clock c;
    EXPECT_FALSE(a.polling(c.now)) << "nobody ever polled";
    a.enter(c.now);
    EXPECT_TRUE(a.polling(c.advance(1ms))) << "in a poll, however long it has run";
    a.leave(c.now);
    EXPECT_TRUE(a.polling(c.advance(10us))) << "just out of a poll";
    EXPECT_FALSE(a.polling(c.advance(30us))) << "out of the window";

    poll_ownership p;
    p.on_poll(c.advance(1ms)); // this connection polled once, long ago
    for (int i = 1; i <= poll_ownership::standdown_wakes; ++i) {
        a.enter(c.advance(100us));
        p.on_queue_poll(c.now); // (any poll: the wake must find one since the previous)
        const bool down = p.wake_may_count(false, true) && p.count_wake(false, a.polling(c.now), c.now);
        EXPECT_EQ(down, i == poll_ownership::standdown_wakes) << "wake " << i;
        a.leave(c.advance(5us));
    }
    // Without a poll of this connection since the previous wake, a busy poller elsewhere
    // does not count: the wake resets the count.
    p.reclaim();
    a.enter(c.advance(100us));
    EXPECT_FALSE(p.wake_may_count(false, true));
    EXPECT_EQ(p.busy_wakes(), 0);
}

TEST(tcp_poll_ownership, a_call_that_moved_little_ends_when_it_began)
{
    // The real clock: call_end reads it for a call that moved much.
    const clock::time_point began = clock::now() - 1h;
    EXPECT_EQ(poll_ownership::call_end(began, 0), began);
    EXPECT_EQ(poll_ownership::call_end(began, poll_ownership::call_clock_bytes - 1), began);
    EXPECT_GE(poll_ownership::call_end(began, poll_ownership::call_clock_bytes), began + 1h)
        << "a call that moved call_clock_bytes reads the clock";
}

TEST(tcp_poll_ownership, a_run_reads_the_clock_after_a_long_visit_and_every_few_visits)
{
    const clock::time_point start = clock::now() - 1h;
    {
        visit_clock t(start); // a ping-pong's hit: one small visit
        EXPECT_EQ(t.next(), start);
        t.ended(start);
        EXPECT_EQ(t.end(), start) << "no clock read for a run of one small visit";
    }
    {
        visit_clock t(start); // a visit that moved much read the clock: the next starts then
        EXPECT_EQ(t.next(), start);
        const clock::time_point later = start + 5ms;
        t.ended(later);
        EXPECT_EQ(t.next(), later);
        t.ended(later);
        EXPECT_EQ(t.end(), later) << "one small visit since the latest read";
    }
    {
        visit_clock t(start); // many small visits: a read of its own every few
        for (unsigned i = 0; i < visit_clock::visits_per_clock_read; ++i) {
            EXPECT_EQ(t.next(), start) << "visit " << i;
            t.ended(start);
        }
        const clock::time_point fresh = t.next();
        EXPECT_GE(fresh, start + 1h) << "visit " << visit_clock::visits_per_clock_read << " reads the clock";
        t.ended(fresh);
        EXPECT_EQ(t.end(), fresh);
    }
    {
        visit_clock t(start); // four small visits: the run's end is read
        for (int i = 0; i < 4; ++i)
            t.ended(t.next());
        EXPECT_GE(t.end(), start + 1h);
    }
}

} // namespace
} // namespace rdmx::tcp
