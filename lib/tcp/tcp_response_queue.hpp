// The responses a connection owes its peer (ACK, NAK, read and atomic responses), sent in
// the order the requests arrived. Bounded: when it is full, the engine stops reading
// requests (TCP backpressure). Positions count up from 0 and never wrap; the slot is
// position % capacity.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{

/// A response owed to the peer.
struct response {
    frame_op op = frame_op::ack;
    nak_code code = nak_code::rnr;
    std::uint64_t seq = 0;
    seg data; ///< read_resp: the target memory to send; atomic_resp: `value` (payload_segs)
    /// atomic_resp: the target's old value, little endian, sent from this slot
    std::array<std::byte, atomic_resp_payload> value{};
};

class response_queue
{
public:
    explicit response_queue(std::size_t capacity) : slots_(capacity) {}

    std::uint64_t head() const noexcept { return head_; } ///< the oldest response not yet sent whole
    std::uint64_t tail() const noexcept { return tail_; } ///< one past the newest
    bool empty() const noexcept { return head_ == tail_; }
    bool full() const noexcept { return tail_ - head_ == slots_.size(); }
    std::size_t capacity() const noexcept { return slots_.size(); }
    response& at(std::uint64_t pos) noexcept { return slots_[pos % slots_.size()]; }
    const response& at(std::uint64_t pos) const noexcept { return slots_[pos % slots_.size()]; }

    /// False, and nothing queued, when full (the engine checks for space before it takes a
    /// request, and every request produces at most one response).
    bool push(const response& r) noexcept
    {
        if (full())
            return false;
        at(tail_++) = r;
        return true;
    }
    /// ACKs are cumulative: extends the newest one to `seq` unless it is the head and already
    /// partly on the wire (`head_on_wire`), else queues a new one.
    bool push_ack(std::uint64_t seq, bool head_on_wire) noexcept
    {
        if (tail_ > head_) {
            std::uint64_t last = tail_ - 1;
            bool started = last == head_ && head_on_wire;
            if (!started && at(last).op == frame_op::ack) {
                at(last).seq = seq;
                return true;
            }
        }
        return push({.op = frame_op::ack, .code = nak_code::rnr, .seq = seq, .data = {}});
    }
    /// The head response is out.
    void pop() noexcept { ++head_; }
    /// Drops every response after `pos`: `pos` is now the newest.
    void drop_after(std::uint64_t pos) noexcept { tail_ = pos + 1; }
    /// Nothing but ACKs owed (or nothing at all).
    bool only_acks() const noexcept
    {
        for (std::uint64_t r = head_; r < tail_; ++r)
            if (at(r).op != frame_op::ack)
                return false;
        return true;
    }

private:
    std::vector<response> slots_;
    std::uint64_t head_ = 0, tail_ = 0;
};

/// Whether the ACK for requests that a poll of a shared queue read may wait for a later
/// visit of the domain's progress (connection_engine::queue_progress), so that one ACK
/// answers a stream of requests rather than each read: a visit that carried out requests
/// holds it; visits of the pending list that find nothing new hold it while they count:
/// one in a row where the domain's previous run found no data (a sender that waits for
/// it is answered at the second), busy_visits - 1 where it found some (the others'
/// traffic keeps the poller visiting). Never while responses other than ACKs are owed
/// (the caller asks), nor at a visit of the socket or rings that brought nothing.
class ack_hold
{
public:
    static constexpr int busy_visits = 8;

    /// One visit: `fresh` it carried out requests; `listed` it is the pending list's;
    /// `responses` something is owed; `queue_busy` the previous run found data. True: the
    /// ACK may wait (it is sent now otherwise, and the count starts over: sent()).
    bool may_wait(bool fresh, bool listed, bool responses, bool queue_busy) noexcept
    {
        if (fresh) {
            idle_ = 0;
            return true;
        }
        return listed && responses && ++idle_ < (queue_busy ? busy_visits : 2);
    }
    /// What was owed left now (or the poller is about to sleep): the count starts over.
    void sent() noexcept { idle_ = 0; }
    /// Visits since the last fresh one or send that found nothing new.
    int idle_visits() const noexcept { return idle_; }

private:
    int idle_ = 0;
};

} // namespace rdmx::tcp
