// The endpoint's data path: issuing and queueing operations, the shared completion queue,
// tag matching, eager delivery, rendezvous reads and acknowledgements, and poll(). No
// allocation: every slot, list and buffer here was sized at open (docs/endpoints.md).
#include "endpoint/ep_endpoint.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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
    ring_[(ring_head_ + ring_count_) % ring_.size()] = c;
    ++ring_count_;
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
    if (p.chosen && p.queued.size == 0 && post_op(oi) != post_result::no_room)
        return {}; // posted, or failed (its completion says why)
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
    switch (o.kind) {
    case endpoint_op::send:
        wr.opcode = opcode::send;
        if (!o.rndv) {
            encode(msg_header{msg_type::eager, 0, o.tag, o.length, 0}, ctrl);
            s[n++] = sge{ctrl_mr_.get(), ctrl_off, header_size};
            for (std::uint8_t i = 0; i < o.nsge; ++i)
                s[n++] = o.sges[i];
        } else {
            std::uint64_t id = (static_cast<std::uint64_t>(o.gen) << 32) | oi;
            encode(msg_header{msg_type::rts, o.nsge, o.tag, o.length, id}, ctrl);
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
    case endpoint_op::recv: break; // receives have slots of their own, never an op slot
    }
    wr.local = std::span<const sge>(s.data(), n);
    std::error_code ec = p.chosen->post({&wr, 1});
    if (ec == errc::would_block)
        return post_result::no_room;
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
    o.awaiting_ack = o.rndv;
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
    completion batch[64];
    for (int round = 0; round < 16; ++round) {
        std::size_t n = cq_->poll(batch);
        for (std::size_t i = 0; i < n; ++i)
            on_completion(batch[i]);
        if (n < std::size(batch))
            return;
    }
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
        if (p.queued.size != 0 && !p.in_kick) {
            p.in_kick = true;
            kick_.push_back(pi); // reserved to the vector's size
        }
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
    case wr_kind::op: {
        if (idx >= ops_.size() || ops_[idx].st != op_slot::state::posted)
            return;
        op_slot& o = ops_[idx];
        slot_done(o.peer, o.conn);
        if (c.status && !o.status)
            o.status = c.status;
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
            r.status = c.status;
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
    if (h->type == msg_type::ready) {
        repost(buf); // heard_on() took what it says
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
        return;
    }
    m.held = true;
    unexpected_.push_back(buf);
    ++held_count_;
}

void endpoint_impl::deliver(std::uint32_t ri, std::uint32_t buf) noexcept
{
    recv_slot& r = recvs_[ri];
    unexpected_msg& m = held_[buf];
    m.held = false;
    r.peer = m.peer;
    r.msg_tag = m.hdr.tag;
    r.msg_length = m.hdr.length;
    const std::byte* data = recv_mem_.data() + static_cast<std::size_t>(buf) * buf_size_ + header_size;
    if (m.hdr.type == msg_type::eager) {
        std::uint64_t left = m.hdr.length;
        for (std::uint8_t i = 0; i < r.nsge && left != 0; ++i) {
            std::uint64_t n = std::min<std::uint64_t>(left, r.sges[i].length);
            std::memcpy(r.sges[i].region->data() + r.sges[i].offset, data, n);
            data += n;
            left -= n;
        }
        repost(buf);
        finish_recv(ri);
        return;
    }
    // Rendezvous: read the sender's memory into the receive's buffers.
    r.conn = m.conn;
    r.remote_id = m.hdr.id;
    r.ndesc = m.hdr.ndesc;
    std::uint64_t sum = 0;
    bool ok = r.conn != nullptr;
    for (std::uint8_t i = 0; i < r.ndesc && ok; ++i) {
        auto d = remote_buffer::parse({data + i * remote_buffer::wire_size, remote_buffer::wire_size});
        ok = d.has_value();
        if (ok) {
            r.desc[i] = *d;
            sum += d->length;
        }
    }
    repost(buf);
    if (!ok || sum != r.msg_length) {
        r.status = ok ? std::error_code(errc::protocol_error) : std::error_code(errc::disconnected);
        finish_recv(ri);
        return;
    }
    std::uint64_t cap = 0;
    for (std::uint8_t i = 0; i < r.nsge; ++i)
        cap += r.sges[i].length;
    r.to_read = std::min(cap, r.msg_length);
    r.posted_bytes = 0;
    r.reads_outstanding = 0;
    r.st = recv_slot::state::reading;
    progress_rndv(ri);
}

void endpoint_impl::progress_rndv(std::uint32_t ri) noexcept
{
    recv_slot& r = recvs_[ri];
    if (r.st == recv_slot::state::ack_pending) {
        post_ack(ri);
        return;
    }
    peer_entry& p = *peers_[r.peer];
    if (!p.chosen && !r.status && (r.conn == p.accepted.get() || r.conn == p.dial.get())) {
        // The request came on a connection whose `established` event is not polled yet
        // (verbs: the dialler may send before the acceptor sees ESTABLISHED): read once it is.
        if (!pending_recvs_.contains(ri))
            pending_recvs_.push_back(ri);
        return;
    }
    if (r.conn != p.chosen && !r.status)
        r.status = errc::disconnected;
    while (!r.status && r.posted_bytes < r.to_read) {
        if (p.posted_wrs >= p.user_budget) {
            if (!pending_recvs_.contains(ri))
                pending_recvs_.push_back(ri);
            return;
        }
        // Where posted_bytes falls in the sender's descriptors and in our buffers.
        std::uint64_t pos = r.posted_bytes, soff = pos, doff = pos;
        std::uint8_t si = 0, di = 0;
        while (si < r.ndesc && soff >= r.desc[si].length)
            soff -= r.desc[si++].length;
        while (di < r.nsge && doff >= r.sges[di].length)
            doff -= r.sges[di++].length;
        std::uint64_t chunk =
            std::min({r.desc[si].length - soff, r.sges[di].length - doff, max_chunk_, r.to_read - pos});
        sge l{r.sges[di].region, r.sges[di].offset + doff, chunk};
        auto remote = r.desc[si].slice(soff, chunk);
        work_request wr;
        wr.opcode = opcode::read;
        wr.wr_id = make_wr_id(wr_kind::rndv_read, ri);
        wr.local = {&l, 1};
        wr.remote = *remote;
        std::error_code ec = r.conn->post({&wr, 1});
        if (ec == errc::would_block) {
            if (!pending_recvs_.contains(ri))
                pending_recvs_.push_back(ri);
            return;
        }
        if (ec) {
            r.status = ec;
            break;
        }
        r.posted_bytes += chunk;
        ++r.reads_outstanding;
        ++p.posted_wrs;
    }
    pending_recvs_.erase(ri);
    if (r.reads_outstanding != 0)
        return;
    if (r.status) {
        finish_recv(ri);
        return;
    }
    // All read: the receive completes; the sender's send completes on the ack.
    endpoint_completion c;
    c.context = r.context;
    c.op = endpoint_op::recv;
    c.peer = handle_of(r.peer);
    c.tag = r.msg_tag;
    c.length = r.msg_length;
    if (r.to_read < r.msg_length)
        c.status = errc::local_length;
    push(c);
    r.st = recv_slot::state::ack_pending;
    post_ack(ri);
}

void endpoint_impl::post_ack(std::uint32_t ri) noexcept
{
    recv_slot& r = recvs_[ri];
    peer_entry& p = *peers_[r.peer];
    if (!p.chosen && (r.conn == p.accepted.get() || r.conn == p.dial.get())) {
        if (!pending_recvs_.contains(ri))
            pending_recvs_.push_back(ri); // not established on this side yet
        return;
    }
    if (r.conn != p.chosen) {
        free_recv(ri); // the connection is gone; the sender's send fails with it
        return;
    }
    // Acks may use the slots kept back from operations (on_connected), so that they do
    // not wait behind them.
    if (p.posted_wrs < p.sq_depth) {
        std::size_t off =
            static_cast<std::size_t>(ctrl_size_) * ops_.size() + static_cast<std::size_t>(ri) * header_size;
        encode(msg_header{msg_type::ack, 0, 0, 0, r.remote_id}, ctrl_mem_.data() + off);
        sge s{ctrl_mr_.get(), off, header_size};
        work_request wr;
        wr.opcode = opcode::send;
        wr.wr_id = make_wr_id(wr_kind::ack, ri);
        wr.local = {&s, 1};
        std::error_code ec = r.conn->post({&wr, 1});
        if (!ec) {
            ++p.posted_wrs;
            r.st = recv_slot::state::ack_sent;
            pending_recvs_.erase(ri);
            return;
        }
        if (ec != errc::would_block) {
            free_recv(ri);
            return;
        }
    }
    if (!pending_recvs_.contains(ri))
        pending_recvs_.push_back(ri);
}

void endpoint_impl::finish_recv(std::uint32_t ri) noexcept
{
    recv_slot& r = recvs_[ri];
    endpoint_completion c;
    c.context = r.context;
    c.op = endpoint_op::recv;
    c.status = r.status;
    c.peer = r.peer != nil ? handle_of(r.peer) : rdmx::peer{};
    c.tag = r.msg_tag;
    c.length = r.msg_length;
    if (!c.status) {
        std::uint64_t cap = 0;
        for (std::uint8_t i = 0; i < r.nsge; ++i)
            cap += r.sges[i].length;
        if (r.msg_length > cap)
            c.status = errc::local_length;
    }
    push(c);
    free_recv(ri);
}

void endpoint_impl::repost(std::uint32_t buf) noexcept
{
    if (held_count_ >= opts_.unexpected_limit) {
        // Back-pressure: while unexpected_limit messages are held, buffers are not given
        // back, so the receive queue runs dry and senders meet receiver-not-ready.
        deferred_reposts_.push_back(buf); // reserved to receive_buffers
        return;
    }
    sge s{recv_mr_.get(), static_cast<std::size_t>(buf) * buf_size_, buf_size_};
    if (srq_->post_recv({&s, 1}, make_wr_id(wr_kind::srq, buf)))
        deferred_reposts_.push_back(buf);
}

void endpoint_impl::release_unexpected(std::uint32_t buf) noexcept
{
    unexpected_msg& m = held_[buf];
    if (!m.held && !m.claimed)
        return;
    unexpected_.erase(buf);
    m.held = m.claimed = false;
    m.peer = nil;
    m.conn = nullptr;
    --held_count_;
    repost(buf);
}

// --- receiving ---

std::error_code endpoint_impl::recv(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore,
                                    std::span<const sge> local, std::uint64_t context) noexcept
{
    std::uint32_t pi = nil;
    if (from != any_peer && (pi = index_of(from)) == nil)
        return errc::invalid_argument;
    std::uint64_t total = 0;
    if (local.size() > max_sges)
        return errc::invalid_argument;
    if (auto ec = check_sges(local, access::local_write, &total))
        return ec;
    std::uint32_t ri = take_recv_slot();
    if (ri == nil)
        return errc::would_block;
    recv_slot& r = recvs_[ri];
    r.st = recv_slot::state::posted;
    r.from = pi;
    r.tag = tag;
    r.ignore = ignore;
    r.context = context;
    r.nsge = static_cast<std::uint8_t>(local.size());
    std::copy(local.begin(), local.end(), r.sges.begin());
    std::uint32_t buf = unexpected_.find([&](std::uint32_t b) {
        const unexpected_msg& m = held_[b];
        return (pi == nil || m.peer == pi) && tag_matches(m.hdr.tag, tag, ignore);
    });
    if (buf == nil) {
        posted_recvs_.push_back(ri);
        return {};
    }
    unexpected_.erase(buf);
    --held_count_;
    deliver(ri, buf);
    return {};
}

std::optional<endpoint::message_info> endpoint_impl::peek(rdmx::peer from, std::uint64_t tag,
                                                          std::uint64_t ignore, bool claim) noexcept
{
    std::uint32_t pi = nil;
    if (from != any_peer && (pi = index_of(from)) == nil)
        return std::nullopt;
    std::uint32_t buf = unexpected_.find([&](std::uint32_t b) {
        const unexpected_msg& m = held_[b];
        return (pi == nil || m.peer == pi) && tag_matches(m.hdr.tag, tag, ignore);
    });
    if (buf == nil)
        return std::nullopt;
    unexpected_msg& m = held_[buf];
    message_info info;
    info.source = handle_of(m.peer);
    info.tag = m.hdr.tag;
    info.length = m.hdr.length;
    if (claim) {
        unexpected_.erase(buf);
        m.held = false;
        m.claimed = true;
        if (++m.claim_gen == 0)
            m.claim_gen = 1;
        info.claim = (static_cast<std::uint64_t>(m.claim_gen) << 32) | buf;
    }
    return info;
}

std::error_code endpoint_impl::recv_claimed(std::uint64_t claim, std::span<const sge> local,
                                            std::uint64_t context) noexcept
{
    auto buf = static_cast<std::uint32_t>(claim);
    if (buf >= held_.size() || !held_[buf].claimed ||
        held_[buf].claim_gen != static_cast<std::uint32_t>(claim >> 32))
        return errc::invalid_argument;
    std::uint64_t total = 0;
    if (local.size() > max_sges)
        return errc::invalid_argument;
    if (auto ec = check_sges(local, access::local_write, &total))
        return ec;
    std::uint32_t ri = take_recv_slot();
    if (ri == nil)
        return errc::would_block;
    recv_slot& r = recvs_[ri];
    r.st = recv_slot::state::posted;
    r.from = held_[buf].peer;
    r.context = context;
    r.nsge = static_cast<std::uint8_t>(local.size());
    std::copy(local.begin(), local.end(), r.sges.begin());
    held_[buf].claimed = false;
    --held_count_;
    deliver(ri, buf);
    return {};
}

// --- progress ---

std::size_t endpoint_impl::poll(std::span<endpoint_completion> out) noexcept
{
    // One system call tells which of fd()'s descriptors need one. A busy-polling caller
    // made five (TCP) or six (rxe) per call before, whether anything had come or not, each
    // a few microseconds under emulation (docs/endpoints.md, "What an endpoint holds").
    epoll_event evs[8];
    int nready = ::epoll_wait(epoll_fd_, evs, 8, 0);
    for (int i = 0; i < nready; ++i) {
        const int fd = evs[i].data.fd;
        std::uint64_t v;
        if (fd == timer_fd_) {
            [[maybe_unused]] auto r = ::read(timer_fd_, &v, sizeof v);
        } else if (fd == wake_fd_) {
            [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
            wake_raised_ = false;
        } else if (fd == cq_->fd()) {
            cq_->ack_notify(); // the armed notification fired: arm again below
            cq_armed_ = false;
        } else if (fd == listener_->fd()) {
            take_requests();
        }
    }
    poll_cq();
    poll_events();
    run_timers();
    for (int pass = 0; pass < 2; ++pass) {
        for (std::uint32_t pi : kick_) {
            peers_[pi]->in_kick = false;
            flush_queue(pi);
        }
        kick_.clear();
        for (std::uint32_t ri = pending_recvs_.front(); ri != nil;) {
            std::uint32_t next = pending_recvs_.next(ri);
            progress_rndv(ri);
            ri = next;
        }
        while (!deferred_reposts_.empty() && held_count_ < opts_.unexpected_limit) {
            std::uint32_t buf = deferred_reposts_.back();
            deferred_reposts_.pop_back();
            sge s{recv_mr_.get(), static_cast<std::size_t>(buf) * buf_size_, buf_size_};
            if (srq_->post_recv({&s, 1}, make_wr_id(wr_kind::srq, buf))) {
                deferred_reposts_.push_back(buf);
                break;
            }
        }
        if (pass == 0 && !cq_armed_) {
            // Arm, then look once more: a completion that came before the arming raises no
            // event, so fd() would miss it. An arming stays until a completion fires it.
            cq_->request_notify();
            cq_armed_ = true;
            poll_cq();
        }
    }
    std::size_t n = 0;
    while (n < out.size() && ring_count_ != 0) {
        out[n++] = ring_[ring_head_];
        ring_head_ = (ring_head_ + 1) % ring_.size();
        --ring_count_;
    }
    arm_timerfd();
    if (ring_count_ != 0 && !wake_raised_) {
        std::uint64_t one = 1;
        [[maybe_unused]] auto w = ::write(wake_fd_, &one, sizeof one); // fd() stays readable
        wake_raised_ = true;
    }
    return n;
}

std::size_t endpoint_impl::wait(std::span<endpoint_completion> out,
                                std::chrono::milliseconds timeout) noexcept
{
    auto deadline = clock::now() + timeout;
    for (;;) {
        if (std::size_t n = poll(out))
            return n;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
        if (left <= 0)
            return 0;
        epoll_event evs[8];
        int rc = ::epoll_wait(epoll_fd_, evs, 8, static_cast<int>(std::min<long long>(left, 1000)) + 1);
        if (rc < 0 && errno != EINTR)
            return 0;
    }
}

} // namespace rdmx::ep
