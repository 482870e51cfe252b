// Completions and the flush: the completion ring (or the shared completion queue of a
// side), the notification eventfd, and moving the connection out of `established` with
// everything outstanding completed as flushed.
#include "tcp/tcp_engine.hpp"

#include <unistd.h>

#include "tcp/tcp_log.hpp"

namespace rdmx::tcp
{
namespace
{

rdmx::opcode completion_opcode(rdmx::opcode op) noexcept
{
    // As verbs: a write_with_imm completes at the initiator as an RDMA write, a
    // send_with_invalidate as a send (IBV_WC_SEND).
    return op == opcode::write_with_imm         ? opcode::write
           : op == opcode::send_with_invalidate ? opcode::send
                                                : op;
}

} // namespace

void connection_engine::push_cq(cq_side side, completion c, bool solicited, bool from_srq) noexcept
{
    c.context = context_;
    c.conn = conn_;
    if (tcp_completion_queue* shared = side == cq_side::send ? send_cq_ : recv_cq_) {
        push_shared(*shared, side, c, solicited, from_srq);
        return;
    }
    if (!cq_.push(c, from_srq)) {
        if (from_srq)
            srq_.retire(1); // lost with the overrun: its slot is free
        // CQ overrun is fatal on verbs too. The completion that did not fit is lost; the
        // flush that follows cannot add more (the ring is full), which is what verbs does.
        if (state() == connection_state::established) {
            log_limited("completion ring overrun (never polled?); connection to error");
            fail(connection_state::error);
        }
        return;
    }
    if (notify_.fire(c, solicited)) {
        std::uint64_t one = 1;
        // Only fails if the counter would overflow, which cannot happen with one per arm.
        [[maybe_unused]] auto r = ::write(efd_.get(), &one, sizeof one);
    }
}

void connection_engine::push_shared(tcp_completion_queue& q, cq_side side, const completion& c,
                                    bool solicited, bool from_srq) noexcept
{
    if (detached_) { // the connection object is gone (close())
        if (from_srq)
            srq_.retire(1); // nobody polls it: its slot is free
        return;
    }
    slots_.hold(side); // before a poll can count it down
    if (q.push(c, slots_, side, solicited, from_srq))
        return;
    slots_.release(side, from_srq); // lost with the overrun: its slots are free
    // The reservations and shared_room() make this impossible; should it happen all the
    // same, it is an overrun, fatal as on the own ring.
    if (state() == connection_state::established) {
        log_limited("shared completion queue overrun; connection to error");
        fail(connection_state::error);
    }
}

std::uint64_t connection_engine::shared_room(cq_side side) const noexcept
{
    if (side == cq_side::send) {
        if (!send_cq_)
            return UINT64_MAX;
        const std::uint64_t used = sq_.used() + held_in_cq(side);
        return used < lim_.send_queue_depth ? lim_.send_queue_depth - used : 0;
    }
    if (!recv_cq_)
        return UINT64_MAX;
    const std::uint64_t used = rq_.size() + held_in_cq(side);
    return used < lim_.recv_queue_depth ? lim_.recv_queue_depth - used : 0;
}

void connection_engine::complete_sq_head(std::error_code status, std::uint32_t byte_len) noexcept
{
    const send_queue::entry e = sq_.pop();
    if (status || e.signaled)
        push_cq(cq_side::send, {.wr_id = e.wr_id,
                                .opcode = status ? opcode::unknown : completion_opcode(e.op),
                                .status = status,
                                .byte_len = byte_len});
    if (!status) // after an error, fail() flushes them
        complete_local();
}

void connection_engine::complete_local(std::error_code status) noexcept
{
    for (send_queue::local_entry l; sq_.pop_local_due(l);) {
        if (status || l.signaled)
            push_cq(cq_side::send,
                    {.wr_id = l.wr_id, .opcode = status ? opcode::unknown : l.op, .status = status});
    }
}

void connection_engine::complete_rq_head(const completion& c, bool solicited) noexcept
{
    const bool shared = srq_.shared();
    if (shared)
        srq_.completed();
    else if (!rq_.empty()) // never empty here, but a ring of depth 0 (srq) must not be indexed
        rq_.pop();
    push_cq(cq_side::recv, c, solicited, shared);
}

void connection_engine::fail(connection_state to, std::error_code cause) noexcept
{
    if (state() != connection_state::established && state() != connection_state::connecting)
        return;
    cause_ = cause ? cause
                   : make_error_code(to == connection_state::disconnected ? errc::disconnected
                                                                          : errc::completion_error);
    state_.store(to, std::memory_order_release);
    events_.report(to, cause_, !local_disconnect_);
    // Everything outstanding completes as flushed, signalled or not (as verbs does for
    // errors). The engine touches none of that memory afterwards: the receive side only
    // drains, and the transmit side finishes at most the frame already on the wire.
    // Binds and invalidations in their places among them: their effect stays (it came
    // at post time), their completions say flushed.
    const std::error_code flushed = make_error_code(errc::flushed);
    complete_local(flushed);
    while (!sq_.empty()) {
        const send_queue::entry e = sq_.pop();
        push_cq(cq_side::send, {.wr_id = e.wr_id, .opcode = opcode::unknown, .status = errc::flushed});
        complete_local(flushed);
    }
    sq_.stop_sending();
    while (!rq_.empty()) {
        const recv_queue::entry e = rq_.pop();
        push_cq(cq_side::recv, {.wr_id = e.wr_id, .opcode = opcode::unknown, .status = errc::flushed});
    }
    // A receive taken from the shared queue for a frame that did not finish; the ones
    // not taken stay there for the other connections (as a verbs SRQ keeps its WQEs).
    if (srq_.current() == srq_claim::state::held)
        complete_rq_head({.wr_id = srq_.head().wr_id, .opcode = opcode::unknown, .status = errc::flushed},
                         false);
}

} // namespace rdmx::tcp
