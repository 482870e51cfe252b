// The endpoint's data path: issuing and queueing operations, and the shared completion
// queue's completions up to tag matching (ep_receive.cpp delivers; ep_progress.cpp is
// poll()). No allocation: every slot, list and buffer here was sized at open
// (docs/endpoints.md).
#include "endpoint/ep_endpoint.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "errno_status.hpp"

namespace rdmx::ep
{

// --- pools and chains ---

void endpoint_impl::chain_push(op_chain& ch, std::uint32_t oi) noexcept
{
    op_slot& o = ops_[oi];
    o.prev = ch.tail;
    o.next = nil;
    if (ch.tail != nil)
        ops_[ch.tail].next = oi;
    else
        ch.head = oi;
    ch.tail = oi;
    ++ch.size;
}

void endpoint_impl::chain_erase(op_chain& ch, std::uint32_t oi) noexcept
{
    op_slot& o = ops_[oi];
    if (o.prev != nil)
        ops_[o.prev].next = o.next;
    else
        ch.head = o.next;
    if (o.next != nil)
        ops_[o.next].prev = o.prev;
    else
        ch.tail = o.prev;
    o.prev = o.next = nil;
    --ch.size;
}

bool endpoint_impl::pools_full() const noexcept
{
    return ops_in_use_ + recvs_in_use_ + ring_count_ >= ops_.size() + recvs_.size();
}

void endpoint_impl::push(const endpoint_completion& c) noexcept
{
    // Never full: each entry stands for a slot taken while slots + entries < the pools.
    endpoint_completion& e = ring_[(ring_head_ + ring_count_) % ring_.size()];
    e = c;
    e.status = detail::in_rdmx_category(c.status); // the promise of endpoint_completion::status
    ++ring_count_;
}

std::error_code endpoint_impl::cause_of(std::error_code status, connection* c) const noexcept
{
    // A flush says only that the connection ended; why it ended (peer_lost, disconnected,
    // transport_retry_exceeded, ...) is its last_error(), set before its flushes are
    // polled on both backends. That is what the operation failed of.
    if (status == errc::flushed && c != nullptr)
        if (std::error_code why = c->last_error())
            return why;
    return status;
}

std::uint32_t endpoint_impl::take_recv_slot() noexcept
{
    if (free_recvs_.empty() || pools_full())
        return nil;
    ++recvs_in_use_;
    std::uint32_t ri = free_recvs_.take();
    recvs_[ri] = recv_slot{};
    return ri;
}

std::error_code endpoint_impl::send_header(connection& c, std::size_t off, std::uint64_t wr_id) noexcept
{
    sge s{ctrl_mr_.get(), off, header_size};
    work_request wr;
    wr.opcode = opcode::send;
    wr.wr_id = wr_id;
    wr.local = {&s, 1};
    return c.post({&wr, 1});
}

void endpoint_impl::free_recv(std::uint32_t ri) noexcept
{
    pending_recvs_.erase(ri);
    posted_recvs_.erase(ri);
    recvs_[ri].st = recv_slot::state::free;
    recvs_[ri].conn = nullptr;
    free_recvs_.give(ri);
    --recvs_in_use_;
}

std::error_code endpoint_impl::check_sges(std::span<const sge> local, access need,
                                          std::uint64_t* total) const noexcept
{
    std::uint64_t sum = 0;
    for (const sge& s : local) {
        if (s.region == nullptr || s.region->owner() != ctrl_mr_->owner() || s.offset > s.region->size() ||
            s.length > s.region->size() - s.offset)
            return errc::invalid_argument;
        if (need != access::none && !any(s.region->access() & need) &&
            !(need == access::local_write && any(s.region->access() & access::remote_write)))
            return errc::invalid_argument;
        sum += s.length;
    }
    *total = sum;
    return {};
}

// --- issuing ---

std::error_code endpoint_impl::send(rdmx::peer to, std::uint64_t tag, std::span<const sge> local,
                                    std::uint64_t context) noexcept
{
    std::uint32_t pi = index_of(to);
    if (pi == nil)
        return errc::invalid_argument;
    std::uint64_t total = 0;
    if (auto ec = check_sges(local, access::none, &total))
        return ec;
    const bool rndv = total > opts_.eager_limit;
    if (rndv) {
        if (local.size() > max_rts_desc)
            return errc::invalid_argument;
        for (const sge& s : local)
            if (!any(s.region->access() & access::remote_read))
                return errc::invalid_argument; // the receiver reads it
    } else if (local.size() + 1 > send_sge_) {
        return errc::invalid_argument;
    }
    return start_op(pi, endpoint_op::send, rndv, tag, local, total, {}, context);
}

std::uint32_t endpoint_impl::take_op(std::uint32_t pi, endpoint_op kind, std::uint64_t context) noexcept
{
    if (free_ops_.empty() || pools_full())
        return nil;
    std::uint32_t oi = free_ops_.take();
    ++ops_in_use_;
    op_slot& o = ops_[oi];
    const std::uint32_t gen = o.gen; // an ack names the slot with it: it only moves on
    o = op_slot{};
    o.gen = gen;
    o.kind = kind;
    o.peer = pi;
    o.context = context;
    return oi;
}

std::error_code endpoint_impl::start_op(std::uint32_t pi, endpoint_op kind, bool rndv, std::uint64_t tag,
                                        std::span<const sge> local, std::uint64_t total,
                                        const remote_buffer& remote, std::uint64_t context) noexcept
{
    std::uint32_t oi = take_op(pi, kind, context);
    if (oi == nil)
        return errc::would_block;
    op_slot& o = ops_[oi];
    o.rndv = rndv;
    o.tag = tag;
    o.length = total;
    o.nsge = static_cast<std::uint8_t>(local.size());
    std::copy(local.begin(), local.end(), o.sges.begin());
    o.remote = remote;
    return issue(pi, oi);
}

std::error_code endpoint_impl::issue(std::uint32_t pi, std::uint32_t oi) noexcept
{
    peer_entry& p = *peers_[pi];
    op_slot& o = ops_[oi];
    o.st = op_slot::state::free;
    if (p.chosen && p.queued.size == 0 && post_op(oi) != post_result::no_room) {
        settle(); // posted, or failed at once: then its completion is out, and fd() says so
        return {};
    }
    if (queued_total_ >= opts_.max_queued_ops) {
        free_ops_.give(oi);
        --ops_in_use_;
        return errc::would_block;
    }
    o.st = op_slot::state::queued;
    chain_push(p.queued, oi);
    ++queued_total_;
    if (!p.chosen) {
        if (p.queued.size == 1) {
            p.deadline = clock::now() + opts_.connect_deadline;
            p.last_cause.clear();
        }
        need_timers(pi);
        if (p.next_dial == clock::time_point::max())
            start_dial(pi); // lazy connect: the first operation dials
    }
    settle(); // the deadline, and a dial that failed at once
    return {};
}

endpoint_impl::post_result endpoint_impl::post_op(std::uint32_t oi) noexcept
{
    op_slot& o = ops_[oi];
    peer_entry& p = *peers_[o.peer];
    if (!p.chosen || p.posted_wrs >= p.user_budget)
        return post_result::no_room;
    std::size_t ctrl_off = static_cast<std::size_t>(oi) * ctrl_size_;
    std::byte* ctrl = ctrl_mem_.data() + ctrl_off;
    std::array<sge, max_sges + 1> s{};
    work_request wr;
    wr.wr_id = make_wr_id(wr_kind::op, oi);
    wr.flags = send_flags::signaled;
    std::size_t n = 0;
    // A send is a data message: it goes only while the peer's credit covers it (its
    // header's credit, docs/endpoints.md, "Flow control"); otherwise it waits in the queue
    // until a header from the peer gives more.
    if (o.kind == endpoint_op::send &&
        static_cast<std::int32_t>(p.tx - (p.peer_delivered + p.peer_credit)) >= 0)
        return post_result::no_room;
    msg_header h; // a send's: its counts are noted as told once it is posted
    switch (o.kind) {
    case endpoint_op::send:
        wr.opcode = opcode::send;
        if (!o.rndv) {
            h = msg_header{msg_type::eager, 0, o.tag, o.length, 0};
            stamp(p, h);
            encode(h, ctrl);
            s[n++] = sge{ctrl_mr_.get(), ctrl_off, header_size};
            for (std::uint8_t i = 0; i < o.nsge; ++i)
                s[n++] = o.sges[i];
        } else {
            std::uint64_t id = (static_cast<std::uint64_t>(o.gen) << 32) | oi;
            h = msg_header{msg_type::rts, o.nsge, o.tag, o.length, id};
            stamp(p, h);
            encode(h, ctrl);
            for (std::uint8_t i = 0; i < o.nsge; ++i) {
                remote_buffer rb;
                try {
                    rb = o.sges[i].region->remote(o.sges[i].offset, o.sges[i].length); // checked: no throw
                } catch (...) {
                }
                auto bytes = rb.serialize();
                std::memcpy(ctrl + header_size + i * remote_buffer::wire_size, bytes.data(), bytes.size());
            }
            s[n++] = sge{ctrl_mr_.get(), ctrl_off, header_size + o.nsge * remote_buffer::wire_size};
        }
        break;
    case endpoint_op::write:
    case endpoint_op::read:
        wr.opcode = o.kind == endpoint_op::write ? opcode::write : opcode::read;
        wr.remote = o.remote;
        for (std::uint8_t i = 0; i < o.nsge; ++i)
            s[n++] = o.sges[i];
        break;
    case endpoint_op::fetch_add:
    case endpoint_op::compare_swap:
        wr.opcode = o.kind == endpoint_op::fetch_add ? opcode::fetch_add : opcode::compare_swap;
        wr.remote = o.remote;
        wr.compare_add = o.compare_add;
        wr.swap = o.swap;
        s[n++] = o.sges[0];
        break;
    case endpoint_op::bind_window:
        // On the chosen connection: the window is for its peer alone, and lives as long as
        // that connection does.
        wr.opcode = opcode::bind_window;
        wr.window = o.window;
        wr.bind_region = o.sges[0].region;
        wr.bind_offset = o.sges[0].offset;
        wr.bind_length = o.sges[0].length;
        wr.bind_access = o.rights;
        break;
    case endpoint_op::invalidate_window:
        wr.opcode = opcode::invalidate_window;
        wr.window = o.window;
        break;
    case endpoint_op::recv: // receives have slots of their own, never an op slot
    case endpoint_op::peer_down:
    case endpoint_op::peer_restarted: break; // events, never operations
    }
    wr.local = std::span<const sge>(s.data(), n);
    std::error_code ec = p.chosen->post({&wr, 1});
    if (ec == errc::would_block)
        return post_result::no_room;
    if (ec && p.chosen->state() != connection_state::established) {
        // The connection ended under us (its event is not polled yet): the operation never
        // left, so it waits in the queue, and the event redials for it.
        return post_result::no_room;
    }
    if (o.st == op_slot::state::queued) {
        chain_erase(p.queued, oi);
        --queued_total_;
    }
    if (ec) {
        o.status = ec;
        o.st = op_slot::state::free; // on no chain now
        complete_op(oi);             // its completion says why
        return post_result::failed;
    }
    o.st = op_slot::state::posted;
    o.conn = p.chosen;
    o.awaiting_local = true;
    // Rendezvous: the receiver's ack. An eager send on iWARP: its delivered count.
    o.awaiting_ack = o.rndv || (delivery_acks_ && o.kind == endpoint_op::send);
    if (o.kind == endpoint_op::send) {
        o.seq = ++p.tx; // a data message: it took one credit
        note_told(p, h);
    }
    chain_push(p.outstanding, oi);
    ++p.posted_wrs;
    return post_result::posted;
}

void endpoint_impl::flush_queue(std::uint32_t pi) noexcept
{
    peer_entry& p = *peers_[pi];
    while (p.chosen && p.queued.head != nil)
        if (post_op(p.queued.head) == post_result::no_room)
            return;
}

void endpoint_impl::complete_op(std::uint32_t oi) noexcept
{
    op_slot& o = ops_[oi];
    peer_entry& p = *peers_[o.peer];
    if (o.st == op_slot::state::queued) {
        chain_erase(p.queued, oi);
        --queued_total_;
    } else if (o.st == op_slot::state::posted) {
        chain_erase(p.outstanding, oi);
    }
    endpoint_completion c;
    c.context = o.context;
    c.op = o.kind;
    c.status = o.status;
    c.peer = handle_of(o.peer);
    c.tag = o.tag;
    c.length = o.length;
    push(c);
    o.st = op_slot::state::free;
    o.conn = nullptr;
    ++o.gen;
    free_ops_.give(oi);
    --ops_in_use_;
}

// --- completions ---

void endpoint_impl::poll_cq() noexcept
{
    // One batch serves every call: on_completion never comes back here (connection
    // events, whose disconnect handling polls the queue, are taken by poll() outside it).
    assert(!in_poll_cq_);
    in_poll_cq_ = true;
    for (int round = 0; round < 16; ++round) {
        std::size_t n = cq_->poll(cq_batch_);
        for (std::size_t i = 0; i < n; ++i)
            on_completion(cq_batch_[i]);
        if (n < cq_batch_.size())
            break;
    }
    in_poll_cq_ = false;
}

void endpoint_impl::on_completion(const completion& c) noexcept
{
    auto kind = static_cast<wr_kind>(c.wr_id >> 56);
    auto idx = static_cast<std::uint32_t>(c.wr_id);
    auto slot_done = [this](std::uint32_t pi, connection* conn) {
        peer_entry& p = *peers_[pi];
        if (conn != p.chosen || p.posted_wrs == 0)
            return;
        --p.posted_wrs;
        if (p.queued.size != 0)
            list_once(kick_, p.in_kick, pi);
    };
    switch (kind) {
    case wr_kind::srq: {
        std::uint32_t pi = index_of(static_cast<rdmx::peer>(c.context));
        if (c.status || idx >= held_.size() || pi == nil ||
            (c.conn != peers_[pi]->dial.get() && c.conn != peers_[pi]->accepted.get())) {
            if (idx < held_.size())
                repost(idx);
            return;
        }
        heard_on(pi, c.conn);
        on_message(idx, c.byte_len, pi, c.conn);
        return;
    }
    case wr_kind::ready:
        if (idx < peers_.size())
            slot_done(idx, c.conn); // a failure ends the connection: its event follows
        return;
    case wr_kind::delivered:
        if (idx < peers_.size() && peers_[idx] && peers_[idx]->live && c.conn == peers_[idx]->chosen) {
            peer_entry& p = *peers_[idx];
            p.delivered_posted = false;
            slot_done(idx, c.conn);
            credit_moved(idx); // more came, or was taken, while it was in flight
        }
        return;
    case wr_kind::op: {
        if (idx >= ops_.size() || ops_[idx].st != op_slot::state::posted)
            return;
        op_slot& o = ops_[idx];
        slot_done(o.peer, o.conn);
        if (c.status && !o.status)
            o.status = cause_of(c.status, o.conn);
        o.awaiting_local = false;
        if (o.status || !o.awaiting_ack)
            complete_op(idx);
        return;
    }
    case wr_kind::rndv_read: {
        if (idx >= recvs_.size() || recvs_[idx].st != recv_slot::state::reading)
            return;
        recv_slot& r = recvs_[idx];
        slot_done(r.peer, r.conn);
        --r.reads_outstanding;
        if (c.status && !r.status)
            r.status = cause_of(c.status, r.conn);
        if (r.reads_outstanding == 0 && (r.status || r.posted_bytes == r.to_read))
            progress_rndv(idx); // finishes it
        return;
    }
    case wr_kind::ack: {
        if (idx >= recvs_.size() || recvs_[idx].st != recv_slot::state::ack_sent)
            return;
        slot_done(recvs_[idx].peer, recvs_[idx].conn);
        free_recv(idx);
        return;
    }
    }
}

void endpoint_impl::on_message(std::uint32_t buf, std::uint32_t byte_len, std::uint32_t pi,
                               connection* c) noexcept
{
    std::span<const std::byte> b(recv_mem_.data() + static_cast<std::size_t>(buf) * buf_size_, byte_len);
    auto h = decode_header(b);
    if (!h || (h->type == msg_type::eager && h->length != byte_len - header_size) ||
        (h->type == msg_type::rts && byte_len < header_size + h->ndesc * remote_buffer::wire_size)) {
        repost(buf); // not ours, or damaged: dropped
        return;
    }
    peer_entry& p = *peers_[pi];
    if (c == p.chosen)
        on_delivered(pi, *h);
    if (h->type == msg_type::ready || h->type == msg_type::delivered) {
        repost(buf); // heard_on() and on_delivered() took what they say
        return;
    }
    if (h->type == msg_type::ack) {
        auto oi = static_cast<std::uint32_t>(h->id);
        if (oi < ops_.size()) {
            op_slot& o = ops_[oi];
            if (o.st == op_slot::state::posted && o.gen == static_cast<std::uint32_t>(h->id >> 32) &&
                o.awaiting_ack) {
                o.awaiting_ack = false;
                if (!o.awaiting_local)
                    complete_op(oi);
            }
        }
        repost(buf);
        return;
    }
    ++rx_count(p, c); // a data message (eager or rts): it took one of our credits
    unexpected_msg& m = held_[buf];
    m.peer = pi;
    m.conn = c;
    m.hdr = *h;
    m.byte_len = byte_len;
    m.claimed = false;
    std::uint32_t ri = posted_recvs_.find([&](std::uint32_t i) {
        const recv_slot& r = recvs_[i];
        return (r.from == nil || r.from == pi) && tag_matches(h->tag, r.tag, r.ignore);
    });
    if (ri != nil) {
        posted_recvs_.erase(ri);
        deliver(ri, buf);
    } else {
        m.held = true;
        unexpected_.push_back(buf);
        ++held_count_;
        ++p.held;
    }
    if (c == p.chosen)
        credit_moved(pi);
}

} // namespace rdmx::ep
