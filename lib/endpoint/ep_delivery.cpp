// Delivery acknowledgements of eager messages (docs/endpoints.md, "Completion semantics").
// An endpoint's eager send succeeds once the peer's endpoint holds the message. On RoCE, IB
// and TCP the send's own completion says so (the responder acknowledges a send only once a
// posted receive took it). On iWARP it does not: a send completes once TCP took it, and a
// receiver out of buffers ends the connection with the message lost. There every header
// carries how many eager messages its sender received over the connection, a header-only
// `delivered` message carries it when nothing else goes back, and an eager send completes
// when the count covers it (or fails with its connection). No allocation: the header slots
// are registered when a peer's entry is made.
#include "endpoint/ep_endpoint.hpp"

#include <cstdint>

namespace rdmx::ep
{

std::uint32_t endpoint_impl::tell_delivered(peer_entry& p) noexcept
{
    p.told = rx_count(p, p.chosen);
    return p.told;
}

void endpoint_impl::on_delivered(std::uint32_t pi, std::uint32_t delivered) noexcept
{
    peer_entry& p = *peers_[pi];
    // Counts wrap: compare by difference. A count past what we sent is a peer's error,
    // and completes nothing.
    if (static_cast<std::int32_t>(delivered - p.peer_delivered) <= 0 ||
        static_cast<std::int32_t>(delivered - p.tx_eager) > 0)
        return;
    p.peer_delivered = delivered;
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
        if (p.live && p.chosen && rx_count(p, p.chosen) != p.told) {
            // One in flight per peer (its slot is rewritten only when that completes), in
            // the send-queue slots kept for acknowledgements.
            if (p.delivered_posted || p.posted_wrs >= p.sq_depth) {
                keep = true;
            } else {
                header_block& b = *delivered_blocks_[pi / delivered_block];
                const std::size_t off = static_cast<std::size_t>(pi % delivered_block) * header_size;
                msg_header h{msg_type::delivered, 0, 0, 0, 0};
                h.delivered = rx_count(p, p.chosen);
                encode(h, b.mem.data() + off);
                sge s{b.mr.get(), off, header_size};
                work_request wr;
                wr.opcode = opcode::send;
                wr.wr_id = make_wr_id(wr_kind::delivered, pi);
                wr.local = {&s, 1};
                std::error_code ec = p.chosen->post({&wr, 1});
                if (!ec) {
                    p.told = h.delivered;
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
    while (delivery_acks_ && delivered_blocks_.size() * delivered_block <= i) {
        auto b = std::make_unique<header_block>();
        b->mr = dom_.register_memory(b->mem.data(), b->mem.size(), access::local_write);
        delivered_blocks_.push_back(std::move(b));
    }
}

} // namespace rdmx::ep
