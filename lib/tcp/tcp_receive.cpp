// Receive framing: reads headers into the stage and payloads into their destinations, on
// the engine thread (rx_run) or, under mu_, on a polling application thread (rx_read).
#include "tcp/tcp_engine.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <boost/asio/post.hpp>

#include "tcp/tcp_log.hpp"
#include "tcp/tcp_syscall.hpp"

namespace rdmx::tcp
{

void connection_engine::arm_read() noexcept
{
    if (work_.outstanding(engine_work::kind::read_wait) || rx_state_ == rx_state::done || closed_)
        return;
    if (ownership_.app_owns()) {
        reclaim_rx(); // the engine reads again (after a stall): the wait needs the socket
        return;
    }
    if (staged_work()) {
        // Frames already staged (a run ended on its budget): the socket may stay silent.
        continue_rx();
        return;
    }
    if (link_.must_read_before_wait(app_discard_)) {
        // The doorbells first, then the flag, as stream_link::recv does (a doorbell left in the
        // socket would wake this wait at once, and a sleeper on the domain's sockets too).
        // Bytes in the ring, which no doorbell announces (the peer wrote them before the
        // flag went up, or a poller left them), or the end of the stream: read them now.
        continue_rx();
        return;
    }
    if (sleeper_takes_over()) {
        if (stand_down())
            return; // the next data wakes the poller sleeping on the queue's sockets
        if (link_.ring_has_data()) {
            continue_rx(); // the refusal may have read the doorbell of these bytes
            return;
        }
    }
    link_.set_wake_mark(stream_link::wake_mark_for(rx_to_come()));
    work_.start(engine_work::kind::read_wait);
    desc_.async_wait(asio::posix::stream_descriptor::wait_read,
                     with_memory(hmem_, [self = shared_from_this()](const boost::system::error_code&) {
                         // The mutex held means the application is in a call (post, poll) right now.
                         bool app_in_call = false;
                         engine_lock lk(self->mu_, app_in_call);
                         self->assert_on_engine();
                         self->work_.ran(engine_work::kind::read_wait);
                         if (self->app_took_data(app_in_call) && self->stand_down())
                             return;
                         // Before this run's completions fire the arming (sleeper_takes_over).
                         self->wake_saw_sleeper_ = self->queues_watched();
                         self->rx_run();
                         self->wake_saw_sleeper_ = false;
                     }));
}

std::uint64_t connection_engine::rx_to_come() const noexcept
{
    // A read run may have staged part of it ahead (a payload read that ran on).
    if (rx_.action == rx_action::none || state() != connection_state::established)
        return 0;
    return rx_.left - std::min<std::uint64_t>(staged(), rx_.left);
}

void connection_engine::continue_rx() noexcept
{
    if (!work_.start(engine_work::kind::rx_continue))
        return;
    asio::post(dom_.io(), with_memory(hmem_, [self = shared_from_this()] {
                   engine_lock lk(self->mu_);
                   self->assert_on_engine();
                   self->work_.ran(engine_work::kind::rx_continue);
                   // Stood down for an application that polls this connection: its next
                   // poll() goes on itself. For a shared queue's poller, the engine does
                   // (and takes the socket back at the end of the run).
                   if (!self->ownership_.app_owns() || self->on_shared_cq_)
                       self->rx_run();
               }));
}

void connection_engine::resume_rx() noexcept
{
    if (rx_state_ == rx_state::stalled) // an end of reading stays the end
        rx_state_ = rx_state::reading;
    resume_queue_watch();
    asio::post(dom_.io(), with_memory(hmem_, [self = shared_from_this()] {
                   engine_lock lk(self->mu_);
                   self->assert_on_engine();
                   if (!self->work_.outstanding(engine_work::kind::read_wait))
                       self->rx_run();
               }));
}

void connection_engine::rx_run() noexcept
{
    if (closed_ || rx_state_ != rx_state::reading)
        return;
    rx_short_ = false;
    const rx_status s = rx_steps(true);
    keep_rcvlowat_reachable();
    pump();
    // Waiting for data, or the budget used up (the engine serves its other connections:
    // readiness is re-checked when the wait is armed, and staged frames continue by a
    // post, so nothing is lost).
    if (s != rx_status::stop)
        arm_read();
}

connection_engine::rx_status connection_engine::rx_steps(bool drain) noexcept
{
    // Established at every step: a frame that failed the connection (a target error)
    // leaves the frames staged behind it uninterpreted. They were sent before the peer
    // learnt of the failure (their sequence numbers run past the failed one, which is not
    // carried out): interpreted, they would read as a protocol violation that ends the
    // connection without the NAK that says why.
    rx_status s = rx_status::again;
    for (int budget = 0; budget < rx_budget && s == rx_status::again; ++budget) {
        const bool established = state() == connection_state::established;
        if (!established && !drain)
            s = rx_status::stop;
        else
            s = established ? rx_step() : rx_drain();
    }
    settle_rx(true);
    return s;
}

void connection_engine::settle(rx_chunk& c) noexcept
{
    if (!c.copy.empty() && !dom_.bounce().finish(c.copy))
        rx_.fault = true; // the frame they belong to fails when it ends
    for (int i = 0; i < c.npins; ++i)
        unpin(c.pins[i]);
    c.npins = 0;
}

void connection_engine::settle_rx(bool release) noexcept
{
    for (rx_chunk& c : rx_chunks_) {
        settle(c);
        if (release && c.p) {
            dom_.bounce().give(c.p);
            c.p = nullptr;
        }
    }
}

connection_engine::rx_status connection_engine::rx_error(ssize_t n, int err) noexcept
{
    if (n < 0 && err == EINTR)
        return rx_status::again;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK))
        return rx_status::wait;
    if (n < 0 && err == EPROTO && link_.uses_rings()) {
        protocol_violation("an index of the peer's ring out of range", false);
        return rx_status::stop;
    }
    // EOF or a reset: the peer disconnected or crashed.
    peer_gone();
    return rx_status::stop;
}

