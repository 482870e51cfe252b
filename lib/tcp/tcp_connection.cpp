// The TCP connection engine. docs/wire-format.md states the protocol; this file keeps the
// verbs RC promises on top of it: in-order completions, acknowledged sends and writes,
// RNR with go-back-N, fences, and revocable remote access.
#include "tcp/tcp_connection.hpp"

#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <boost/asio/post.hpp>

#include "tcp/tcp_log.hpp"
#include "validate.hpp"

namespace rdmx::tcp
{
namespace
{

rdmx::opcode completion_opcode(rdmx::opcode op) noexcept
{
    // As verbs: a write_with_imm completes at the initiator as an RDMA write.
    return op == opcode::write_with_imm ? opcode::write : op;
}

std::error_code nak_status(nak_code c) noexcept
{
    switch (c) {
    case nak_code::rnr: return errc::rnr_retry_exceeded;
    case nak_code::remote_access: return errc::remote_access;
    case nak_code::invalid_request: return errc::remote_invalid_request;
    case nak_code::remote_operation: return errc::remote_operation;
    }
    return errc::bad_response;
}

// The data path's socket calls, without glibc's wrappers. In a process of more than one
// thread, recv() and sendmsg() are cancellation points: glibc switches the caller to
// asynchronous cancellation around the system call and back (two atomic read-modify-writes
// of the thread's cancellation state). rdmx cancels no thread, and these calls never block
// (MSG_DONTWAIT), so that is pure cost: 5-6 % of a busy poller's samples here (profile
// section 18). Same results and errno as the libc calls. Sanitizer builds keep the libc
// calls: ASan and TSan check the buffers a system call reads and writes only through
// their interceptors of those.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
constexpr bool sanitized = __has_feature(address_sanitizer) || __has_feature(thread_sanitizer);
#else
constexpr bool sanitized = false;
#endif

ssize_t sys_recv(int fd, void* buf, std::size_t len, int flags) noexcept
{
    if constexpr (sanitized)
        return ::recv(fd, buf, len, flags);
    return ::syscall(SYS_recvfrom, fd, buf, len, flags, nullptr, nullptr);
}
ssize_t sys_recvmsg(int fd, msghdr* mh, int flags) noexcept
{
    if constexpr (sanitized)
        return ::recvmsg(fd, mh, flags);
    return ::syscall(SYS_recvmsg, fd, mh, flags);
}
ssize_t sys_sendmsg(int fd, const msghdr* mh, int flags) noexcept
{
    if constexpr (sanitized)
        return ::sendmsg(fd, mh, flags);
    return ::syscall(SYS_sendmsg, fd, mh, flags);
}

} // namespace

conn_state::conn_state(tcp_domain& dom, unique_fd fd, const connection_limits& lim,
                       const connection_options& opts, std::uint32_t peer_max_rd)
    : dom_(dom), lim_(lim), rnr_limit_(opts.rnr_retry_count > 7 ? 7 : opts.rnr_retry_count),
      rnr_delay_(detail::rnr_delay(opts.min_rnr_timer)),
      max_rd_out_(std::max<std::uint32_t>(1, std::min(lim.max_rd_atomic, peer_max_rd))), fd_(fd.get()),
      efd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), sq_(lim.send_queue_depth),
      sq_segs_(std::size_t{lim.send_queue_depth} * lim.max_send_sge),
      sq_inline_(std::size_t{lim.send_queue_depth} * lim.max_inline), rq_(lim.recv_queue_depth),
      rq_segs_(std::size_t{lim.recv_queue_depth} * lim.max_recv_sge),
      cq_(std::size_t{lim.send_queue_depth} + lim.recv_queue_depth),
      // A well-behaved peer has at most max_rd_atomic reads outstanding here; between them
      // at most one ACK each (ACKs coalesce), plus the NAKs of an RNR cycle.
      resp_(2 * std::size_t{lim.max_rd_atomic} + 8), desc_(dom.io(), fd.release()), rnr_timer_(dom.io()),
      takeover_check_(std::clamp<std::chrono::microseconds>(
          opts.tcp.takeover_check, std::chrono::microseconds(100), std::chrono::seconds(1))),
      standdown_timer_(dom.io()), tx_check_timer_(dom.io()), linger_timer_(dom.io()),
      // At least 1 s: below that the kernel's own retransmission timeouts (200 ms at the
      // least, doubling) on a lossy link would look like a dead peer.
      progress_timeout_(std::max<std::chrono::steady_clock::duration>(
          opts.ack_timeout * (std::min<int>(opts.retry_count, 7) + 1), std::chrono::seconds(1))),
      progress_timer_(dom.io())
{
    if (!efd_)
        throw_errno(errno, "eventfd");
    set_liveness_options(fd_, std::chrono::duration_cast<std::chrono::milliseconds>(progress_timeout_));
}

conn_state::~conn_state()
{
    // Stood down, the descriptor object does not hold the socket; close it here (the io
    // context dropped the close handler, e.g. when the domain went first).
    if (rx_app_owned_)
        ::close(fd_);
}

void conn_state::start()
{
    asio::post(dom_.io(), [self = shared_from_this()] {
        std::lock_guard lk(self->mu_);
        self->rx_run();
        self->arm_progress_check();
        // Asio's timer queue (one heap per engine) allocates when more timers are pending
        // at once than ever before: make room for the stand-down check now, at set-up,
        // rather than the first time the engine stands down.
        self->standdown_timer_.expires_after(std::chrono::hours(1));
        self->standdown_timer_.async_wait([](const boost::system::error_code&) {});
        self->tx_check_timer_.expires_after(std::chrono::hours(1));
        self->tx_check_timer_.async_wait([](const boost::system::error_code&) {});
        self->standdown_timer_.cancel();
        self->tx_check_timer_.cancel();
    });
}

void conn_state::arm_progress_check() noexcept
{
    // A few checks per timeout bound the detection time to 1.25 x the timeout.
    progress_timer_.expires_after(
        std::max<std::chrono::steady_clock::duration>(progress_timeout_ / 4, std::chrono::milliseconds(5)));
    auto on_timer = [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        std::lock_guard lk(self->mu_);
        self->check_progress();
    };
    progress_timer_.async_wait(with_memory(hmem_, std::move(on_timer)));
}

void conn_state::check_progress() noexcept
{
    if (closed_ || state() != connection_state::established)
        return; // nothing outstanding any more: the timer stops here
    auto now = std::chrono::steady_clock::now();
    // Bytes moved either way since the last look: the peer is alive. The data path only
    // counts them and reads no clock for it; timing them here makes last_progress_ at most
    // one interval late, which keeps detection within the same 1.25 x the timeout.
    if (std::uint64_t moved = rx_bytes_ + tx_bytes_; moved != progress_seen_) {
        progress_seen_ = moved;
        last_progress_ = now;
    }
    int unread = 0;
    if (sq_head_ == sq_tail_) {
        last_progress_ = now; // idle time is not silence
    } else if (now - last_progress_ >= progress_timeout_ && ::ioctl(fd_, FIONREAD, &unread) == 0 &&
               unread > 0 && rx_bytes_ + static_cast<std::uint64_t>(unread) > arrived_seen_) {
        // Bytes arrived since the last look and wait unread: below the wake threshold of a
        // slow payload (set_rcvlowat), or left to an application that stood the engine
        // down. The peer is alive. (One that stopped mid-payload fails at the next look.)
        last_progress_ = now;
        arrived_seen_ = rx_bytes_ + static_cast<std::uint64_t>(unread);
    } else if (now - last_progress_ >= progress_timeout_) {
        // The peer has neither answered nor taken any byte for the whole budget of retries.
        complete_sq_head(errc::transport_retry_exceeded, 0);
        fail(connection_state::error, errc::transport_retry_exceeded);
        pump();
        return;
    }
    arm_progress_check();
}

