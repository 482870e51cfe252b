// The endpoint's receive side: recv, peek and claim, delivering a matched message (eager
// copy, or the rendezvous reads and the acknowledgement), and giving receive buffers back
// (the credits they give back: ep_delivery.cpp). No allocation (docs/endpoints.md).
#include "endpoint/ep_endpoint.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_driver.hpp"
#include "log.hpp"

namespace rdmx::ep
{

// --- delivering ---

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
            const memory_region& mr = *r.sges[i].region;
            if (mr.memory_type() != memory_type::cuda) {
                std::memcpy(mr.data() + r.sges[i].offset, data, n);
            } else if (std::string why;
                       !detail::copy_device(false, mr.device(), mr.data() + r.sges[i].offset, data, n, why)) {
                // Device memory is copied by the driver; if it fails, the receive does.
                RDMX_LOG(warn, "endpoint: an eager message into device memory: %s", why.c_str());
                r.status = errc::local_protection;
                break;
            }
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
        msg_header h{msg_type::ack, 0, 0, 0, r.remote_id};
        stamp(p, h);
        encode(h, ctrl_mem_.data() + off);
        std::error_code ec = send_header(*r.conn, off, make_wr_id(wr_kind::ack, ri));
        if (!ec) {
            note_told(p, h);
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
    // Back-pressure is the senders' credits ("Flow control"): a buffer goes back at once.
    sge s{recv_mr_.get(), static_cast<std::size_t>(buf) * buf_size_, buf_size_};
    if (srq_->post_recv({&s, 1}, make_wr_id(wr_kind::srq, buf)))
        deferred_reposts_.push_back(buf); // reserved to receive_buffers; retried by poll()
}

void endpoint_impl::unhold(std::uint32_t buf) noexcept
{
    const std::uint32_t pi = held_[buf].peer;
    --held_count_;
    if (pi < peers_.size() && peers_[pi] && peers_[pi]->held != 0) {
        --peers_[pi]->held;
        credit_moved(pi); // its share has room again
    }
}

void endpoint_impl::release_unexpected(std::uint32_t buf) noexcept
{
    unexpected_msg& m = held_[buf];
    if (!m.held && !m.claimed)
        return;
    unexpected_.erase(buf);
    unhold(buf);
    m.held = m.claimed = false;
    m.peer = nil;
    m.conn = nullptr;
    repost(buf);
}

// --- receiving ---

std::error_code endpoint_impl::new_recv(std::uint32_t from, std::span<const sge> local, std::uint64_t context,
                                        std::uint32_t* ri) noexcept
{
    std::uint64_t total = 0;
    if (local.size() > max_sges)
        return errc::invalid_argument;
    if (auto ec = check_sges(local, access::local_write, &total))
        return ec;
    *ri = take_recv_slot();
    if (*ri == nil)
        return errc::would_block;
    recv_slot& r = recvs_[*ri];
    r.st = recv_slot::state::posted;
    r.from = from;
    r.context = context;
    r.nsge = static_cast<std::uint8_t>(local.size());
    std::copy(local.begin(), local.end(), r.sges.begin());
    return {};
}

std::uint32_t endpoint_impl::find_unexpected(std::uint32_t pi, std::uint64_t tag,
                                             std::uint64_t ignore) noexcept
{
    return unexpected_.find([&](std::uint32_t b) {
        const unexpected_msg& m = held_[b];
        return (pi == nil || m.peer == pi) && tag_matches(m.hdr.tag, tag, ignore);
    });
}

std::error_code endpoint_impl::recv(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore,
                                    std::span<const sge> local, std::uint64_t context) noexcept
{
    bool matched = false;
    return recv(from, tag, ignore, local, context, matched);
}

std::error_code endpoint_impl::recv(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore,
                                    std::span<const sge> local, std::uint64_t context, bool& matched) noexcept
{
    matched = false;
    std::uint32_t pi = nil;
    if (from != any_peer && (pi = index_of(from)) == nil)
        return errc::invalid_argument;
    std::uint32_t ri = nil;
    if (auto ec = new_recv(pi, local, context, &ri))
        return ec;
    recvs_[ri].tag = tag;
    recvs_[ri].ignore = ignore;
    std::uint32_t buf = find_unexpected(pi, tag, ignore);
    if (buf == nil) {
        posted_recvs_.push_back(ri);
        return {};
    }
    unexpected_.erase(buf);
    unhold(buf);
    matched = true;
    deliver(ri, buf);
    settle();
    return {};
}

std::error_code endpoint_impl::cancel_recv(std::uint64_t context) noexcept
{
    std::uint32_t ri = posted_recvs_.find([&](std::uint32_t i) { return recvs_[i].context == context; });
    if (ri == nil)
        return errc::invalid_argument;
    posted_recvs_.erase(ri);
    recvs_[ri].status = errc::canceled;
    finish_recv(ri);
    settle();
    return {};
}

std::optional<endpoint::message_info> endpoint_impl::peek(rdmx::peer from, std::uint64_t tag,
                                                          std::uint64_t ignore, bool claim) noexcept
{
    std::uint32_t pi = nil;
    if (from != any_peer && (pi = index_of(from)) == nil)
        return std::nullopt;
    std::uint32_t buf = find_unexpected(pi, tag, ignore);
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
    std::uint32_t ri = nil;
    if (auto ec = new_recv(held_[buf].peer, local, context, &ri))
        return ec;
    held_[buf].claimed = false;
    unhold(buf);
    deliver(ri, buf);
    settle();
    return {};
}

} // namespace rdmx::ep
