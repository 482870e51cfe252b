// Set-up and tear-down of a verbs connection's CQ and QP.
#include "verbs/verbs_connection.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

#include "verbs/verbs_domain.hpp"

namespace rdmx::verbs {

verbs_connection::verbs_connection(verbs_domain& dom, const connection_options& opts)
    : domain_(dom), opts_(opts)
{
    const device_limits& dev = dom.limits();
    limits_.send_queue_depth = std::clamp<std::uint32_t>(opts.send_queue_depth, 1, dev.max_qp_wr);
    limits_.recv_queue_depth = std::clamp<std::uint32_t>(opts.recv_queue_depth, 1, dev.max_qp_wr);
    limits_.max_send_sge = std::clamp<std::uint32_t>(opts.max_send_sge, 1, std::min(dev.max_sge, max_sge_per_wr));
    limits_.max_recv_sge = std::clamp<std::uint32_t>(opts.max_recv_sge, 1, std::min(dev.max_sge, max_sge_per_wr));
    limits_.max_inline = std::min(opts.max_inline, dev.max_inline);
    limits_.max_rd_atomic = std::clamp<std::uint32_t>(opts.max_rd_atomic, 1,
                                                      std::min(dev.max_qp_rd_atom, dev.max_qp_init_rd_atom));

    channel_.reset(ibv_create_comp_channel(dom.native_context()));
    if (!channel_)
        throw_errno(errno, "ibv_create_comp_channel");
    // Non-blocking, so that ack_notify() never sleeps when no event is pending.
    int fl = fcntl(channel_->fd, F_GETFL);
    if (fl < 0 || fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        throw_errno(errno, "fcntl(completion channel, O_NONBLOCK)");
    // One CQ for both queues, deep enough for every request of both to complete unpolled.
    int cqe = static_cast<int>(limits_.send_queue_depth + limits_.recv_queue_depth);
    cq_.reset(ibv_create_cq(dom.native_context(), cqe, this, channel_.get(), 0));
    if (!cq_)
        throw_errno(errno, "ibv_create_cq");
}

verbs_connection::~verbs_connection()
{
    if (id_) {
        domain_.events().detach(id_.get());
        if (qp_)
            rdma_destroy_qp(id_.get()); // QP before its CQ
        qp_ = nullptr;
    }
    cq_.reset();      // CQ before its completion channel
    channel_.reset();
    id_.reset();      // waits until every event of the id was acknowledged
}

void verbs_connection::create_qp()
{
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq_.get();
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0; // selective signalling: send_flags::signaled decides per request
    init.cap.max_send_wr = limits_.send_queue_depth;
    init.cap.max_recv_wr = limits_.recv_queue_depth;
    init.cap.max_send_sge = limits_.max_send_sge;
    init.cap.max_recv_sge = limits_.max_recv_sge;
    init.cap.max_inline_data = limits_.max_inline;
    if (rdma_create_qp(id_.get(), domain_.native_pd(), &init))
        throw_errno(errno, "rdma_create_qp");
    qp_ = id_->qp;
    // Drivers may grant more than asked; report what is in effect.
    limits_.max_inline = init.cap.max_inline_data;
}

rdma_conn_param verbs_connection::conn_param(std::span<const std::byte> private_data) const noexcept
{
    rdma_conn_param p{};
    p.private_data = private_data.empty() ? nullptr : private_data.data();
    p.private_data_len = static_cast<std::uint8_t>(private_data.size());
    p.responder_resources = static_cast<std::uint8_t>(std::min<std::uint32_t>(limits_.max_rd_atomic, 255));
    p.initiator_depth = p.responder_resources;
    p.retry_count = std::min<std::uint8_t>(opts_.retry_count, 7);
    p.rnr_retry_count = std::min<std::uint8_t>(opts_.rnr_retry_count, 7);
    return p;
}

connection_state verbs_connection::state() const noexcept
{
    std::lock_guard lock(cm_.mutex);
    return cm_.state;
}

void verbs_connection::disconnect() noexcept
{
    std::lock_guard lock(cm_.mutex);
    if (cm_.state == connection_state::established || cm_.state == connection_state::connecting) {
        // Moves the QP to the error state: every posted request is flushed.
        rdma_disconnect(id_.get());
        cm_.state = connection_state::disconnected;
    }
}

native_handles verbs_connection::native() const noexcept
{
    return {id_.get(), qp_, domain_.native_pd(), cq_.get()};
}

} // namespace rdmx::verbs
