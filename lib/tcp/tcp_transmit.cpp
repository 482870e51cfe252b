// Transmit: one pump, run under mu_ by whichever thread has something to send. It batches
// responses and requests into one sendmsg, resumes the frame partly on the wire, and hands
// what is left to the engine (arm_write).
#include "tcp/tcp_engine.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <new>

#include <boost/asio/post.hpp>

#include "tcp/tcp_log.hpp"
#include "tcp/tcp_syscall.hpp"

namespace rdmx::tcp
{

void connection_engine::add_frame(tx_batch& b, frame_kind kind, std::uint64_t pos,
                                  std::uint64_t skip) noexcept
{
    std::byte* hdr = b.headers[b.nitems];
    frame_header h;
    if (kind == frame_kind::request) {
        send_queue::entry& e = sq_.at(pos);
        if (skip == 0) { // a frame built anew (first, or sent again): by CMA or not?
            bool revoked = false;
            e.via_cma = cma_.sends() && choose_cma(pos, revoked);
            if (revoked) { // pump() withdraws it (revoked_frame), as add() would
                b.revoked = b.closed = true;
                return;
            }
        }
        h.seq = pos;
        h.length = e.length;
        switch (e.op) {
        case opcode::send: h.op = frame_op::send; break;
        case opcode::send_with_invalidate:
            h.op = frame_op::send_inv;
            h.key = e.remote_key; // the key of the peer's window to revoke
            break;
        case opcode::write: h.op = frame_op::write; break;
        case opcode::write_with_imm: h.op = frame_op::write_imm; break;
        case opcode::fetch_add: // the payload is the operands, not the local (8-byte) sink
        case opcode::compare_swap:
            h.op = e.op == opcode::fetch_add ? frame_op::fetch_add_req : frame_op::compare_swap_req;
            h.length = static_cast<std::uint32_t>(e.operand_seg.len);
            break;
        default: h.op = frame_op::read_req; break;
        }
        if (h.op != frame_op::send && h.op != frame_op::send_inv) {
            h.addr = e.remote_addr;
            h.key = e.remote_key;
        }
        if (h.op == frame_op::write_imm)
            h.imm = e.imm;
        if (e.via_cma) { // the payload is the descriptors (payload_segs)
            h.op = h.op == frame_op::write       ? frame_op::write_cma
                   : h.op == frame_op::write_imm ? frame_op::write_imm_cma
                   : h.op == frame_op::send      ? frame_op::send_cma
                                                 : frame_op::read_cma_req;
            h.length = static_cast<std::uint32_t>(e.cma_seg.len);
        }
        if (e.solicited &&
            (h.op == frame_op::send || h.op == frame_op::send_inv || h.op == frame_op::write_imm ||
             h.op == frame_op::write_imm_cma || h.op == frame_op::send_cma))
            h.flags = flag_solicited;
    } else {
        const response& r = resp_.at(pos);
        h.op = r.op;
        h.seq = r.seq;
        if (r.op == frame_op::nak)
            h.status = static_cast<std::uint32_t>(r.code);
        if (r.op == frame_op::read_resp || r.op == frame_op::read_cma_resp)
            h.length = static_cast<std::uint32_t>(r.data.len); // read_cma_resp: no payload
        if (r.op == frame_op::atomic_resp)
            h.length = atomic_resp_payload;
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
    auto add = [&](std::byte* p, std::uint64_t len, region_state* st, std::uint64_t tag) RDMX_REQUIRES(mu_) {
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
            if (st->stage != staging::none) {
                // Staged memory (device memory): the socket call sends a host copy.
                const std::uint64_t want = n;
                std::byte* copy = stage_tx(b, st, tag, static_cast<const std::byte*>(base), n);
                unpin(st);
                if (!copy) {
                    if (b.stage_failed)
                        b.revoked = b.closed = true;
                    return;
                }
                if (n < want) { // cut by the chunk's end: the next batch goes on from here
                    b.cut_st = st;
                    b.cut_tag = tag;
                    b.cut_src = static_cast<const std::byte*>(base) + n;
                    b.cut_len = want - n;
                }
                base = copy;
            } else {
                b.pinned[b.npinned++] = st;
            }
        }
        b.iov[b.niov++] = {base, static_cast<std::size_t>(n)};
        it.added += n;
        off += n;
        at += len;
        if (off < at) // the piece was cut short: the rest comes in a later batch
            b.closed = true;
    };
    add(hdr, frame_header::wire_size, nullptr, 0);
    if (skip > 0 && cur_.copy()) {
        // The frame on the wire (the only one added with skip > 0), its memory deregistered
        // under it: the rest comes from the copy.
        at = cur_.copy_from();
        add(cur_.copy(), it.total - cur_.copy_from(), nullptr, 0);
    } else if (h.payload_length() > 0) {
        for (const seg& s : payload_segs(kind, pos))
            add(s.ptr, s.len, s.st, s.tag);
    }
    if (skip + it.added < it.total)
        b.closed = true;
}

std::span<const seg> connection_engine::payload_segs(frame_kind kind, std::uint64_t pos) noexcept
{
    if (kind == frame_kind::request) {
        const send_queue::entry& e = sq_.at(pos);
        if (e.via_cma)
            return {&e.cma_seg, 1};
        if (e.op == opcode::fetch_add || e.op == opcode::compare_swap)
            return {&e.operand_seg, 1};
        if (e.op != opcode::send && e.op != opcode::send_with_invalidate && e.op != opcode::write &&
            e.op != opcode::write_with_imm)
            return {}; // a read request
        return {sq_.segs(pos), e.nseg};
    }
    response& r = resp_.at(pos);
    if (r.op == frame_op::atomic_resp) {
        // The old value goes from the slot itself, which stays until the frame is out.
        r.data = {nullptr, 0, r.value.data(), atomic_resp_payload};
        return {&r.data, 1};
    }
    if (r.op != frame_op::read_resp)
        return {};
    return {&r.data, 1};
}

bool connection_engine::add_whole_frame(tx_batch& b, frame_kind kind, std::uint64_t pos,
                                        std::uint64_t skip) noexcept
{
    const tx_batch::mark m = b.checkpoint();
    add_frame(b, kind, pos, skip);
    if (!b.revoked)
        return true;
    b.rollback(m);
    return false;
}

void connection_engine::pump() noexcept
{
    // One pump at a time; an application thread sends even while the engine's continuation
    // is queued (transmit_gate says why), which then finds less or nothing left to do.
    if (closed_ || !tx_.may_pump(on_engine()) || hs_.owns_socket())
        return;
    tx_.enter();
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
        b.reset();
        if (cur_.busy() && !add_whole_frame(b, cur_.item().kind, cur_.item().pos, cur_.item().skip)) {
            // Its memory is being deregistered: tcp_domain::deregister() copies the rest
            // and sends us on (copy_frame_on_wire), or ends the stream if it cannot.
            // Nothing may go out before this frame is finished. Memory that could not be
            // staged will not be later either: the frame cannot be finished.
            if (b.stage_failed)
                revoked_frame(frame_kind::none, 0);
            break;
        }
        // Responses first: they free the peer's resources, and are bounded in number.
        std::uint64_t r = resp_.head() + (cur_.item().kind == frame_kind::response ? 1 : 0);
        for (; !b.closed && b.nitems < max_batch_frames && r < resp_.tail(); ++r)
            if (!add_whole_frame(b, frame_kind::response, r, 0)) {
                revoked_frame(frame_kind::response, r); // now a NAK, the last response
                add_frame(b, frame_kind::response, r, 0);
            }
        if (state() == connection_state::established && !rnr_.waiting()) {
            std::uint64_t q = sq_.next();
            std::uint32_t reads = sq_.reads_in_flight();
            while (!b.closed && b.nitems < max_batch_frames && q < sq_.tail()) {
                const send_queue::entry& e = sq_.at(q);
                // Fence: this request waits until every earlier read and atomic has
                // completed, so that e.g. a write cannot overtake the read of the same
                // bytes, nor a read the atomic that changes them.
                if (e.fenced && reads > 0)
                    break;
                // The peer serves at most max_rd_out_ reads and atomics at once (its
                // responder resources).
                if (send_queue::reads_or_atomic(e.op) && reads >= max_rd_out_)
                    break;
                if (!add_whole_frame(b, frame_kind::request, q, 0)) {
                    if (q == sq_.next()) // else the earlier ones in this batch go first
                        revoked_frame(frame_kind::request, q);
                    break;
                }
                if (send_queue::reads_or_atomic(e.op))
                    ++reads;
                ++q;
            }
        }
        if (b.nitems == 0) {
            maybe_shutdown();
            break;
        }
        prefetch_tx(b); // runs during the sendmsg (device memory)
        ssize_t n = link_.send(b.iov, b.niov);
        int err = errno;
        b.unpin_all();
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
            if (err == EPROTO && link_.uses_rings()) {
                protocol_violation("an index of the peer's ring out of range", false);
                break;
            }
            // EPIPE, ECONNRESET: the peer is gone. What it sent before it went (the NAK of
            // a target error, which then closes its socket with our request's payload
            // unread, so that we meet its reset) is still in our receive queue: read it
            // first, and the end of the stream ends the connection (rx_error), with the
            // NAK's cause if one came. A reader that stands still would never get there:
            // then the peer is gone now.
            tx_.shut();
            if (rx_state_ == rx_state::reading && !closed_)
                continue_rx();
            else
                peer_gone();
            break;
        }
        advance(b, static_cast<std::uint64_t>(n));
        budget -= std::min(budget, static_cast<std::uint64_t>(n));
    }
    for (tx_chunk& c : batch_.chunks)
        if (c.p) {
            settle(c);
            dom_.bounce().give(c.p);
            c = {};
        }
    tx_.leave();
}

