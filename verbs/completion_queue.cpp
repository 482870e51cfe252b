// Set-up and tear-down of a shared verbs completion queue, and the routing table's upkeep.
#include "verbs/completion_queue.hpp"
#include "verbs/shared_receive_queue.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

namespace rdmx::verbs
{
namespace
{

std::uint32_t clamp_depth(const protection_domain& pd, std::uint32_t depth) noexcept
{
    return std::clamp<std::uint32_t>(depth, 1, std::max<std::uint32_t>(1, pd.max_cqe()));
}

} // namespace

completion_queue::completion_queue(const protection_domain& pd, std::shared_ptr<const void> keepalive,
                                   std::uint32_t depth)
    : completion_queue_base(clamp_depth(pd, depth)), keepalive_(std::move(keepalive))
{
    channel_.reset(ibv_create_comp_channel(pd.native_context()));
    if (!channel_)
        throw_errno(errno, "ibv_create_comp_channel");
    // Non-blocking, so that ack_notify() never sleeps when no event is pending.
    int fl = fcntl(channel_->fd, F_GETFL);
    if (fl < 0 || fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        throw_errno(errno, "fcntl(completion channel, O_NONBLOCK)");
    errno = 0; // providers may fail without one (throw_errno says so)
    cq_.reset(ibv_create_cq(pd.native_context(), static_cast<int>(this->depth()), this, channel_.get(), 0));
    if (!cq_)
        throw_errno(errno, "ibv_create_cq");
    // The provider may round the CQ up: the stash holds whatever the CQ can.
    stash_.resize(std::max<std::size_t>(this->depth(), static_cast<std::size_t>(std::max(cq_->cqe, 0))));
    routes_.reserve(64);
}

completion_queue::~completion_queue() = default;

void completion_queue::attach(std::uint32_t qp_num, verbs_connection& c, shared_receive_queue* srq)
{
    std::lock_guard lk(mu_);
    routes_[qp_num] = {&c, srq};
}

void completion_queue::detach(std::uint32_t qp_num) noexcept
{
    std::lock_guard lk(mu_);
    auto it = routes_.find(qp_num);
    if (it == routes_.end())
        return;
    if (it->second.srq)
        it->second.conn = nullptr; // kept until purge(): its dropped receives free their slots
    else
        routes_.erase(it);
}

void completion_queue::release(shared_receive_queue* srq, const ibv_wc& wc) noexcept
{
    if (srq && srq->owns(wc.wr_id))
        srq->complete(wc.wr_id);
}

void completion_queue::purge(std::uint32_t qp_num) noexcept
{
    std::lock_guard lk(mu_);
    shared_receive_queue* srq = nullptr;
    if (auto it = routes_.find(qp_num); it != routes_.end()) {
        // A QP created since (the number was free once the old one was destroyed, and
        // purge may run on another thread: cm_connection's deferred tear-down) owns the
        // number now, with what is queued for it: nothing here is the old QP's to drop.
        if (it->second.conn)
            return;
        srq = it->second.srq;
        routes_.erase(it);
    }
    // What the stash holds of the QP goes first; the rest closes up, in order.
    std::size_t kept = 0;
    for (std::size_t i = 0; i < stash_count_; ++i) {
        const ibv_wc& wc = stash_[(stash_head_ + i) % stash_.size()];
        if (wc.qp_num != qp_num)
            stash_[(stash_head_ + kept++) % stash_.size()] = wc;
        else
            release(srq, wc);
    }
    stash_count_ = kept;
    // Then the CQ itself: some providers (mlx5) clean a destroyed QP's entries out of its
    // CQs, others (rxe) leave them there.
    ibv_wc wc[16];
    for (;;) {
        int got = ibv_poll_cq(cq_.get(), 16, wc);
        for (int i = 0; i < got; ++i) {
            if (wc[i].qp_num == qp_num) {
                release(srq, wc[i]);
                continue;
            }
            if (stash_count_ == stash_.size()) // cannot happen: the reservations bound both
                continue;
            stash_[(stash_head_ + stash_count_++) % stash_.size()] = wc[i];
        }
        if (got < 16)
            break;
    }
}

} // namespace rdmx::verbs