connection_engine::rx_status connection_engine::rx_drain() noexcept
{
    std::span<std::byte> sink = rx_sink();
    const iovec v{sink.data(), sink.size()};
    ssize_t n = link_recv(&v, 1);
    if (n > 0)
        return rx_status::again;
    return rx_error(n, errno);
}

connection_engine::rx_status connection_engine::rx_step() noexcept
{
    if (rx_.action != rx_action::none)
        return staged() > 0 ? rx_staged_payload() : rx_payload();
    if (staged() < frame_header::wire_size) {
        // A read that came back short in this run drained the socket: another would only
        // say EAGAIN. (Per run: the next one starts from a wake-up or a poll and reads.)
        if (rx_short_)
            return rx_status::wait;
        const std::span<std::byte> room = stage_.room_after();
        const iovec v{room.data(), room.size()};
        ssize_t n = link_recv(&v, 1);
        if (n <= 0)
            return rx_error(n, errno);
        rx_bytes_ += static_cast<std::uint64_t>(n); // the peer sent bytes: alive
        stage_.filled(static_cast<std::size_t>(n));
        rx_short_ = static_cast<std::size_t>(n) < room.size();
        if (staged() < frame_header::wire_size)
            return rx_status::again;
    }
    frame_header h;
    const char* why = "";
    if (frame_header::decode(stage_.data(), h, &why)) {
        protocol_violation(why, false);
        return rx_status::stop;
    }
    if (goodbye_ == goodbye::heard) {
        // GOODBYE is the peer's last frame (section 6): anything after it, a second
        // GOODBYE too, is a violation, not a request to serve.
        protocol_violation("a frame after the peer's GOODBYE", false);
        return rx_status::stop;
    }
    if (h.is_request() && resp_.full()) {
        // Backpressure: leave the header staged and stop reading until a response has
        // gone out. A peer within max_rd_atomic never gets here.
        rx_state_ = rx_state::stalled;
        pause_queue_watch();
        return rx_status::stop;
    }
    stage_.consume(frame_header::wire_size);
    begin_frame(h);
    if (rx_.action != rx_action::none && rx_.left == 0)
        finish_frame();
    return rx_state_ == rx_state::done ? rx_status::stop : rx_status::again;
}

