// The initiator's two reliability rules, as socket-free, clock-free parts of the engine
// (tcp_reliability.cpp drives them; tests/tcp/reliability_test.cpp runs them with made-up
// times): the RNR retries of the request at the head of the send queue, and the dead-peer
// rule that stands in for a verbs QP's transport retries.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace rdmx::tcp
{

/// RNR NAKs of one connection's requests (connection_options::rnr_retry_count, 7 meaning
/// retry forever, as on verbs). Each retry goes back to the NAKed request and waits the
/// RNR delay first; no request starts meanwhile. The delay ends at a time (due()), which
/// whoever progresses the connection first acts on: the engine's timer, or a poll (so that
/// a retry does not wait for an engine thread that busy pollers keep off the CPU).
class rnr_retry
{
public:
    using clock = std::chrono::steady_clock;

    enum class state : std::uint8_t {
        clear,   ///< requests may start
        waiting, ///< waiting out an RNR delay: no request may start until waited()
    };

    explicit rnr_retry(std::uint8_t limit) noexcept : limit_(limit > 7 ? 7 : limit) {}

    /// The peer NAKed request `seq` with RNR. True: retry it once `until` has come (now
    /// waiting); false: its retries are spent (rnr_retry_exceeded). Tries count per
    /// request: a NAK of a later one starts again from none.
    bool on_nak(std::uint64_t seq, clock::time_point until) noexcept
    {
        if (seq_ != seq) {
            seq_ = seq;
            tries_ = 0;
        }
        if (limit_ != 7 && tries_ >= limit_)
            return false;
        ++tries_;
        state_ = state::waiting;
        until_ = until;
        return true;
    }
    /// Waiting, and the delay is over at `now`: the retry may go (waited(), then send).
    bool due(clock::time_point now) const noexcept { return state_ == state::waiting && now >= until_; }
    /// The delay passed: requests may start again.
    void waited() noexcept { state_ = state::clear; }
    bool waiting() const noexcept { return state_ == state::waiting; }
    state current() const noexcept { return state_; }

private:
    std::uint8_t limit_;
    state state_ = state::clear;
    std::uint64_t seq_ = UINT64_MAX; ///< the request the tries count for
    std::uint32_t tries_ = 0;
    clock::time_point until_{}; ///< when the current wait ends
};

/// The dead-peer rule: while requests are outstanding, some byte must move (either way)
/// at least once per timeout (ack_timeout * (retry_count + 1)), or the peer is declared
/// dead (transport_retry_exceeded), as a verbs QP does after its retries. The engine's
/// timer looks every check_interval(); the data path only counts bytes and reads no clock,
/// so a look dates what moved since the one before, at most one interval late.
class liveness
{
public:
    using clock = std::chrono::steady_clock;

    liveness(clock::duration timeout, clock::time_point now) noexcept : timeout_(timeout), last_(now) {}

    clock::duration timeout() const noexcept { return timeout_; }
    /// A few looks per timeout bound detection to 1.25 x the timeout.
    clock::duration check_interval() const noexcept
    {
        return std::max<clock::duration>(timeout_ / 4, std::chrono::milliseconds(5));
    }

    /// One look at `now`: `moved` is the bytes read plus sent so far, `read` the bytes read
    /// so far, `outstanding` whether requests await an answer; `unread()` (asked only once
    /// the timeout has passed) the bytes waiting unread in the socket, negative if unknown.
    /// False: the peer is dead.
    template <class Unread>
    bool alive(clock::time_point now, std::uint64_t moved, std::uint64_t read, bool outstanding,
               Unread&& unread) noexcept
    {
        if (moved != seen_) {
            seen_ = moved;
            last_ = now;
        }
        if (!outstanding) {
            last_ = now; // idle time is not silence
            return true;
        }
        if (now - last_ < timeout_)
            return true;
        // Bytes arrived since the last look and wait unread (below the wake threshold of
        // a slow payload, or left to an application that stood the engine down): the peer
        // is alive. One that stopped mid-payload fails at the next look.
        const long long u = unread();
        if (u > 0 && read + static_cast<std::uint64_t>(u) > arrived_) {
            last_ = now;
            arrived_ = read + static_cast<std::uint64_t>(u);
            return true;
        }
        return false;
    }

private:
    clock::duration timeout_;
    clock::time_point last_;    ///< when some byte last moved (or the connection was idle)
    std::uint64_t seen_ = 0;    ///< `moved` at the last look
    std::uint64_t arrived_ = 0; ///< read + unread at the last look that found unread bytes
};

} // namespace rdmx::tcp