bool conn_state::on_engine() const noexcept
{
    return dom_.io().get_executor().running_in_this_thread();
}

// ---------------------------------------------------------------------------------------
// Application side

std::error_code conn_state::post(std::span<const work_request> wrs, std::size_t* posted) noexcept
{
    if (posted)
        *posted = 0;
    // Read before the lock: time spent waiting for the engine to let go of it does not make
    // a tight loop look idle.
    const auto entry = std::chrono::steady_clock::now();
    std::lock_guard lk(mu_);
    for (const auto& wr : wrs) {
        std::uint64_t total = 0;
        if (errc ec = detail::check_send(wr, dom_.owner(), backend::tcp, lim_, total); ec != errc{})
            return ec;
    }
    if (state() != connection_state::established) {
        // As on an errored QP: the requests are accepted and complete as flushed.
        for (const auto& wr : wrs)
            push_cq({.wr_id = wr.wr_id, .opcode = opcode::unknown, .status = errc::flushed});
        if (posted)
            *posted = wrs.size();
        return {};
    }
    app_busy_ = entry - last_call_end_ < busy_poll_window;
    ++app_calls_;
    std::size_t i = 0;
    for (; i < wrs.size(); ++i) {
        if (sq_tail_ - sq_head_ == lim_.send_queue_depth)
            break;
        const work_request& wr = wrs[i];
        sq_entry& e = sq_at(sq_tail_);
        e.wr_id = wr.wr_id;
        e.op = wr.opcode;
        e.signaled = has(wr.flags, send_flags::signaled);
        e.fenced = has(wr.flags, send_flags::fence);
        e.solicited = has(wr.flags, send_flags::solicited);
        e.imm = wr.imm;
        e.remote_addr = wr.remote.addr;
        e.remote_key = wr.remote.key;
        seg* segs = sq_segs(sq_tail_);
        std::uint64_t total = 0;
        e.nseg = 0;
        if (has(wr.flags, send_flags::inline_data)) {
            // Copied now, into the slot's own buffer: the caller may reuse its buffer at once.
            std::byte* buf = sq_inline_.data() + (sq_tail_ % lim_.send_queue_depth) * lim_.max_inline;
            for (const sge& s : wr.local) {
                std::memcpy(buf + total, s.region->data() + s.offset, s.length);
                total += s.length;
            }
            segs[e.nseg++] = {nullptr, 0, buf, total};
        } else {
            for (const sge& s : wr.local) {
                if (s.length == 0)
                    continue;
                segs[e.nseg++] = region_seg(*s.region, s.offset, s.length);
                total += s.length;
            }
        }
        e.length = static_cast<std::uint32_t>(total);
        ++sq_tail_;
    }
    if (posted)
        *posted = i;
    if (rx_app_owned_ && entry - last_app_rx_ >= app_rx_interval) {
        // Stood down, and the application posts without polling: read what came meanwhile
        // (ACKs, the peer's requests). What that owes goes out with the requests.
        last_app_rx_ = entry;
        rx_read();
    }
    if (coalesce_post())
        arm_tx_check(); // the next post() or poll() sends it, or the engine a check later
    else
        pump();
    last_call_end_ = std::chrono::steady_clock::now();
    if (i < wrs.size())
        return errc::would_block;
    return {};
}

std::error_code conn_state::post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept
{
    if (posted)
        *posted = 0;
    std::lock_guard lk(mu_);
    for (const auto& wr : wrs) {
        std::uint64_t total = 0;
        if (errc ec = detail::check_recv(wr, dom_.owner(), lim_, total); ec != errc{})
            return ec;
    }
    if (state() != connection_state::established) {
        for (const auto& wr : wrs)
            push_cq({.wr_id = wr.wr_id, .opcode = opcode::unknown, .status = errc::flushed});
        if (posted)
            *posted = wrs.size();
        return {};
    }
    std::size_t i = 0;
    for (; i < wrs.size(); ++i) {
        if (rq_tail_ - rq_head_ == lim_.recv_queue_depth)
            break;
        rq_entry& e = rq_at(rq_tail_);
        seg* segs = rq_segs(rq_tail_);
        e.wr_id = wrs[i].wr_id;
        e.length = 0;
        e.nseg = 0;
        for (const sge& s : wrs[i].local) {
            if (s.length == 0)
                continue;
            segs[e.nseg++] = region_seg(*s.region, s.offset, s.length);
            e.length += s.length;
        }
        ++rq_tail_;
    }
    if (posted)
        *posted = i;
    return i < wrs.size() ? make_error_code(errc::would_block) : std::error_code{};
}

std::size_t conn_state::poll(std::span<completion> out) noexcept
{
    std::lock_guard lk(mu_);
    last_poll_ = std::chrono::steady_clock::now();
    last_app_rx_ = last_poll_;
    ++app_polls_;
    ++app_calls_;
    app_busy_ = true;
    bool pumped = cq_count_ == 0 && rx_poll();
    if (!pumped && tx_next_ != sq_tail_)
        pump(); // requests that post() left to be coalesced, when rx_poll did not send
    std::size_t n = std::min(out.size(), cq_count_);
    for (std::size_t i = 0; i < n; ++i) {
        out[i] = cq_[cq_head_];
        cq_head_ = (cq_head_ + 1) % cq_.size();
    }
    cq_count_ -= n;
    last_call_end_ = std::chrono::steady_clock::now();
    return n;
}

std::error_code conn_state::request_notify(bool solicited_only) noexcept
{
    std::lock_guard lk(mu_);
    notify_armed_ = solicited_only ? 2 : 1;
    app_busy_ = false; // about to sleep: what is left to send is the engine's
    pump();            // an ACK that rx_poll left for this call: the caller may now sleep
    if (rx_app_owned_ && !reclaim_posted_) {
        // The application is about to sleep: the engine must read again.
        reclaim_posted_ = true;
        asio::post(dom_.io(), with_memory(hmem_, [self = shared_from_this()] {
                       std::lock_guard lk(self->mu_);
                       self->reclaim_posted_ = false;
                       if (!self->closed_)
                           self->reclaim_rx();
                   }));
    }
    return {};
}

std::error_code conn_state::ack_notify() noexcept
{
    std::uint64_t v;
    if (::read(efd_.get(), &v, sizeof v) < 0 && errno != EAGAIN)
        return {errno, std::system_category()};
    return {};
}

void conn_state::disconnect() noexcept
{
    std::lock_guard lk(mu_);
    app_busy_ = false;
    fail(connection_state::disconnected);
    pump();
}

void conn_state::close() noexcept
{
    {
        std::lock_guard lk(mu_);
        app_busy_ = false; // no call will come again: what is left to send is the engine's
        fail(connection_state::disconnected);
        pump();
        lingering_ = true;
    }
    // The descriptor belongs to the engine thread, and so does what is still owed.
    asio::post(dom_.io(), [self = shared_from_this()] {
        std::lock_guard lk(self->mu_);
        self->start_linger();
    });
}