void connection_engine::begin_frame(const frame_header& h) noexcept
{
    rx_.begin(h);
    if (h.is_request())
        begin_request(h);
    else
        begin_response(h);
}

connection_engine::rx_status connection_engine::rx_payload() noexcept
{
    if (rx_short_)
        return rx_status::wait; // drained in this run (see rx_step)
    // Empty (rx_step consumed it): the read ahead below may fill it.
    const std::span<std::byte> ahead = stage_.empty_for_read_ahead();
    iovec iov[max_iov];
    region_state* pinned[max_iov];
    int niov = 0, npinned = 0;
    std::uint64_t planned = 0;
    // Staged memory (device memory) is read into a chunk and copied to its place after
    // the call: where each such piece goes, and which iovec holds it.
    struct staged_piece {
        int iov;
        const seg* s;
        std::byte* dst;
    };
    staged_piece staged[copy_batch::max_copies];
    int nstaged = 0;
    rx_chunk* chunk = nullptr; // the one this call fills, its earlier copies finished
    std::uint64_t bounce_used = 0;
    // The domain's sink is the engine's; the application thread (rx_poll) has its own.
    std::span<std::byte> sink = rx_sink();
    if (rx_.to_memory()) {
        std::uint32_t i = rx_.seg_i;
        std::uint64_t off = rx_.seg_off;
        while (planned < rx_.left && i < rx_.nseg && niov < max_iov - 1) {
            const seg& s = rx_.segs[i];
            std::uint64_t n = std::min(s.len - off, rx_.left - planned);
            void* base = s.ptr + off;
            if (s.st && !pin(s.st, s.tag)) {
                // Deregistered mid-payload: those bytes are read and dropped, and the
                // request fails when the frame ends.
                rx_.fault = true;
                base = sink.data();
                n = std::min<std::uint64_t>(n, sink.size());
                iov[niov++] = {base, static_cast<std::size_t>(n)};
                planned += n;
                break;
            }
            if (s.st && s.st->stage != staging::none) {
                if (!chunk) {
                    chunk = &rx_chunks_[rx_turn_];
                    settle(*chunk); // its previous read's copies
                    if (!chunk->p && !(chunk->p = dom_.bounce().take())) {
                        unpin(s.st);
                        log_limited("no memory for a staging buffer: a frame into staged memory fails");
                        rx_.fault = true; // dropped, and the request fails when the frame ends
                        base = sink.data();
                        n = std::min<std::uint64_t>(n, sink.size());
                        iov[niov++] = {base, static_cast<std::size_t>(n)};
                        planned += n;
                        break;
                    }
                }
                const std::uint64_t room = dom_.bounce().chunk_size() - bounce_used;
                if (room == 0 || nstaged == copy_batch::max_copies) {
                    unpin(s.st);
                    break; // the chunk is full: the rest in the next call
                }
                // Pinned until its copy to its place finished (after the call).
                staged[nstaged++] = {niov, &s, static_cast<std::byte*>(base)};
                base = chunk->p + bounce_used;
                if (n > room) { // what the chunk holds now, the rest in the next call
                    iov[niov++] = {base, static_cast<std::size_t>(room)};
                    planned += room;
                    break;
                }
                bounce_used += n;
            } else if (s.st) {
                pinned[npinned++] = s.st;
            }
            iov[niov++] = {base, static_cast<std::size_t>(n)};
            planned += n;
            off = 0;
            ++i;
        }
    } else {
        std::uint64_t n = std::min<std::uint64_t>(rx_.left, sink.size());
        iov[niov++] = {sink.data(), static_cast<std::size_t>(n)};
        planned = n;
    }
    // Read ahead into the (empty) stage when this call can finish the payload: the next
    // frames come with it, saving a system call per frame.
    std::uint64_t want = planned;
    if (planned == rx_.left) {
        iov[niov++] = {ahead.data(), ahead.size()};
        want += ahead.size();
    }
    ssize_t n = link_recv(iov, niov);
    int err = errno;
    if (nstaged > 0) {
        // What arrived in the chunk goes to its place: the copies start now and run while
        // the next read fills the other chunk; finish_frame (or the end of the read run)
        // waits for them. Each destination stays pinned till then.
        std::uint64_t got = n > 0 ? static_cast<std::uint64_t>(n) : 0;
        std::uint64_t at = 0;
        for (int k = 0, p = 0; k < niov && p < nstaged; ++k) {
            const std::uint64_t len = iov[k].iov_len;
            if (staged[p].iov == k) {
                const std::uint64_t in = got > at ? std::min(got - at, len) : 0;
                const seg& s = *staged[p].s;
                if (in > 0 &&
                    !dom_.bounce().start(chunk->copy, false, s.st->stage, s.st->device, staged[p].dst,
                                         static_cast<const std::byte*>(iov[k].iov_base), in))
                    rx_.fault = true; // the request fails when the frame ends
                dom_.bounce().count_in(in);
                chunk->pins[chunk->npins++] = s.st;
                ++p;
            }
            at += len;
        }
        rx_turn_ ^= 1;
    }
    for (int i = 0; i < npinned; ++i)
        unpin(pinned[i]);
    if (n <= 0)
        return rx_error(n, err);
    rx_bytes_ += static_cast<std::uint64_t>(n); // the peer sent bytes: alive
    std::uint64_t got = static_cast<std::uint64_t>(n);
    rx_short_ = got < want;
    std::uint64_t payload = std::min(got, rx_.left);
    stage_.read_ahead_took(static_cast<std::size_t>(got - payload));
    rx_.left -= payload;
    if (rx_.to_memory())
        rx_.advance(payload);
    if (rx_.left == 0)
        finish_frame();
    return rx_state_ == rx_state::done ? rx_status::stop : rx_status::again;
}

