// The target's view of the peer's requests, a socket-free part of the engine: which
// sequence number comes next, and whether an RNR NAK makes the requests behind it (already
// on their way) be dropped until the NAKed one comes again (go-back-N, docs/wire-format.md).
// tcp_target.cpp drives it; tests/tcp/target_test.cpp runs it alone.
#pragma once

#include <cstdint>

namespace rdmx::tcp
{

class request_sequence
{
public:
    enum class state : std::uint8_t {
        in_order, ///< requests come in sequence
        rnr_sent, ///< expected() was NAKed with RNR: later requests are dropped until it comes again
    };
    /// What to do with a request of sequence number `seq`.
    enum class verdict : std::uint8_t {
        serve,     ///< the one expected
        drop,      ///< behind an RNR NAK: the peer sends it again
        violation, ///< out of sequence otherwise: the peer broke the protocol
    };

    verdict check(std::uint64_t seq) const noexcept
    {
        if (seq == expect_)
            return verdict::serve;
        return state_ == state::rnr_sent && seq > expect_ ? verdict::drop : verdict::violation;
    }
    /// The expected request was carried out (or answered): the next one may come.
    void carried_out() noexcept
    {
        ++expect_;
        state_ = state::in_order;
    }
    /// The expected request was NAKed with RNR.
    void nak_rnr() noexcept { state_ = state::rnr_sent; }

    /// The next request's sequence number (a count of the requests carried out).
    std::uint64_t expected() const noexcept { return expect_; }
    state current() const noexcept { return state_; }

private:
    std::uint64_t expect_ = 0;
    state state_ = state::in_order;
};

} // namespace rdmx::tcp