void conn_state::start_linger() noexcept
{
    // The connection object is gone, but the peer is still owed the frame on the wire and
    // the responses (a NAK saying why, above all) and then FIN (docs/wire-format.md
    // section 6): the engine goes on sending them, and reads (discarding) until the peer's
    // EOF, so that closing never meets unread data (which would reset the connection and
    // could discard what is still on its way). Both done, or after progress_timeout_ at
    // the latest, the socket closes.
    rnr_timer_.cancel();
    progress_timer_.cancel(); // its handler holds the state (and its eventfd) alive
    standdown_timer_.cancel();
    tx_check_timer_.cancel();
    if (rx_app_owned_) {
        reclaim_rx(); // reads and sends on the engine again
    } else {
        arm_read();
        pump();
    }
    if (closed_)
        return;
    linger_timer_.expires_after(progress_timeout_);
    linger_timer_.async_wait(
        with_memory(hmem_, [self = shared_from_this()](const boost::system::error_code& ec) {
            if (ec == asio::error::operation_aborted)
                return;
            std::lock_guard lk(self->mu_);
            self->close_socket();
        }));
    linger_check();
}

void conn_state::linger_check() noexcept
{
    if (lingering_ && tx_done_ && rx_done_ && on_engine())
        close_socket();
}

void conn_state::close_socket() noexcept
{
    if (closed_)
        return;
    closed_ = true;
    // Closing the descriptor also cancels its waits.
    boost::system::error_code ignored;
    rnr_timer_.cancel();
    progress_timer_.cancel();
    standdown_timer_.cancel();
    tx_check_timer_.cancel();
    linger_timer_.cancel();
    if (rx_app_owned_) {
        rx_app_owned_ = false;
        ::close(fd_);
    } else {
        desc_.close(ignored);
    }
}

// ---------------------------------------------------------------------------------------
// Completions and failure

void conn_state::push_cq(const completion& c, bool solicited) noexcept
{
    if (cq_count_ == cq_.size()) {
        // CQ overrun is fatal on verbs too. The completion that did not fit is lost; the
        // flush that follows cannot add more (the ring is full), which is what verbs does.
        if (state() == connection_state::established) {
            log_limited("completion ring overrun (never polled?); connection to error");
            fail(connection_state::error);
        }
        return;
    }
    cq_[(cq_head_ + cq_count_) % cq_.size()] = c;
    ++cq_count_;
    bool is_recv = c.opcode == opcode::recv || c.opcode == opcode::recv_with_imm;
    if (notify_armed_ == 1 || (notify_armed_ == 2 && (c.status || (is_recv && solicited)))) {
        notify_armed_ = 0;
        std::uint64_t one = 1;
        // Only fails if the counter would overflow, which cannot happen with one per arm.
        [[maybe_unused]] auto r = ::write(efd_.get(), &one, sizeof one);
    }
}

void conn_state::complete_sq_head(std::error_code status, std::uint32_t byte_len) noexcept
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

void conn_state::complete_rq_head(const completion& c, bool solicited) noexcept
{
    ++rq_head_;
    push_cq(c, solicited);
}

