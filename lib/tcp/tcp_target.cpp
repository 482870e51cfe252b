// The target side of the peer's requests: what a send, write, read or atomic request does
// here once its payload is in (finish_frame), and the responses (ACK, NAK, read and atomic
// responses) owed for it, sent in the order the requests arrived.
#include "tcp/tcp_engine.hpp"

#include <atomic>
#include <cstring>

#include "validate.hpp"

namespace rdmx::tcp
{

void connection_engine::begin_request(const frame_header& h) noexcept
{
    switch (seq_.check(h.seq)) {
    case request_sequence::verdict::serve: break;
    case request_sequence::verdict::drop: // behind an RNR NAK: it comes again after the NAKed one
        rx_.action = rx_action::drop;
        return;
    case request_sequence::verdict::violation: protocol_violation("request out of sequence", false); return;
    }
    switch (h.op) {
    case frame_op::send:
    case frame_op::send_inv: // the window is revoked when the payload is in (finish_frame)
        if (!recv_ready())
            rx_.action = rx_action::rnr;
        else if (h.length > recv_head().length)
            rx_.action = rx_action::recv_overflow;
        else
            rx_.into(rx_action::recv, recv_head_segs(), recv_head().nseg);
        return;
    case frame_op::write_imm:
        if (!recv_ready()) {
            rx_.action = rx_action::rnr;
            return;
        }
        [[fallthrough]];
    case frame_op::write: {
        const rx_action a = h.op == frame_op::write ? rx_action::write : rx_action::write_imm;
        // A zero-length write touches nothing, so (as on verbs) it needs no valid key.
        seg s;
        if (h.length == 0)
            rx_.action = a;
        else if (!dom_.find_remote(h.key, h.addr, h.length, access::remote_write, s, id_))
            rx_.action = rx_action::write_bad;
        else
            rx_.into_one(a, s);
        return;
    }
    case frame_op::read_req: {
        seg s;
        if (h.length != 0 && !dom_.find_remote(h.key, h.addr, h.length, access::remote_read, s, id_)) {
            target_fail(nak_code::remote_access, h.seq);
            return;
        }
        seq_.carried_out();
        push_response({.op = frame_op::read_resp, .code = nak_code::rnr, .seq = h.seq, .data = s});
        return;
    }
    case frame_op::write_imm_cma:
    case frame_op::write_cma:
    case frame_op::read_cma_req:
    case frame_op::send_cma:
        // The descriptors first; the target is checked and the data moved when they are
        // in (serve_cma). Only a peer over a UNIX socket shares this host's memory.
        if (!local_.load(std::memory_order_relaxed)) {
            protocol_violation("CMA request on a connection that is not shm://", false);
            return;
        }
        if ((h.op == frame_op::write_imm_cma || h.op == frame_op::send_cma) && !recv_ready()) {
            rx_.action = rx_action::rnr;
            return;
        }
        rx_.into_cma(h.length);
        return;
    case frame_op::fetch_add_req:
    case frame_op::compare_swap_req:
        // The operands first; the target is checked and changed when they are in.
        rx_.into_operands(rx_action::atomic, h.length);
        return;
    default: break;
    }
    protocol_violation("unexpected request opcode", false);
}

void connection_engine::push_response(const response& r) noexcept
{
    // Space was checked before the request's header was consumed (rx_step), and every
    // request produces at most one response.
    resp_.push(r);
}

void connection_engine::push_ack(std::uint64_t seq) noexcept
{
    // ACKs are cumulative: extend the last one unless it already started on the wire.
    resp_.push_ack(seq, cur_.item().kind == frame_kind::response);
}

void connection_engine::target_fail(nak_code code, std::uint64_t seq) noexcept
{
    // As rxe and real HCAs: a class C responder error moves the responder's QP to error
    // too. The NAK is still sent (before our FIN) so that the initiator learns why.
    push_response({.op = frame_op::nak, .code = code, .seq = seq, .data = {}});
    fail(connection_state::error, nak_status(code));
}

std::optional<std::uint64_t> connection_engine::execute_atomic(const frame_header& h) noexcept
{
    seg s;
    if (h.addr % detail::atomic_size != 0 ||
        !dom_.find_remote(h.key, h.addr, detail::atomic_size, access::remote_atomic, s, id_) ||
        !pin(s.st, s.tag))
        return std::nullopt;
    if (s.st->stage == staging::cuda) { // registration refuses remote_atomic there: never
        unpin(s.st);
        return std::nullopt;
    }
    // The one place where this domain serves atomics. Connections of a domain are served
    // on the engine thread and on the threads of applications that busy-poll them, so
    // two of them may be here at once for one target: a CPU atomic (on the 8-byte aligned
    // target) keeps each one whole among all of them, and against atomics of the owner's
    // CPU too. Plain writes (the peer's RDMA writes, the owner's stores) are no part of
    // that promise, as on verbs.
    std::atomic_ref<std::uint64_t> target(*reinterpret_cast<std::uint64_t*>(s.ptr));
    std::uint64_t old = load_le64(rx_.operands.data());
    if (h.op == frame_op::fetch_add_req)
        old = target.fetch_add(old);
    else // on failure, `old` becomes the current value; on success it is the compare value
        target.compare_exchange_strong(old, load_le64(rx_.operands.data() + 8));
    unpin(s.st);
    return old;
}

void connection_engine::finish_atomic_response() noexcept
{
    // The local SGE may have been deregistered meanwhile (memory_region's destructor):
    // the value is written under a pin, or not at all, as a read response's bytes.
    const seg& sink = sq_.segs(sq_.head())[0];
    if (rx_.fault || (sink.st && !pin(sink.st, sink.tag))) {
        complete_sq_head(errc::local_protection, 0);
        fail(connection_state::error, errc::local_protection);
        return;
    }
    // Little endian on the wire; the caller reads a native std::uint64_t.
    const std::uint64_t old = load_le64(rx_.operands.data());
    bool ok = true;
    if (sink.st && sink.st->stage != staging::none) {
        ok = dom_.bounce().copy_now(false, sink.st->stage, sink.st->device, sink.ptr,
                                    reinterpret_cast<const std::byte*>(&old), sizeof old);
        dom_.bounce().count_in(sizeof old);
    } else {
        std::memcpy(sink.ptr, &old, sizeof old);
    }
    if (sink.st)
        unpin(sink.st);
    if (!ok) {
        complete_sq_head(errc::local_protection, 0);
        fail(connection_state::error, errc::local_protection);
        return;
    }
    complete_sq_head({}, atomic_resp_payload);
}

void connection_engine::finish_frame() noexcept
{
    // Payload bound for staged memory is in place only once its copies finished: before
    // the completion, the ACK, or the read's or atomic's result is reported.
    settle_rx(false);
    rx_action a = rx_.action;
    rx_.action = rx_action::none;
    const frame_header& h = rx_.hdr;
    bool solicited = (h.flags & flag_solicited) != 0;
    switch (a) {
    case rx_action::none: return;
    case rx_action::recv:
        if (rx_.fault) {
            complete_rq_head(
                {.wr_id = recv_head().wr_id, .opcode = opcode::unknown, .status = errc::local_protection},
                solicited);
            target_fail(nak_code::remote_operation, h.seq);
            return;
        }
        if (h.op == frame_op::send_inv) {
            // Revoked before the receive completes. A key that names no window bound
            // through this connection is the peer's invalid request, as on rxe: the
            // receive fails, the peer is NAKed, and both connections go to error.
            if (!dom_.invalidate_remote(h.key, id_)) {
                complete_rq_head({.wr_id = recv_head().wr_id,
                                  .opcode = opcode::unknown,
                                  .status = errc::remote_invalid_request},
                                 solicited);
                target_fail(nak_code::invalid_request, h.seq);
                return;
            }
            complete_rq_head({.wr_id = recv_head().wr_id,
                              .opcode = opcode::recv,
                              .status = {},
                              .byte_len = h.length,
                              .with_invalidate = true,
                              .invalidated_key = h.key},
                             solicited);
            break;
        }
        complete_rq_head(
            {.wr_id = recv_head().wr_id, .opcode = opcode::recv, .status = {}, .byte_len = h.length},
            solicited);
        break;
    case rx_action::recv_overflow:
        // As verbs: the receiver sees a local length error, the sender an invalid request,
        // and both connections go to error.
        complete_rq_head(
            {.wr_id = recv_head().wr_id, .opcode = opcode::unknown, .status = errc::local_length}, solicited);
        target_fail(nak_code::invalid_request, h.seq);
        return;
    case rx_action::rnr:
        push_response({.op = frame_op::nak, .code = nak_code::rnr, .seq = h.seq, .data = {}});
        seq_.nak_rnr();
        return;
    case rx_action::drop: return;
    case rx_action::write:
        if (rx_.fault) {
            target_fail(nak_code::remote_access, h.seq);
            return;
        }
        break;
    case rx_action::write_imm:
        if (rx_.fault) {
            target_fail(nak_code::remote_access, h.seq);
            return;
        }
        complete_rq_head({.wr_id = recv_head().wr_id,
                          .opcode = opcode::recv_with_imm,
                          .status = {},
                          .byte_len = h.length,
                          .imm = h.imm,
                          .with_imm = true},
                         solicited);
        break;
    case rx_action::write_bad: target_fail(nak_code::remote_access, h.seq); return;
    case rx_action::read_resp:
        if (rx_.fault) {
            complete_sq_head(errc::local_protection, 0);
            fail(connection_state::error, errc::local_protection);
            return;
        }
        complete_sq_head({}, h.length);
        return;
    case rx_action::atomic: {
        auto old = execute_atomic(h);
        if (!old) {
            target_fail(nak_code::remote_access, h.seq);
            return;
        }
        // Answered by its ATOMIC_RESP (never by an ACK), as a read by its READ_RESP.
        seq_.carried_out();
        response r{.op = frame_op::atomic_resp, .code = nak_code::rnr, .seq = h.seq, .data = {}};
        store_le64(r.value.data(), *old);
        push_response(r);
        return;
    }
    case rx_action::atomic_resp: finish_atomic_response(); return;
    case rx_action::cma: serve_cma(h); return;
    }
    // A request that was carried out: the next one may come, and it is acknowledged.
    seq_.carried_out();
    push_ack(h.seq);
}

} // namespace rdmx::tcp
