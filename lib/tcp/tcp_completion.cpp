// Completions and the flush: the completion ring, the notification eventfd, and moving the
// connection out of `established` with everything outstanding completed as flushed.
#include "tcp/tcp_engine.hpp"

#include <unistd.h>

#include "tcp/tcp_log.hpp"

namespace rdmx::tcp
{
namespace
{

rdmx::opcode completion_opcode(rdmx::opcode op) noexcept
{
    // As verbs: a write_with_imm completes at the initiator as an RDMA write.
    return op == opcode::write_with_imm ? opcode::write : op;
}

} // namespace

void connection_engine::push_cq(const completion& c, bool solicited) noexcept
{
    if (!cq_.push(c)) {
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

void connection_engine::complete_sq_head(std::error_code status, std::uint32_t byte_len) noexcept
{
    sq_entry e = sq_at(sq_head_);
    ++sq_head_;
    if (e.op == opcode::read && reads_in_flight_ > 0)
        --reads_in_flight_;
    if (status || e.signaled)
        push_cq({.wr_id = e.wr_id,
                 .opcode = status ? opcode::unknown : completion_opcode(e.op),
                 .status = status,
                 .byte_len = byte_len});
}

void connection_engine::complete_rq_head(const completion& c, bool solicited) noexcept
{
    ++rq_head_;
    push_cq(c, solicited);
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
    while (sq_head_ < sq_tail_) {
        sq_entry& e = sq_at(sq_head_++);
        push_cq({.wr_id = e.wr_id, .opcode = opcode::unknown, .status = errc::flushed});
    }
    tx_next_ = sq_tail_;
    reads_in_flight_ = 0;
    while (rq_head_ < rq_tail_) {
        rq_entry& e = rq_at(rq_head_++);
        push_cq({.wr_id = e.wr_id, .opcode = opcode::unknown, .status = errc::flushed});
    }
}

} // namespace rdmx::tcp