void conn_state::fail(connection_state to, std::error_code cause) noexcept
{
    if (state() != connection_state::established)
        return;
    cause_ = cause ? cause
                   : make_error_code(to == connection_state::disconnected ? errc::disconnected
                                                                          : errc::completion_error);
    state_.store(to, std::memory_order_release);
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

void conn_state::push_response(const response& r) noexcept
{
    // Space was checked before the request's header was consumed (rx_step), and every
    // request produces at most one response.
    if (resp_tail_ - resp_head_ == resp_.size())
        return;
    resp_at(resp_tail_++) = r;
}

void conn_state::push_ack(std::uint64_t seq) noexcept
{
    // ACKs are cumulative: extend the last one unless it already started on the wire.
    if (resp_tail_ > resp_head_) {
        std::uint64_t last = resp_tail_ - 1;
        bool started = last == resp_head_ && cur_.kind == frame_kind::response;
        if (!started && resp_at(last).op == frame_op::ack) {
            resp_at(last).seq = seq;
            return;
        }
    }
    push_response({.op = frame_op::ack, .code = nak_code::rnr, .seq = seq, .data = {}});
}

void conn_state::target_fail(nak_code code, std::uint64_t seq) noexcept
{
    // As rxe and real HCAs: a class C responder error moves the responder's QP to error
    // too. The NAK is still sent (before our FIN) so that the initiator learns why.
    push_response({.op = frame_op::nak, .code = code, .seq = seq, .data = {}});
    fail(connection_state::error, nak_status(code));
}

void conn_state::protocol_violation(const char* why, bool blame_head) noexcept
{
    if (!violation_logged_) {
        violation_logged_ = true;
        log_limited("closing connection: peer violated the wire protocol (%s)", why);
    }
    if (blame_head && state() == connection_state::established && sq_head_ < tx_next_)
        complete_sq_head(errc::bad_response, 0);
    fail(connection_state::error, errc::protocol_error);
    // A peer that sends garbage gets no more of our attention: stop reading and writing.
    rx_done_ = true;
    tx_done_ = true;
    ::shutdown(fd_, SHUT_RDWR);
}

void conn_state::peer_gone() noexcept
{
    rx_done_ = true;
    fail(connection_state::disconnected);
    linger_check();
}

// ---------------------------------------------------------------------------------------
// Transmit: one pump, run under mu_ by whichever thread has something to send

void conn_state::add_frame(tx_batch& b, frame_kind kind, std::uint64_t pos, std::uint64_t skip) noexcept
{
    std::byte* hdr = b.headers[b.nitems];
    frame_header h;
    const seg* segs = nullptr;
    std::uint32_t nseg = 0;
    if (kind == frame_kind::request) {
        const sq_entry& e = sq_at(pos);
        h.seq = pos;
        h.length = e.length;
        switch (e.op) {
        case opcode::send: h.op = frame_op::send; break;
        case opcode::write: h.op = frame_op::write; break;
        case opcode::write_with_imm: h.op = frame_op::write_imm; break;
        default: h.op = frame_op::read_req; break;
        }
        if (h.op != frame_op::send) {
            h.addr = e.remote_addr;
            h.key = e.remote_key;
        }
        if (h.op == frame_op::write_imm)
            h.imm = e.imm;
        if (e.solicited && (h.op == frame_op::send || h.op == frame_op::write_imm))
            h.flags = flag_solicited;
        if (h.op != frame_op::read_req) {
            segs = sq_segs(pos);
            nseg = e.nseg;
        }
    } else {
        const response& r = resp_at(pos);
        h.op = r.op;
        h.seq = r.seq;
        if (r.op == frame_op::nak)
            h.status = static_cast<std::uint32_t>(r.code);
        if (r.op == frame_op::read_resp) {
            h.length = static_cast<std::uint32_t>(r.data.len);
            segs = &r.data;
            nseg = 1;
        }
    }
    h.encode(hdr);

    tx_item& it = b.items[b.nitems++];
    it = {.kind = kind,
          .pos = pos,
          .skip = skip,
          .added = 0,
          .total = frame_header::wire_size + h.payload_length(),
          .was_current = skip > 0};
    std::uint64_t off = skip; // position within the frame where this batch starts
    std::uint64_t at = 0;     // start of the current piece within the frame
    auto add = [&](std::byte* p, std::uint64_t len, region_state* st, std::uint64_t tag) {
        if (b.closed || len == 0)
            return;
        if (off >= at + len) {
            at += len;
            return;
        }
        if (b.niov == max_iov) {
            b.closed = true;
            return;
        }
        std::uint64_t from = off - at;
        std::uint64_t n = len - from;
        void* base = p + from;
        if (st) {
            if (!pin(st, tag)) {
                // Deregistered: none of it may be sent, and no stand-in either (a reader
                // would take zeros for data). pump() withdraws the frame (revoked_frame).
                b.revoked = b.closed = true;
                return;
            }
            b.pinned[b.npinned++] = st;
        }
        b.iov[b.niov++] = {base, static_cast<std::size_t>(n)};
        it.added += n;
        off += n;
        at += len;
        if (off < at) // the piece was cut short: the rest comes in a later batch
            b.closed = true;
    };
    add(hdr, frame_header::wire_size, nullptr, 0);
    for (std::uint32_t i = 0; i < nseg && h.payload_length() > 0; ++i)
        add(segs[i].ptr, segs[i].len, segs[i].st, segs[i].tag);
    if (skip + it.added < it.total)
        b.closed = true;
}

void conn_state::pump() noexcept
{
    // An application thread sends even while the engine holds a continuation (write_armed_):
    // the engine may share its CPU and run only when the application yields it, so a busy
    // application that leaves large transfers to the engine halves its own bandwidth. The
    // continuation stays armed (arm_write adds none) and finds less or nothing left to do.
    if (closed_ || tx_done_ || in_pump_ || (write_armed_ && on_engine()))
        return;
    in_pump_ = true;
    // Bounded work per call: post() must stay short on the application thread, and the
    // engine must not starve its other connections behind one large transfer. What is left
    // continues on the engine once the socket is writable (at once, if it is).
    std::uint64_t budget = on_engine() ? engine_tx_budget : app_tx_budget;
    for (;;) {
        if (budget == 0) {
            if (!app_keeps_tx())
                arm_write(false);
            break;
        }
        tx_batch& b = batch_;
        b.niov = b.nitems = b.npinned = 0;
        b.closed = b.revoked = false;
        // Adds a frame whole; false if its memory was deregistered: then it is not in the batch.
        auto add_live = [&](frame_kind kind, std::uint64_t pos, std::uint64_t skip) {
            int niov = b.niov, npinned = b.npinned, nitems = b.nitems;
            add_frame(b, kind, pos, skip);
            if (!b.revoked)
                return true;
            for (int i = npinned; i < b.npinned; ++i)
                unpin(b.pinned[i]);
            b.niov = niov;
            b.npinned = npinned;
            b.nitems = nitems;
            b.closed = b.revoked = false;
            return false;
        };
        if (cur_.kind != frame_kind::none && !add_live(cur_.kind, cur_.pos, cur_.skip)) {
            revoked_frame(frame_kind::none, 0);
            break;
        }
        // Responses first: they free the peer's resources, and are bounded in number.
        std::uint64_t r = resp_head_ + (cur_.kind == frame_kind::response ? 1 : 0);
        for (; !b.closed && b.nitems < max_batch_frames && r < resp_tail_; ++r)
            if (!add_live(frame_kind::response, r, 0)) {
                revoked_frame(frame_kind::response, r); // now a NAK, the last response
                add_frame(b, frame_kind::response, r, 0);
            }
        if (state() == connection_state::established && !rnr_active_) {
            std::uint64_t q = tx_next_;
            std::uint32_t reads = reads_in_flight_;
            while (!b.closed && b.nitems < max_batch_frames && q < sq_tail_) {
                const sq_entry& e = sq_at(q);
                // Fence: this request waits until every earlier read has completed, so
                // that e.g. a write cannot overtake the read of the same bytes.
                if (e.fenced && reads > 0)
                    break;
                // The peer serves at most max_rd_out_ reads at once (its responder resources).
                if (e.op == opcode::read && reads >= max_rd_out_)
                    break;
                if (!add_live(frame_kind::request, q, 0)) {
                    if (q == tx_next_) // else the earlier ones in this batch go first
                        revoked_frame(frame_kind::request, q);
                    break;
                }
                if (e.op == opcode::read)
                    ++reads;
                ++q;
            }
        }
        if (b.nitems == 0) {
            maybe_shutdown();
            break;
        }
        msghdr mh{};
        mh.msg_iov = b.iov;
        mh.msg_iovlen = static_cast<std::size_t>(b.niov);
        ssize_t n = sys_sendmsg(fd_, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        int err = errno;
        for (int i = 0; i < b.npinned; ++i)
            unpin(b.pinned[i]);
        if (n > 0)
            tx_bytes_ += static_cast<std::uint64_t>(n); // the peer took bytes: alive
        if (n < 0) {
            if (err == EINTR)
                continue;
            if (err == EAGAIN || err == EWOULDBLOCK) {
                if (!app_keeps_tx())
                    arm_write(true);
                break;
            }
            // EPIPE, ECONNRESET: the peer is gone.
            tx_done_ = true;
            peer_gone();
            break;
        }
        advance(b, static_cast<std::uint64_t>(n));
        budget -= std::min(budget, static_cast<std::uint64_t>(n));
    }
    in_pump_ = false;
}

void conn_state::advance(tx_batch& b, std::uint64_t sent) noexcept
{
    for (int i = 0; i < b.nitems; ++i) {
        tx_item& it = b.items[i];
        if (sent == 0 && !it.was_current)
            return; // not started: it will be offered again
        std::uint64_t take = std::min(sent, it.added);
        sent -= take;
        if (!it.was_current && it.kind == frame_kind::request) {
            // Started: from now on it is in flight, and counts against fence / rd limits.
            ++tx_next_;
            if (sq_at(it.pos).op == opcode::read)
                ++reads_in_flight_;
        }
        std::uint64_t done = it.skip + take;
        if (done < it.total) {
            cur_ = it;
            cur_.skip = done;
            cur_.was_current = true;
            return;
        }
        cur_ = {};
        if (it.kind == frame_kind::response) {
            ++resp_head_;
            if (rx_stalled_)
                resume_rx();
        }
    }
}

void conn_state::maybe_shutdown() noexcept
{
    // After a disconnect or error: once the frame on the wire and the responses owed
    // (a NAK saying why, above all) are out, send FIN so the peer notices.
    if (state() == connection_state::established || tx_done_ || cur_.kind != frame_kind::none ||
        resp_head_ != resp_tail_)
        return;
    tx_done_ = true;
    ::shutdown(fd_, SHUT_WR);
    linger_check();
}

void conn_state::revoked_frame(frame_kind kind, std::uint64_t pos) noexcept
{
    // A frame whose memory was deregistered (docs/wire-format.md section 5, Deregistration).
    switch (kind) {
    case frame_kind::response:
        // A read response not started yet: the read fails with NAK REMOTE_ACCESS, as a read
        // of memory deregistered before its request arrived does, and this side goes to
        // error (a class C responder error). The NAK is the last response: what came
        // after it is moot once the initiator is in error.
        resp_at(pos) = {
            .op = frame_op::nak, .code = nak_code::remote_access, .seq = resp_at(pos).seq, .data = {}};
        resp_tail_ = pos + 1;
        fail(connection_state::error);
        return;
    case frame_kind::request:
        // Our own request, not started, its local memory deregistered under it: a usage
        // error (verbs: a local protection error). At the head it says so; later, its
        // predecessors are still in flight and everything is flushed.
        if (pos == sq_head_)
            complete_sq_head(errc::local_protection, 0);
        fail(connection_state::error);
        return;
    case frame_kind::none: break;
    }
    // The frame on the wire: its header promised bytes that may no longer be read. It cannot
    // be finished, so nothing can follow it: the connection ends in the middle of that frame
    // (the peer sees end of stream inside it, never made-up bytes), and what is still owed
    // is dropped.
    cur_ = {};
    fail(connection_state::error);
    tx_done_ = true;
    ::shutdown(fd_, SHUT_WR);
    linger_check();
}

void conn_state::arm_write(bool would_block) noexcept
{
    if (write_armed_)
        return; // the engine's continuation (a post, or a wait for space) is still to come
    write_armed_ = true;
    if (would_block && on_engine()) {
        reclaim_rx(); // the write wait needs the socket in the engine's epoll set
        // The socket said EAGAIN on this thread just now, so the wait is queued before the
        // reactor looks again: the edge that frees space cannot slip past it.
        desc_.async_wait(asio::posix::stream_descriptor::wait_write,
                         with_memory(hmem_, [self = shared_from_this()](const boost::system::error_code&) {
                             std::lock_guard lk(self->mu_);
                             self->write_armed_ = false;
                             self->pump();
                         }));
        return;
    }
    // Out of budget, or on the application thread (which must not touch the descriptor):
    // continue on the engine. Never wait for writability here: with the budget spent the
    // socket may still be writable, and the reactor is edge-triggered, so no event would
    // come while the peer waits for the rest of a frame. The engine's pump() makes progress
    // or meets EAGAIN itself and waits as above.
    asio::post(dom_.io(), with_memory(hmem_, [self = shared_from_this()] {
                   std::lock_guard lk(self->mu_);
                   if (self->closed_)
                       return;
                   self->write_armed_ = false;
                   self->pump();
               }));
}

// ---------------------------------------------------------------------------------------
// Receive: engine thread only

void conn_state::arm_read() noexcept
{
    if (read_armed_ || rx_done_ || closed_)
        return;
    if (rx_app_owned_) {
        reclaim_rx(); // the engine reads again (after a stall): the wait needs the socket
        return;
    }
    if (staged_work()) {
        // Frames already staged (a run ended on its budget): the socket may stay silent.
        continue_rx();
        return;
    }
    set_rcvlowat(wanted_rcvlowat());
    read_armed_ = true;
    desc_.async_wait(asio::posix::stream_descriptor::wait_read,
                     with_memory(hmem_, [self = shared_from_this()](const boost::system::error_code&) {
                         // The mutex held means the application is in a call (post, poll) right now.
                         std::unique_lock lk(self->mu_, std::try_to_lock);
                         bool app_in_call = !lk.owns_lock();
                         if (app_in_call)
                             lk.lock();
                         self->read_armed_ = false;
                         if (self->app_took_data(app_in_call)) {
                             self->stand_down();
                             return;
                         }
                         self->rx_run();
                     }));
}

int conn_state::wanted_rcvlowat() const noexcept
{
    // In the middle of a large payload, wake only when a good part of it is there (or the
    // peer closed, or the receive window is nearly full: the kernel wakes for those
    // regardless): each wake costs this thread a switch and the sender an IPI. Never more
    // than the payload bytes still to come from the socket: what follows them may never be
    // sent (a peer that waits for our answer), so a larger mark would never be reached.
    if (rx_action_ == rx_action::none || state() != connection_state::established)
        return 1;
    std::uint64_t to_come = rx_left_ - std::min<std::uint64_t>(staged(), rx_left_);
    return to_come >= rcvlowat_min ? static_cast<int>(std::min<std::uint64_t>(to_come, rcvlowat_max)) : 1;
}

void conn_state::keep_rcvlowat_reachable() noexcept
{
    // An armed read wait wakes at the mark that arm_read() set for the payload as it was
    // then. A read since, on the application thread (rx_read) or in an engine run that a
    // continuation started while the wait was armed, may have consumed part or all of that
    // payload: lower the mark to what is still to come. Otherwise, if the application then
    // sleeps (request_notify), the rest of the payload and the frames after it lie below
    // the mark, no wake comes, and the peer's requests wait until it declares us dead.
    // Lowering it wakes the wait at once if the bytes already there reach the new mark
    // (the kernel re-checks readiness in setsockopt: tcp_set_rcvlowat).
    if (read_armed_ && rcvlowat_ > 1)
        if (int want = wanted_rcvlowat(); want < rcvlowat_)
            set_rcvlowat(want);
}

void conn_state::set_rcvlowat(int bytes) noexcept
{
    if (bytes == rcvlowat_)
        return;
    // A hint: if the kernel refuses it, waking at every byte is still correct.
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes) == 0)
        rcvlowat_ = bytes;
}

