// A connection's claim on its shared receive queue: the one receive it took for the frame
// arriving, kept until that frame completes it (a verbs SRQ's WQE is the QP's once
// consumed), and the queue's slots that its polled or dropped completions give back. Four
// engine members before (the queue, the taken receive, its SGEs, a flag); one state now.
#pragma once

#include <cstdint>
#include <vector>

#include "tcp/tcp_recv_queue.hpp"
#include "tcp/tcp_srq.hpp"

namespace rdmx::tcp
{

class srq_claim
{
public:
    enum class state : std::uint8_t {
        none, ///< no shared queue (or no more: the connection let go of it): its own queue serves
        idle, ///< nothing taken: the next frame that needs a receive takes the oldest posted
        held, ///< a receive taken and not completed yet: the frame arriving owns it
    };

    /// `q` null: the connection has its own receive queue. Allocates the room for the SGEs
    /// of a taken receive (q->max_sge()), here and nowhere else.
    explicit srq_claim(tcp_srq* q) : q_(q), segs_(q ? q->max_sge() : 0), st_(q ? state::idle : state::none) {}
    srq_claim(const srq_claim&) = delete;
    srq_claim& operator=(const srq_claim&) = delete;

    state current() const noexcept { return st_; }
    /// Whether receives come from a shared queue (not the connection's own).
    bool shared() const noexcept { return st_ != state::none; }
    /// The queue, for the completion slots that release its receives without the engine.
    tcp_srq* queue() const noexcept { return q_; }

    /// Whether a receive is held for the next frame: taken now if none was. False: none is
    /// posted (the sender gets receiver-not-ready), or there is no shared queue.
    bool ready() noexcept
    {
        if (st_ == state::idle && q_->take(recv_.wr_id, recv_.length, recv_.nseg, segs_.data()))
            st_ = state::held;
        return st_ == state::held;
    }
    /// The held receive and its SGEs (ready() returned true).
    recv_queue::entry& head() noexcept { return recv_; }
    seg* segs() noexcept { return segs_.data(); }
    /// Its frame completed it (or it was flushed): the next frame takes another.
    void completed() noexcept
    {
        if (st_ == state::held)
            st_ = state::idle;
    }
    /// `n` completions of shared receives were polled or dropped: their slots are free.
    void retire(std::size_t n) noexcept
    {
        if (q_ && n)
            q_->retire(n);
    }
    /// The connection object, which holds the queue, is going: `dropped` completions nobody
    /// will poll free their slots, and the queue is not touched again. close() flushed a
    /// held receive first (fail()), so its completion is among them.
    void release(std::size_t dropped) noexcept
    {
        retire(dropped);
        q_ = nullptr;
        st_ = state::none;
    }

private:
    tcp_srq* q_;
    std::vector<seg> segs_; ///< the held receive's SGEs (q_->max_sge())
    recv_queue::entry recv_;
    state st_;
};

} // namespace rdmx::tcp
