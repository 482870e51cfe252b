// Credits and delivery acknowledgements of data messages (eager and rts; docs/endpoints.md,
// "Flow control" and "Completion semantics").
//
// Credits, on every provider: every header tells the peer how many data messages we have
// received over the connection (`delivered`) and how many more we take (`credit`); the
// peer sends message number delivered + credit at most, and queues the rest. A peer's credit
// is its window (the buffers beyond unexpected_limit, shared by the connected peers and one
// newcomer) less what it holds beyond its share of unexpected_limit: a peer whose messages
// nobody receives stops at share + window, and the others keep their buffers. The shared
// receive queue never runs dry, so no sender meets receiver-not-ready, and on iWARP, where
// running dry ends the connection, no flood ends another peer's.
//
// Delivery acknowledgements, on iWARP: an endpoint's eager send succeeds once the peer's
// endpoint holds the message. On RoCE, IB and TCP the send's own completion says so (the
// responder acknowledges a send only once a posted receive took it). On iWARP a send
// completes once TCP took it; there an eager send completes when the peer's `delivered`
// count covers it (or fails with its connection).
//
// A header-only `delivered` message carries both when no other message goes back. No
// allocation: the header slots are registered when a peer's entry is made.
#include "endpoint/ep_endpoint.hpp"

#include <algorithm>
#include <cstdint>

namespace rdmx::ep
{

std::uint32_t endpoint_impl::credit_for(const peer_entry& p) const noexcept
{
    // Shares of the connected peers and one more, so that a newcomer finds room for its
    // initial credit and its share before the others' credits shrink.
    const auto n = static_cast<std::uint32_t>(connected_peers_) + 1;
    const std::uint32_t share = std::max<std::uint32_t>(1, opts_.unexpected_limit / n);
    const std::uint32_t window = std::clamp<std::uint32_t>(
        (opts_.receive_buffers - opts_.unexpected_limit) / n, initial_credit, max_window);
    const std::uint32_t excess = p.held > share ? p.held - share : 0;
    return window > excess ? window - excess : 0;
}

void endpoint_impl::stamp(const peer_entry& p, msg_header& h) const noexcept
{
    h.delivered = rx_count(p, p.chosen);
    h.credit = static_cast<std::uint16_t>(credit_for(p)); // at most max_window
}

bool endpoint_impl::ack_wanted(const peer_entry& p) const noexcept
{
    if (!p.live || !p.chosen)
        return false;
    if (p.nudge_due)
        return true;
    const std::uint32_t rx = rx_count(p, p.chosen);
    if (delivery_acks_ && rx != p.told)
        return true;
    const std::uint32_t credit = credit_for(p);
    const auto more = static_cast<std::int32_t>(rx + credit - p.told_grant);
    if (more <= 0)
        return false;
    // The peer may be stopped (all it was granted came) or is running low: tell it.
    return static_cast<std::int32_t>(rx - p.told_grant) >= 0 ||
           static_cast<std::uint32_t>(more) >= std::max<std::uint32_t>(1, credit / 2);
}

void endpoint_impl::credit_moved(std::uint32_t pi) noexcept
{
    if (pi < peers_.size() && peers_[pi] && ack_wanted(*peers_[pi]))
        need_ack(pi);
}

void endpoint_impl::on_delivered(std::uint32_t pi, const msg_header& h) noexcept
{
    peer_entry& p = *peers_[pi];
    const std::uint32_t delivered = h.delivered;
    // Counts wrap: compare by difference. A count past what we sent is a peer's error, an
    // older one a stale header: both change nothing.
    if (static_cast<std::int32_t>(delivered - p.tx) > 0 ||
        static_cast<std::int32_t>(delivered - p.peer_delivered) < 0)
        return;
    const bool moved = delivered != p.peer_delivered;
    p.peer_delivered = delivered;
    p.peer_credit = h.credit;
    if (p.queued.size != 0)
        list_once(kick_, p.in_kick, pi); // sends waiting for credit may go
    if (!moved || !delivery_acks_)
        return;
    for (std::uint32_t oi = p.outstanding.head; oi != nil;) {
        std::uint32_t next = ops_[oi].next;
        op_slot& o = ops_[oi];
        if (o.kind == endpoint_op::send && !o.rndv && o.awaiting_ack &&
            static_cast<std::int32_t>(o.seq - delivered) <= 0) {
            o.awaiting_ack = false;
            if (!o.awaiting_local)
                complete_op(oi);
        }
        oi = next;
    }
}

void endpoint_impl::need_ack(std::uint32_t pi) noexcept
{
    list_once(ack_due_, peers_[pi]->in_ack_due, pi);
}

void endpoint_impl::send_due_acks() noexcept
{
    for (std::size_t k = 0; k < ack_due_.size();) {
        const std::uint32_t pi = ack_due_[k];
        peer_entry& p = *peers_[pi];
        bool keep = false;
        if (ack_wanted(p)) {
            // One in flight per peer (its slot is rewritten only when that completes), in
            // the send-queue slots kept for acknowledgements.
            if (p.delivered_posted || p.posted_wrs >= p.sq_depth) {
                keep = true;
            } else {
                header_block& b = *delivered_blocks_[pi / delivered_block];
                const std::size_t off = static_cast<std::size_t>(pi % delivered_block) * header_size;
                msg_header h{msg_type::delivered, 0, 0, 0, 0};
                stamp(p, h);
                encode(h, b.mem.data() + off);
                sge s{b.mr.get(), off, header_size};
                work_request wr;
                wr.opcode = opcode::send;
                wr.wr_id = make_wr_id(wr_kind::delivered, pi);
                wr.local = {&s, 1};
                std::error_code ec = p.chosen->post({&wr, 1});
                if (!ec) {
                    note_told(p, h);
                    p.nudge_due = false;
                    p.delivered_posted = true;
                    ++p.posted_wrs;
                } else {
                    keep = ec == errc::would_block; // else the connection's end follows
                }
            }
        }
        if (keep) {
            ++k;
        } else {
            p.in_ack_due = false;
            ack_due_[k] = ack_due_.back();
            ack_due_.pop_back();
        }
    }
}

void endpoint_impl::ensure_delivered_slot(std::uint32_t i)
{
    while (delivered_blocks_.size() * delivered_block <= i) {
        auto b = std::make_unique<header_block>();
        b->mr = dom_.register_memory(b->mem.data(), b->mem.size(), access::local_write);
        delivered_blocks_.push_back(std::move(b));
    }
}

} // namespace rdmx::ep