bool conn_state::coalesce_post() noexcept
{
    // A busy application posting one request per call while the pipe is full: its requests
    // wait for its next call and leave several to one sendmsg (up to a batch: 16 frames,
    // 1 MiB), as a post list would. Only when the caller is in a tight loop (app_busy_, as
    // post() just set it) and enough is in flight (16 requests or 64 KiB) that the link does
    // not idle meanwhile; latency (one request at a time) never waits. The transmit check
    // (arm_tx_check) bounds the wait if the application stops calling.
    if (on_engine() || state() != connection_state::established || !app_busy_)
        return false;
    std::uint64_t bytes = 0;
    int n = 0;
    for (std::uint64_t q = tx_next_; q > sq_head_ && n < max_batch_frames && bytes < (64u << 10); ++n)
        bytes += sq_at(--q).length;
    if (n < max_batch_frames && bytes < (64u << 10))
        return false; // little in flight: send now
    bytes = 0;
    n = 0;
    for (std::uint64_t q = tx_next_; q < sq_tail_; ++q, ++n) {
        bytes += sq_at(q).length;
        if (n + 1 >= max_batch_frames || bytes >= (1u << 20))
            return false; // a full batch: send it
    }
    return true;
}

bool conn_state::app_keeps_tx() noexcept
{
    // A busy application (polling, or posting in a tight loop: app_busy_) keeps a transfer
    // that stopped on the budget or on a full socket: its next post() or poll() goes on
    // (the socket's space frees meanwhile), instead of the engine waking on its CPU for
    // every MiB. If it stops calling, the engine takes over: at once when it arms a
    // notification, at the stand-down check when stood down, else at a check armed here
    // (tx_check), at most about two checks late.
    if (on_engine())
        return false;
    if (rx_app_owned_)
        return true;
    if (!app_busy_)
        return false;
    arm_tx_check();
    return true;
}

void conn_state::arm_tx_check() noexcept
{
    if (tx_check_armed_)
        return;
    tx_check_armed_ = true;
    tx_check_calls_ = app_calls_;
    tx_check_timer_.expires_after(takeover_check_);
    auto on_timer = [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        std::lock_guard lk(self->mu_);
        self->tx_check_armed_ = false;
        if (self->closed_)
            return;
        if (self->rx_app_owned_)
            return; // stood down: the stand-down check rules
        bool pending = self->cur_.kind != frame_kind::none || self->tx_next_ != self->sq_tail_ ||
                       self->resp_head_ != self->resp_tail_;
        if (pending && self->app_calls_ != self->tx_check_calls_) {
            self->arm_tx_check(); // still calling: its calls go on sending
            return;
        }
        self->pump(); // the application stopped calling: the engine goes on
    };
    tx_check_timer_.async_wait(with_memory(hmem_, std::move(on_timer)));
}