bool connection_engine::settle(tx_chunk& c) noexcept
{
    // (A host copy is done at once: nothing in flight, but its region is pinned all the same.)
    const bool ok = c.copy.empty() || dom_.bounce().finish(c.copy);
    if (c.copy_pin)
        unpin(c.copy_pin);
    c.copy_pin = nullptr;
    if (!ok)
        c.st = nullptr; // its range holds nothing
    return ok;
}

std::byte* connection_engine::stage_tx(tx_batch& b, region_state* st, std::uint64_t tag, const std::byte* src,
                                       std::uint64_t& n) noexcept
{
    bounce_pool& pool = dom_.bounce();
    // A chunk holding these bytes already: the previous batch's, whose sendmsg took only
    // part of them, or the copy started while that batch was sent (prefetch_tx).
    for (tx_chunk& c : b.chunks)
        if (c.st == st && c.tag == tag && src >= c.src && src < c.src + c.len && settle(c) && c.st) {
            n = std::min<std::uint64_t>(n, c.src + c.len - src);
            c.in_batch = true;
            return c.p + c.off + (src - c.src);
        }
    // Else a copy now: appended to a chunk this batch fills already, or into the chunk
    // whose range is older (none of this batch points into it).
    tx_chunk* f = nullptr;
    for (tx_chunk& c : b.chunks)
        if (c.in_batch && c.p && c.fill < pool.chunk_size())
            f = &c;
    if (!f) {
        for (tx_chunk& c : b.chunks)
            if (!c.in_batch && (!f || c.stamp < f->stamp))
                f = &c;
        if (!f) { // both chunks are this batch's, full: the rest in the next batch
            b.closed = true;
            return nullptr;
        }
        settle(*f);
        if (!f->p && !(f->p = pool.take())) {
            log_limited("no memory for a staging buffer: a frame of staged memory fails");
            b.stage_failed = true;
            return nullptr;
        }
        f->fill = 0;
        f->st = nullptr;
    }
    n = std::min<std::uint64_t>(n, pool.chunk_size() - f->fill);
    std::byte* at = f->p + f->fill;
    if (!pool.copy_now(true, st->stage, st->device, at, src, n)) { // nothing to overlap with yet
        b.stage_failed = true;
        return nullptr;
    }
    pool.count_out(n);
    *f = {.p = f->p,
          .fill = f->fill + n,
          .stamp = ++b.stamps,
          .st = st,
          .tag = tag,
          .src = src,
          .len = n,
          .off = f->fill,
          .copy = {},
          .copy_pin = nullptr,
          .in_batch = true};
    return at;
}

