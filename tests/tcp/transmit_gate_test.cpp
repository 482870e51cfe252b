// The transmit side's gate (lib/tcp/tcp_transmit_gate.hpp) without a socket: one pump at a
// time, the engine's continuation, and a write side that shuts for good.
#include <gtest/gtest.h>

#include "tcp/tcp_transmit_gate.hpp"

namespace rdmx::tcp
{
namespace
{

TEST(tcp_transmit_gate, one_pump_at_a_time_on_any_thread)
{
    transmit_gate g;
    EXPECT_EQ(g.current(), transmit_gate::state::open);
    ASSERT_TRUE(g.may_pump(false));
    ASSERT_TRUE(g.may_pump(true));
    g.enter();
    EXPECT_FALSE(g.may_pump(false)) << "a pump's own calls came back into it";
    EXPECT_FALSE(g.may_pump(true));
    g.leave();
    EXPECT_TRUE(g.may_pump(false));
    EXPECT_TRUE(g.may_pump(true));
}

TEST(tcp_transmit_gate, the_engine_leaves_sending_to_its_queued_continuation_an_application_does_not)
{
    transmit_gate g;
    ASSERT_TRUE(g.queue_continuation());
    EXPECT_TRUE(g.continuation_queued());
    EXPECT_FALSE(g.queue_continuation()) << "a second continuation for the same work";
    EXPECT_FALSE(g.may_pump(true)) << "the engine pumped beside its own continuation";
    EXPECT_TRUE(g.may_pump(false)) << "an application thread must still send";
    g.continuation_ran();
    EXPECT_FALSE(g.continuation_queued());
    EXPECT_TRUE(g.may_pump(true));
    EXPECT_TRUE(g.queue_continuation()) << "the next continuation after one ran";
}

TEST(tcp_transmit_gate, a_shut_write_side_never_pumps_again)
{
    transmit_gate g;
    ASSERT_TRUE(g.queue_continuation());
    g.shut();
    EXPECT_TRUE(g.is_shut());
    EXPECT_EQ(g.current(), transmit_gate::state::shut);
    EXPECT_FALSE(g.may_pump(false));
    EXPECT_FALSE(g.may_pump(true));
    // The continuation queued before still runs (its wait may hold the descriptor until
    // then), and the side stays shut after it.
    EXPECT_TRUE(g.continuation_queued());
    g.continuation_ran();
    EXPECT_TRUE(g.is_shut());
    EXPECT_FALSE(g.may_pump(false));
    EXPECT_FALSE(g.may_pump(true));
}

} // namespace
} // namespace rdmx::tcp