bool conn_state::app_took_data(bool app_in_call) noexcept
{
    // Whether a busy-polling application is reading what wakes us, wake after wake: it
    // polled since the previous wake, and either nothing is left to read or it is polling
    // right now (the engine, woken on the poller's CPU, often runs before the poller gets
    // to the data). An application that polls only now and then (and leaves one-sided
    // requests to the engine meanwhile) has data waiting when the engine wakes and has not
    // polled for a while, and keeps the engine reading.
    bool polled = app_in_call || app_polls_ != app_polls_seen_;
    app_polls_seen_ = app_polls_;
    if (!polled || !app_may_read()) {
        busy_wakes_ = 0;
        return false;
    }
    if (write_armed_)
        return false; // a transmit continuation is due: not now, but this wake counts neither way
    std::byte probe;
    ssize_t n = sys_recv(fd_, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    bool taken = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    bool polling_now = app_in_call || std::chrono::steady_clock::now() - last_poll_ < busy_poll_window;
    if (!taken && !polling_now) {
        busy_wakes_ = 0;
        return false;
    }
    return ++busy_wakes_ >= standdown_wakes;
}

bool conn_state::app_may_read() const noexcept
{
    // What rx_poll needs to read on its own; otherwise (a drain after an error, a stall
    // that only the engine resumes, a sleeping application) the engine reads.
    return notify_armed_ == 0 && !closed_ && !rx_done_ && !rx_stalled_ &&
           state() == connection_state::established;
}

void conn_state::stand_down() noexcept
{
    // Engine thread, no wait outstanding on the descriptor (release() would drop it).
    // The socket stays open (fd_); only the epoll registration goes.
    [[maybe_unused]] int fd = desc_.release();
    rx_app_owned_ = true;
    busy_wakes_ = 0;
    app_calls_seen_ = app_calls_;
    arm_standdown_check();
}

void conn_state::arm_standdown_check() noexcept
{
    standdown_timer_.expires_after(takeover_check_);
    auto on_timer = [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        std::lock_guard lk(self->mu_);
        if (!self->rx_app_owned_ || self->closed_)
            return;
        if (self->app_calls_ != self->app_calls_seen_ && self->app_may_read()) {
            // Still calling: leave it the socket, and what is left to send (its next call
            // sends it, deferred ACKs included).
            self->app_calls_seen_ = self->app_calls_;
            self->arm_standdown_check();
            return;
        }
        self->reclaim_rx(); // and sends what the application left
    };
    standdown_timer_.async_wait(with_memory(hmem_, std::move(on_timer)));
}

void conn_state::reclaim_rx() noexcept
{
    if (!rx_app_owned_)
        return;
    rx_app_owned_ = false;
    busy_wakes_ = 0;
    app_polls_seen_ = app_polls_;
    standdown_timer_.cancel();
    boost::system::error_code ec;
    desc_.assign(fd_, ec);
    if (ec) {
        // epoll_ctl(ADD) failed (out of memory): nobody could wait on this socket.
        log_limited("cannot watch the socket again (%s); connection to error", ec.message().c_str());
        rx_done_ = tx_done_ = true;
        ::shutdown(fd_, SHUT_RDWR);
        fail(connection_state::error);
        return;
    }
    // EPOLL_CTL_ADD reports data already waiting, so this wait misses nothing that arrived
    // while the application owned the socket.
    arm_read();
    // Transmission left to the application (app_keeps_tx) is the engine's again.
    pump();
}

void conn_state::continue_rx() noexcept
{
    if (rx_cont_posted_)
        return;
    rx_cont_posted_ = true;
    asio::post(dom_.io(), with_memory(hmem_, [self = shared_from_this()] {
                   std::lock_guard lk(self->mu_);
                   self->rx_cont_posted_ = false;
                   if (!self->rx_app_owned_) // stood down: the polling application goes on itself
                       self->rx_run();
               }));
}

void conn_state::resume_rx() noexcept
{
    rx_stalled_ = false;
    asio::post(dom_.io(), with_memory(hmem_, [self = shared_from_this()] {
                   std::lock_guard lk(self->mu_);
                   if (!self->read_armed_)
                       self->rx_run();
               }));
}

bool conn_state::rx_poll() noexcept
{
    // A caller that polls receives what has arrived itself, instead of waiting for the
    // engine thread to wake up, read and hand it over: no thread hop per message. Only
    // while the engine's read wait is armed (it fires on the next data and re-reads, so
    // whichever thread reads first, nothing is missed and nothing is read twice: mu_), or
    // while the engine has stood down and left the socket to this thread (stand_down).
    const std::uint64_t carried_out = rx_expect_;
    if (!rx_read())
        return false;
    // The ACKs and read responses that the frames produced. An ACK for a request that
    // arrived in this very call (a completion to return, or a one-sided write that the
    // caller may be spinning on) may wait for its next post() or poll() (or the engine's
    // stand-down check): a caller that answers a message sends one segment, not two.
    if (rx_app_owned_ && (cq_count_ > 0 || rx_expect_ != carried_out) && only_acks_owed())
        return false;
    pump();
    return true;
}

bool conn_state::rx_read() noexcept
{
    // rx_poll without sending: reads what has arrived, on the application thread.
    if (!(read_armed_ || rx_app_owned_) || closed_ || rx_done_ || rx_stalled_ ||
        state() != connection_state::established)
        return false;
    rx_short_ = false;
    for (int budget = 0; budget < rx_budget; ++budget)
        if (rx_step() != rx_status::again)
            break;
    keep_rcvlowat_reachable(); // the engine's wait may be armed for a payload read here
    if (!rx_app_owned_ && staged_work())
        continue_rx(); // budget spent with frames staged: the engine's wait would not see them
    return true;
}

bool conn_state::only_acks_owed() const noexcept
{
    // Nothing but ACKs: no frame half sent, no request waiting (an ACK or read response
    // that just arrived may have unblocked a fenced one), no read response or NAK owed.
    if (cur_.kind != frame_kind::none || tx_next_ != sq_tail_)
        return false;
    for (std::uint64_t r = resp_head_; r < resp_tail_; ++r)
        if (resp_[r % resp_.size()].op != frame_op::ack)
            return false;
    return true;
}

void conn_state::rx_run() noexcept
{
    if (closed_ || rx_done_ || rx_stalled_)
        return;
    rx_short_ = false;
    for (int budget = 0; budget < rx_budget; ++budget) {
        rx_status s = state() == connection_state::established ? rx_step() : rx_drain();
        if (s == rx_status::again)
            continue;
        keep_rcvlowat_reachable();
        pump();
        if (s == rx_status::wait)
            arm_read();
        return;
    }
    // Budget used up: let the engine serve other connections; readiness is re-checked
    // when the wait is armed, and staged frames continue by a post, so nothing is lost.
    keep_rcvlowat_reachable();
    pump();
    arm_read();
}

conn_state::rx_status conn_state::rx_error(ssize_t n, int err) noexcept
{
    if (n < 0 && err == EINTR)
        return rx_status::again;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK))
        return rx_status::wait;
    // EOF or a reset: the peer disconnected or crashed.
    peer_gone();
    return rx_status::stop;
}