void connection_engine::prefetch_tx(tx_batch& b) noexcept
{
    if (!b.cut_st)
        return;
    for (const tx_chunk& x : b.chunks)
        if (x.st == b.cut_st && x.tag == b.cut_tag && b.cut_src >= x.src && b.cut_src < x.src + x.len)
            return; // copied (or being copied) already
    tx_chunk* c = nullptr;
    for (tx_chunk& x : b.chunks)
        if (!x.in_batch && (!c || x.stamp < c->stamp))
            c = &x;
    if (!c) // both hold this batch's bytes
        return;
    bounce_pool& pool = dom_.bounce();
    settle(*c);
    if (!c->p && !(c->p = pool.take()))
        return; // the next batch copies (or fails) as it goes
    if (!pin(b.cut_st, b.cut_tag))
        return; // deregistered: the next batch withdraws the frame
    const std::uint64_t n = std::min<std::uint64_t>(b.cut_len, pool.chunk_size());
    c->st = nullptr;
    if (!pool.start(c->copy, true, b.cut_st->stage, b.cut_st->device, c->p, b.cut_src, n)) {
        unpin(b.cut_st);
        return;
    }
    pool.count_out(n);
    c->copy_pin = b.cut_st;
    c->fill = n;
    c->stamp = ++b.stamps;
    c->st = b.cut_st;
    c->tag = b.cut_tag;
    c->src = b.cut_src;
    c->len = n;
    c->off = 0;
}

