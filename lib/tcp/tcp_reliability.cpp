// Reliability and liveness: the initiator's side of ACK / NAK / RNR with go-back-N, the
// protocol-violation and peer-gone exits, and the dead-peer timer.
#include "tcp/tcp_engine.hpp"

#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>

#include "tcp/tcp_log.hpp"

namespace rdmx::tcp
{

std::error_code nak_status(nak_code c) noexcept
{
    switch (c) {
    case nak_code::rnr: return errc::rnr_retry_exceeded;
    case nak_code::remote_access: return errc::remote_access;
    case nak_code::invalid_request: return errc::remote_invalid_request;
    case nak_code::remote_operation: return errc::remote_operation;
    case nak_code::cma_refused: return errc::remote_operation; // handled by on_nak, never a status
    }
    return errc::bad_response;
}

void connection_engine::protocol_violation(const char* why, bool blame_head) noexcept
{
    if (!violation_logged_) {
        violation_logged_ = true;
        log_limited("closing connection: peer violated the wire protocol (%s)", why);
    }
    if (blame_head && state() == connection_state::established && sq_.in_flight())
        complete_sq_head(errc::bad_response, 0);
    fail(connection_state::error, errc::protocol_error);
    // A peer that sends garbage gets no more of our attention: stop reading and writing.
    rx_state_ = rx_state::done;
    tx_.shut();
    ::shutdown(fd_, SHUT_RDWR);
}

void connection_engine::peer_gone() noexcept
{
    rx_state_ = rx_state::done;
    // A peer that says goodbye and did not: its process died (or its host reset us).
    if (goodbye_ == goodbye::promised)
        fail(connection_state::error, errc::peer_lost);
    else
        fail(connection_state::disconnected);
    linger_check();
}

void connection_engine::begin_response(const frame_header& h) noexcept
{
    switch (h.op) {
    case frame_op::ack: on_ack(h.seq); return;
    case frame_op::goodbye:
        // Only a peer that set the GOODBYE flag may send one (it declared that it ends its
        // connections so); one that did not is not speaking version 2.
        if (goodbye_ == goodbye::not_promised) {
            protocol_violation("GOODBYE from a peer whose handshake did not set the GOODBYE flag", false);
            return;
        }
        goodbye_ = goodbye::heard; // EOF follows: a clean disconnect
        return;
    case frame_op::nak: on_nak(h.seq, static_cast<nak_code>(h.status)); return;
    case frame_op::read_resp: {
        if (!sq_.in_flight() || h.seq != sq_.head()) {
            protocol_violation("read response out of sequence", true);
            return;
        }
        const send_queue::entry& e = sq_.at(sq_.head());
        if (e.op != opcode::read || h.length != e.length) {
            protocol_violation("read response does not match the read", true);
            return;
        }
        rx_.into(rx_action::read_resp, sq_.segs(sq_.head()), e.nseg);
        return;
    }
    case frame_op::read_cma_resp: {
        if (!sq_.in_flight() || h.seq != sq_.head()) {
            protocol_violation("read response out of sequence", true);
            return;
        }
        const send_queue::entry& e = sq_.at(sq_.head());
        if (e.op != opcode::read || !e.via_cma || h.length != e.length) {
            protocol_violation("CMA read response does not match the read", true);
            return;
        }
        finish_read_cma(h);
        return;
    }
    case frame_op::atomic_resp: {
        if (!sq_.in_flight() || h.seq != sq_.head()) {
            protocol_violation("atomic response out of sequence", true);
            return;
        }
        const opcode op = sq_.at(sq_.head()).op;
        if (op != opcode::fetch_add && op != opcode::compare_swap) {
            protocol_violation("atomic response does not answer an atomic", true);
            return;
        }
        // The value comes to the engine first: it lands in the SGE at the end of the
        // frame, in host byte order (finish_atomic_response).
        rx_.into_operands(rx_action::atomic_resp, atomic_resp_payload);
        return;
    }
    default: break;
    }
    protocol_violation("unexpected response opcode", true);
}

void connection_engine::on_ack(std::uint64_t seq) noexcept
{
    if (seq < sq_.head() || seq >= sq_.next()) {
        protocol_violation("ack for a request not in flight", true);
        return;
    }
    while (sq_.head() <= seq && state() == connection_state::established) {
        if (send_queue::reads_or_atomic(sq_.at(sq_.head()).op)) {
            protocol_violation("ack covers a read or an atomic", true);
            return;
        }
        if (sq_.at(sq_.head()).via_cma)
            note_cma_completed();
        complete_sq_head({}, sq_.at(sq_.head()).length);
    }
}

void connection_engine::on_nak(std::uint64_t seq, nak_code code) noexcept
{
    if (seq != sq_.head() || !sq_.in_flight()) {
        protocol_violation("nak for a request not at the head", true);
        return;
    }
    if (code == nak_code::cma_refused) {
        on_cma_refused(seq);
        return;
    }
    if (code != nak_code::rnr) {
        complete_sq_head(nak_status(code), 0);
        fail(connection_state::error, nak_status(code));
        return;
    }
    // As on verbs, each retry waits the RNR timer (connection_options::min_rnr_timer): the
    // engine's timer, or a poll that comes after it is due (retry_rnr_if_due), whichever is
    // first.
    if (!rnr_.on_nak(seq, std::chrono::steady_clock::now() + rnr_delay_)) {
        complete_sq_head(errc::rnr_retry_exceeded, 0);
        fail(connection_state::error, errc::rnr_retry_exceeded);
        return;
    }
    sq_.go_back(seq); // everything from it on was dropped by the peer
    rnr_timer_.expires_after(rnr_delay_);
    auto on_timer = [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        // A poll may have retried first; and a wait that completed before the next NAK
        // re-armed the timer (its handler queued, the thread off the CPU) is that NAK's
        // too early: its own wait comes.
        if (!self->rnr_.due(std::chrono::steady_clock::now()))
            return;
        self->rnr_.waited();
        self->pump();
    };
    rnr_timer_.async_wait(with_memory(hmem_, std::move(on_timer)));
}

void connection_engine::arm_progress_check() noexcept
{
    progress_timer_.expires_after(live_.check_interval());
    auto on_timer = [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        self->check_progress();
    };
    progress_timer_.async_wait(with_memory(hmem_, std::move(on_timer)));
}

void connection_engine::check_progress() noexcept
{
    if (closed_ || state() != connection_state::established)
        return; // nothing outstanding any more: the timer stops here
    auto unread = [this]() -> long long {
        int n = 0;
        return ::ioctl(fd_, FIONREAD, &n) == 0 ? n : -1;
    };
    if (!live_.alive(std::chrono::steady_clock::now(), rx_bytes_ + tx_bytes_, rx_bytes_, !sq_.empty(),
                     unread)) {
        // The peer has neither answered nor taken any byte for the whole budget of retries.
        complete_sq_head(errc::transport_retry_exceeded, 0);
        fail(connection_state::error, errc::transport_retry_exceeded);
        pump();
        return;
    }
    arm_progress_check();
}

} // namespace rdmx::tcp