connection_engine::rx_status connection_engine::rx_staged_payload() noexcept
{
    // The payload bytes that arrived with the header: copied out of the stage.
    std::uint64_t n = std::min<std::uint64_t>(staged(), rx_.left);
    if (rx_.to_memory()) {
        const std::byte* src = stage_.data();
        std::uint64_t left = n;
        while (left > 0 && rx_.seg_i < rx_.nseg) {
            const seg& s = rx_.segs[rx_.seg_i];
            std::uint64_t step = std::min(s.len - rx_.seg_off, left);
            if (s.st && !pin(s.st, s.tag)) {
                rx_.fault = true; // deregistered: dropped, and the request fails at the end
            } else if (s.st && s.st->stage != staging::none) {
                if (!dom_.bounce().copy_now(false, s.st->stage, s.st->device, s.ptr + rx_.seg_off, src, step))
                    rx_.fault = true; // the request fails when the frame ends
                dom_.bounce().count_in(step);
                unpin(s.st);
            } else {
                std::memcpy(s.ptr + rx_.seg_off, src, step);
                if (s.st)
                    unpin(s.st);
            }
            src += step;
            left -= step;
            rx_.advance(step);
        }
    }
    stage_.consume(static_cast<std::size_t>(n));
    rx_.left -= n;
    if (rx_.left == 0)
        finish_frame();
    return rx_state_ == rx_state::done ? rx_status::stop : rx_status::again;
}

} // namespace rdmx::tcp