void connection_engine::advance(tx_batch& b, std::uint64_t sent) noexcept
{
    for (int i = 0; i < b.nitems; ++i) {
        tx_item& it = b.items[i];
        if (sent == 0 && !it.was_current)
            return; // not started: it will be offered again
        std::uint64_t take = std::min(sent, it.added);
        sent -= take;
        if (!it.was_current && it.kind == frame_kind::request) {
            // Started: from now on it is in flight, and counts against fence / rd limits.
            assert(it.pos == sq_.next());
            sq_.start();
        }
        std::uint64_t done = it.skip + take;
        if (done < it.total) {
            cur_.sent_part(it, done);
            return;
        }
        cur_.finished();
        if (it.kind == frame_kind::response) {
            resp_.pop();
            if (rx_state_ == rx_state::stalled)
                resume_rx();
        }
    }
}

void connection_engine::maybe_shutdown() noexcept
{
    // After a disconnect or error: once the frame on the wire and the responses owed
    // (a NAK saying why, above all) are out, send FIN so the peer notices.
    if (state() == connection_state::established || tx_.is_shut() || cur_.busy() || !resp_.empty())
        return;
    if (goodbye_ != goodbye::not_promised) {
        // The last frame before FIN says this end is on purpose (docs/wire-format.md
        // section 6). 40 bytes: a full socket buffer makes us wait for room, as any frame.
        frame_header::bytes g{};
        frame_header{.op = frame_op::goodbye}.encode(g.data());
        while (goodbye_sent_ < g.size()) {
            const iovec v{g.data() + goodbye_sent_, g.size() - goodbye_sent_};
            ssize_t n = link_.send(&v, 1);
            if (n > 0) {
                goodbye_sent_ += static_cast<std::size_t>(n);
                tx_bytes_ += static_cast<std::uint64_t>(n);
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                arm_write(true);
                return;
            }
            break; // the peer is gone: FIN (or nothing) is all that is left
        }
    }
    tx_.shut();
    ::shutdown(fd_, SHUT_WR);
    linger_check();
}

void connection_engine::revoked_frame(frame_kind kind, std::uint64_t pos) noexcept
{
    // A frame whose memory was deregistered (docs/wire-format.md section 5, Deregistration).
    switch (kind) {
    case frame_kind::response:
        // A read response not started yet: the read fails with NAK REMOTE_ACCESS, as a read
        // of memory deregistered before its request arrived does, and this side goes to
        // error (a class C responder error). The NAK is the last response: what came
        // after it is moot once the initiator is in error.
        resp_.at(pos) = {
            .op = frame_op::nak, .code = nak_code::remote_access, .seq = resp_.at(pos).seq, .data = {}};
        resp_.drop_after(pos);
        fail(connection_state::error);
        return;
    case frame_kind::request:
        // Our own request, not started, its local memory deregistered under it: a usage
        // error (verbs: a local protection error). At the head it says so; later, its
        // predecessors are still in flight and everything is flushed.
        if (pos == sq_.head())
            complete_sq_head(errc::local_protection, 0);
        fail(connection_state::error);
        return;
    case frame_kind::none: break;
    }
    // The frame on the wire, whose rest could not be copied (no memory): its header promised
    // bytes that may no longer be read. It cannot be finished, so nothing can follow it:
    // the connection ends in the middle of that frame (the peer sees end of stream inside
    // it, never made-up bytes), and what is still owed is dropped.
    cur_.finished();
    fail(connection_state::error);
    tx_.shut();
    ::shutdown(fd_, SHUT_WR);
    linger_check();
}