conn_state::rx_status conn_state::rx_drain() noexcept
{
    auto sink = dom_.discard_buffer();
    ssize_t n = sys_recv(fd_, sink.data(), sink.size(), MSG_DONTWAIT);
    if (n > 0)
        return rx_status::again;
    return rx_error(n, errno);
}

conn_state::rx_status conn_state::rx_step() noexcept
{
    if (rx_action_ != rx_action::none)
        return staged() > 0 ? rx_staged_payload() : rx_payload();
    if (staged() < frame_header::wire_size) {
        // A read that came back short in this run drained the socket: another would only
        // say EAGAIN. (Per run: the next one starts from a wake-up or a poll and reads.)
        if (rx_short_)
            return rx_status::wait;
        if (stage_begin_ > 0) { // a partial header: to the front, the buffer is ours again
            std::memmove(stage_, stage_ + stage_begin_, staged());
            stage_end_ -= stage_begin_;
            stage_begin_ = 0;
        }
        std::size_t want = stage_size - stage_end_;
        ssize_t n = sys_recv(fd_, stage_ + stage_end_, want, MSG_DONTWAIT);
        if (n <= 0)
            return rx_error(n, errno);
        rx_bytes_ += static_cast<std::uint64_t>(n); // the peer sent bytes: alive
        stage_end_ += static_cast<std::size_t>(n);
        rx_short_ = static_cast<std::size_t>(n) < want;
        if (staged() < frame_header::wire_size)
            return rx_status::again;
    }
    frame_header h;
    const char* why = "";
    if (frame_header::decode(stage_ + stage_begin_, h, &why)) {
        protocol_violation(why, false);
        return rx_status::stop;
    }
    if (h.is_request() && resp_tail_ - resp_head_ == resp_.size()) {
        // Backpressure: leave the header staged and stop reading until a response has
        // gone out. A peer within max_rd_atomic never gets here.
        rx_stalled_ = true;
        return rx_status::stop;
    }
    unstage(frame_header::wire_size);
    begin_frame(h);
    if (rx_action_ != rx_action::none && rx_left_ == 0)
        finish_frame();
    return rx_done_ ? rx_status::stop : rx_status::again;
}

void conn_state::begin_frame(const frame_header& h) noexcept
{
    rx_hdr_ = h;
    rx_left_ = h.payload_length();
    rx_segs_ = nullptr;
    rx_nseg_ = rx_seg_i_ = 0;
    rx_seg_off_ = 0;
    rx_fault_ = false;
    rx_action_ = rx_action::none;

    if (h.is_request()) {
        if (h.seq != rx_expect_) {
            // Go-back-N: after an RNR NAK for rx_expect_, later requests are already on
            // their way; they are dropped and come again after the NAKed one.
            if (rnr_wait_ && h.seq > rx_expect_) {
                rx_action_ = rx_action::drop;
                return;
            }
            protocol_violation("request out of sequence", false);
            return;
        }
        switch (h.op) {
        case frame_op::send:
            if (rq_head_ == rq_tail_) {
                rx_action_ = rx_action::rnr;
            } else if (h.length > rq_at(rq_head_).length) {
                rx_action_ = rx_action::recv_overflow;
            } else {
                rx_action_ = rx_action::recv;
                rx_segs_ = rq_segs(rq_head_);
                rx_nseg_ = rq_at(rq_head_).nseg;
            }
            return;
        case frame_op::write_imm:
            if (rq_head_ == rq_tail_) {
                rx_action_ = rx_action::rnr;
                return;
            }
            [[fallthrough]];
        case frame_op::write:
            rx_action_ = h.op == frame_op::write ? rx_action::write : rx_action::write_imm;
            // A zero-length write touches nothing, so (as on verbs) it needs no valid key.
            if (h.length == 0)
                return;
            if (!dom_.find_remote(h.key, h.addr, h.length, access::remote_write, rx_target_)) {
                rx_action_ = rx_action::write_bad;
                return;
            }
            rx_segs_ = &rx_target_;
            rx_nseg_ = 1;
            return;
        case frame_op::read_req: {
            seg s;
            if (h.length != 0 && !dom_.find_remote(h.key, h.addr, h.length, access::remote_read, s)) {
                target_fail(nak_code::remote_access, h.seq);
                return;
            }
            ++rx_expect_;
            rnr_wait_ = false;
            push_response({.op = frame_op::read_resp, .code = nak_code::rnr, .seq = h.seq, .data = s});
            return;
        }
        default: break;
        }
        protocol_violation("unexpected request opcode", false);
        return;
    }

    switch (h.op) {
    case frame_op::ack: on_ack(h.seq); return;
    case frame_op::nak: on_nak(h.seq, static_cast<nak_code>(h.status)); return;
    case frame_op::read_resp: {
        if (sq_head_ >= tx_next_ || h.seq != sq_head_) {
            protocol_violation("read response out of sequence", true);
            return;
        }
        const sq_entry& e = sq_at(sq_head_);
        if (e.op != opcode::read || h.length != e.length) {
            protocol_violation("read response does not match the read", true);
            return;
        }
        rx_action_ = rx_action::read_resp;
        rx_segs_ = sq_segs(sq_head_);
        rx_nseg_ = e.nseg;
        return;
    }
    default: break;
    }
    protocol_violation("unexpected response opcode", true);
}

