// The target's view of the peer's request sequence (lib/tcp/tcp_target.hpp): in order,
// go-back-N after an RNR NAK, and what is a protocol violation.
#include <gtest/gtest.h>

#include "tcp/tcp_target.hpp"

namespace rdmx::tcp
{
namespace
{

using verdict = request_sequence::verdict;

TEST(tcp_request_sequence, requests_are_served_in_order_and_nothing_else_is)
{
    request_sequence s;
    EXPECT_EQ(s.check(0), verdict::serve);
    s.carried_out();
    EXPECT_EQ(s.expected(), 1u);
    EXPECT_EQ(s.check(0), verdict::violation); // a repeat
    EXPECT_EQ(s.check(2), verdict::violation); // a gap
    EXPECT_EQ(s.check(1), verdict::serve);
}

TEST(tcp_request_sequence, after_an_rnr_nak_later_requests_are_dropped_until_the_naked_one_comes_again)
{
    request_sequence s;
    s.carried_out();
    s.nak_rnr(); // request 1 found no receive
    EXPECT_EQ(s.current(), request_sequence::state::rnr_sent);
    EXPECT_EQ(s.check(2), verdict::drop);
    EXPECT_EQ(s.check(3), verdict::drop);
    EXPECT_EQ(s.check(0), verdict::violation); // before it: never
    EXPECT_EQ(s.check(1), verdict::serve);     // sent again
    s.carried_out();
    EXPECT_EQ(s.current(), request_sequence::state::in_order);
    EXPECT_EQ(s.check(3), verdict::violation); // in order again: a gap is a violation
    EXPECT_EQ(s.check(2), verdict::serve);
}

} // namespace
} // namespace rdmx::tcp