void connection_engine::copy_frame_on_wire(const region_state* st, std::uint64_t tag) noexcept
{
    engine_lock lk(mu_);
    if (closed_ || tx_.is_shut() || !cur_.busy() || cur_.copy())
        return;
    const tx_item& it = cur_.item();
    auto segs = payload_segs(it.kind, it.pos);
    const std::uint64_t from = std::max<std::uint64_t>(it.skip, frame_header::wire_size);
    const std::uint64_t total = it.total;
    // Does the rest read this region? The same test as add_frame's: the pieces not sent whole.
    bool reads_it = false;
    std::uint64_t at = frame_header::wire_size;
    for (const seg& s : segs) {
        if (s.st == st && s.tag == tag && s.len > 0 && at + s.len > from)
            reads_it = true;
        at += s.len;
    }
    if (!reads_it)
        return;
    // The whole rest, not just this region's pieces: one buffer, and the frame's other
    // regions can go the same way later without another copy.
    std::unique_ptr<std::byte[]> copy(new (std::nothrow) std::byte[total - from]);
    bool ok = copy != nullptr;
    at = frame_header::wire_size;
    for (const seg& s : segs) {
        if (!ok)
            break;
        if (s.len > 0 && at + s.len > from) {
            if (at + s.len > total) { // cannot happen: the header's length is the pieces' sum
                ok = false;
                break;
            }
            std::uint64_t skip = from > at ? from - at : 0;
            // This region's memory is still the caller's until deregister() returns; any
            // other region's must be pinned like a socket call's (it may be going too).
            bool other = s.st != nullptr && (s.st != st || s.tag != tag);
            if (other && !pin(s.st, s.tag)) {
                ok = false;
                break;
            }
            if (s.st && s.st->stage != staging::none)
                ok = dom_.bounce().copy_now(true, s.st->stage, s.st->device, copy.get() + (at + skip - from),
                                            s.ptr + skip, s.len - skip);
            else
                std::memcpy(copy.get() + (at + skip - from), s.ptr + skip, s.len - skip);
            if (other)
                unpin(s.st);
        }
        at += s.len;
    }
    if (!ok) {
        revoked_frame(frame_kind::none, 0);
        return;
    }
    cur_.keep_copy(std::move(copy), from);
    // A pump may have stopped at this frame meanwhile (its pin failed): go on.
    arm_write(false);
}

void connection_engine::arm_write(bool would_block) noexcept
{
    if (!tx_.queue_continuation())
        return; // the engine's continuation (a post, or a wait for space) is still to come
    if (would_block && on_engine()) {
        assert_on_engine();
        if (link_.uses_rings()) {
            wait_ring_space();
            return;
        }
        reclaim_rx(); // the write wait needs the socket in the engine's epoll set
        // The socket said EAGAIN on this thread just now, so the wait is queued before the
        // reactor looks again: the edge that frees space cannot slip past it.
        desc_.async_wait(asio::posix::stream_descriptor::wait_write,
                         with_memory(hmem_, [self = shared_from_this()](const boost::system::error_code&) {
                             engine_lock lk(self->mu_);
                             self->assert_on_engine();
                             self->tx_.continuation_ran();
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
                   engine_lock lk(self->mu_);
                   self->assert_on_engine();
                   if (self->closed_)
                       return;
                   self->tx_.continuation_ran();
                   self->pump();
               }));
}

void connection_engine::wait_ring_space() noexcept
{
    // The reader frees space without a word: look again shortly (stream_link::next_space_wait).
    ring_timer_.expires_after(link_.next_space_wait());
    ring_timer_.async_wait(with_memory(hmem_, [self = shared_from_this()](const boost::system::error_code&) {
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        self->tx_.continuation_ran();
        self->pump();
    }));
}

} // namespace rdmx::tcp