conn_state::rx_status conn_state::rx_payload() noexcept
{
    if (rx_short_)
        return rx_status::wait;    // drained in this run (see rx_step)
    stage_begin_ = stage_end_ = 0; // empty (rx_step): the read ahead below may fill it
    iovec iov[max_iov];
    region_state* pinned[max_iov];
    int niov = 0, npinned = 0;
    std::uint64_t planned = 0;
    // The domain's sink is the engine's; the application thread (rx_poll) has its own.
    std::span<std::byte> sink = on_engine() ? dom_.discard_buffer() : std::span<std::byte>(app_discard_);
    if (payload_to_memory()) {
        std::uint32_t i = rx_seg_i_;
        std::uint64_t off = rx_seg_off_;
        while (planned < rx_left_ && i < rx_nseg_ && niov < max_iov - 1) {
            const seg& s = rx_segs_[i];
            std::uint64_t n = std::min(s.len - off, rx_left_ - planned);
            void* base = s.ptr + off;
            if (s.st && !pin(s.st, s.tag)) {
                // Deregistered mid-payload: those bytes are read and dropped, and the
                // request fails when the frame ends.
                rx_fault_ = true;
                base = sink.data();
                n = std::min<std::uint64_t>(n, sink.size());
                iov[niov++] = {base, static_cast<std::size_t>(n)};
                planned += n;
                break;
            }
            if (s.st)
                pinned[npinned++] = s.st;
            iov[niov++] = {base, static_cast<std::size_t>(n)};
            planned += n;
            off = 0;
            ++i;
        }
    } else {
        std::uint64_t n = std::min<std::uint64_t>(rx_left_, sink.size());
        iov[niov++] = {sink.data(), static_cast<std::size_t>(n)};
        planned = n;
    }
    // Read ahead into the (empty) stage when this call can finish the payload: the next
    // frames come with it, saving a system call per frame.
    std::uint64_t want = planned;
    if (planned == rx_left_) {
        iov[niov++] = {stage_, stage_size};
        want += stage_size;
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = static_cast<std::size_t>(niov);
    ssize_t n = sys_recvmsg(fd_, &mh, MSG_DONTWAIT);
    int err = errno;
    for (int i = 0; i < npinned; ++i)
        unpin(pinned[i]);
    if (n <= 0)
        return rx_error(n, err);
    rx_bytes_ += static_cast<std::uint64_t>(n); // the peer sent bytes: alive
    std::uint64_t got = static_cast<std::uint64_t>(n);
    rx_short_ = got < want;
    std::uint64_t payload = std::min(got, rx_left_);
    stage_end_ = static_cast<std::size_t>(got - payload);
    rx_left_ -= payload;
    if (payload_to_memory())
        rx_advance(payload);
    if (rx_left_ == 0)
        finish_frame();
    return rx_done_ ? rx_status::stop : rx_status::again;
}

conn_state::rx_status conn_state::rx_staged_payload() noexcept
{
    // The payload bytes that arrived with the header: copied out of the stage.
    std::uint64_t n = std::min<std::uint64_t>(staged(), rx_left_);
    if (payload_to_memory()) {
        const std::byte* src = stage_ + stage_begin_;
        std::uint64_t left = n;
        while (left > 0 && rx_seg_i_ < rx_nseg_) {
            const seg& s = rx_segs_[rx_seg_i_];
            std::uint64_t step = std::min(s.len - rx_seg_off_, left);
            if (s.st && !pin(s.st, s.tag)) {
                rx_fault_ = true; // deregistered: dropped, and the request fails at the end
            } else {
                std::memcpy(s.ptr + rx_seg_off_, src, step);
                if (s.st)
                    unpin(s.st);
            }
            src += step;
            left -= step;
            rx_advance(step);
        }
    }
    unstage(static_cast<std::size_t>(n));
    rx_left_ -= n;
    if (rx_left_ == 0)
        finish_frame();
    return rx_done_ ? rx_status::stop : rx_status::again;
}

void conn_state::rx_advance(std::uint64_t n) noexcept
{
    // Walk the SGE position forward by what arrived (wherever it landed).
    while (n > 0 && rx_seg_i_ < rx_nseg_) {
        std::uint64_t step = std::min(rx_segs_[rx_seg_i_].len - rx_seg_off_, n);
        rx_seg_off_ += step;
        n -= step;
        if (rx_seg_off_ == rx_segs_[rx_seg_i_].len) {
            ++rx_seg_i_;
            rx_seg_off_ = 0;
        }
    }
}

void conn_state::finish_frame() noexcept
{
    rx_action a = rx_action_;
    rx_action_ = rx_action::none;
    const frame_header& h = rx_hdr_;
    bool solicited = (h.flags & flag_solicited) != 0;
    switch (a) {
    case rx_action::none: return;
    case rx_action::recv:
        if (rx_fault_) {
            complete_rq_head(
                {.wr_id = rq_at(rq_head_).wr_id, .opcode = opcode::unknown, .status = errc::local_protection},
                solicited);
            target_fail(nak_code::remote_operation, h.seq);
            return;
        }
        complete_rq_head(
            {.wr_id = rq_at(rq_head_).wr_id, .opcode = opcode::recv, .status = {}, .byte_len = h.length},
            solicited);
        break;
    case rx_action::recv_overflow:
        // As verbs: the receiver sees a local length error, the sender an invalid request,
        // and both connections go to error.
        complete_rq_head(
            {.wr_id = rq_at(rq_head_).wr_id, .opcode = opcode::unknown, .status = errc::local_length},
            solicited);
        target_fail(nak_code::invalid_request, h.seq);
        return;
    case rx_action::rnr:
        push_response({.op = frame_op::nak, .code = nak_code::rnr, .seq = h.seq, .data = {}});
        rnr_wait_ = true;
        return;
    case rx_action::drop: return;
    case rx_action::write:
        if (rx_fault_) {
            target_fail(nak_code::remote_access, h.seq);
            return;
        }
        break;
    case rx_action::write_imm:
        if (rx_fault_) {
            target_fail(nak_code::remote_access, h.seq);
            return;
        }
        complete_rq_head({.wr_id = rq_at(rq_head_).wr_id,
                          .opcode = opcode::recv_with_imm,
                          .status = {},
                          .byte_len = h.length,
                          .imm = h.imm,
                          .with_imm = true},
                         solicited);
        break;
    case rx_action::write_bad: target_fail(nak_code::remote_access, h.seq); return;
    case rx_action::read_resp:
        if (rx_fault_) {
            complete_sq_head(errc::local_protection, 0);
            fail(connection_state::error, errc::local_protection);
            return;
        }
        complete_sq_head({}, h.length);
        return;
    }
    // A request that was carried out: the next one may come, and it is acknowledged.
    ++rx_expect_;
    rnr_wait_ = false;
    push_ack(h.seq);
}

void conn_state::on_ack(std::uint64_t seq) noexcept
{
    if (seq < sq_head_ || seq >= tx_next_) {
        protocol_violation("ack for a request not in flight", true);
        return;
    }
    while (sq_head_ <= seq && state() == connection_state::established) {
        if (sq_at(sq_head_).op == opcode::read) {
            protocol_violation("ack covers a read", true);
            return;
        }
        complete_sq_head({}, sq_at(sq_head_).length);
    }
}

void conn_state::on_nak(std::uint64_t seq, nak_code code) noexcept
{
    if (seq != sq_head_ || sq_head_ >= tx_next_) {
        protocol_violation("nak for a request not at the head", true);
        return;
    }
    if (code != nak_code::rnr) {
        complete_sq_head(nak_status(code), 0);
        fail(connection_state::error, nak_status(code));
        return;
    }
    if (rnr_seq_ != seq) {
        rnr_seq_ = seq;
        rnr_tries_ = 0;
    }
    // rnr_retry_count 7 means retry forever, as on verbs.
    if (rnr_limit_ != 7 && rnr_tries_ >= rnr_limit_) {
        complete_sq_head(errc::rnr_retry_exceeded, 0);
        fail(connection_state::error, errc::rnr_retry_exceeded);
        return;
    }
    ++rnr_tries_;
    // Go back to the NAKed request; everything after it was dropped by the peer.
    tx_next_ = seq;
    reads_in_flight_ = 0; // nothing before seq is outstanding: responses come in order
    rnr_active_ = true;
    // As on verbs, each retry waits the RNR timer (connection_options::min_rnr_timer).
    auto delay = rnr_delay_;
    rnr_timer_.expires_after(delay);
    auto on_timer = [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        std::lock_guard lk(self->mu_);
        self->rnr_active_ = false;
        self->pump();
    };
    rnr_timer_.async_wait(with_memory(hmem_, std::move(on_timer)));
}

// ---------------------------------------------------------------------------------------

tcp_connection::tcp_connection(std::shared_ptr<tcp_domain> dom, std::shared_ptr<conn_state> st,
                               std::vector<std::byte> peer_private_data)
    : dom_(std::move(dom)), st_(std::move(st)), peer_pdata_(std::move(peer_private_data))
{
}

tcp_connection::~tcp_connection()
{
    st_->close();
}

std::unique_ptr<connection> make_connection(tcp_domain& dom, unique_fd fd, const connection_limits& lim,
                                            const connection_options& opts, std::uint32_t peer_max_rd,
                                            std::vector<std::byte> peer_private_data)
{
    auto st = std::make_shared<conn_state>(dom, std::move(fd), lim, opts, peer_max_rd);
    auto conn = std::make_unique<tcp_connection>(dom.shared_from_this(), st, std::move(peer_private_data));
    st->start();
    return conn;
}

} // namespace rdmx::tcp
