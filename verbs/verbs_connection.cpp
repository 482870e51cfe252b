// Set-up and tear-down of a verbs connection's CQ and QP, and its place on shared CQs.
#include "verbs/verbs_connection.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <thread>

#include "validate.hpp"
#include "verbs/shared_receive_queue.hpp"

namespace rdmx::verbs
{

void flush_qp(ibv_qp* qp) noexcept
{
    if (!qp)
        return;
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(qp, &attr, IBV_QP_STATE);
}

verbs_connection::verbs_connection(const protection_domain& pd, std::shared_ptr<const void> keepalive,
                                   const connection_options& opts, std::string_view verb)
    : keepalive_(std::move(keepalive)), pd_(pd),
      limits_(detail::clamp_limits(opts, pd.limits(), max_sge_per_wr)), context_(opts.context),
      srq_owner_(opts.srq), shared_(opts, limits_, backend::verbs, verb),
      srq_(dynamic_cast<shared_receive_queue*>(opts.srq.get())), send_wrs_(limits_.max_send_sge),
      recv_wrs_(limits_.max_recv_sge), sq_retire_(limits_.send_queue_depth)
{
    if (srq_owner_ && (!srq_ || &srq_->pd() != &pd))
        throw_error(errc::invalid_argument, "connection: the shared receive queue belongs to another domain");
    const std::uint32_t sge_rd = pd.limits().max_sge_rd;
    max_read_sge_ = sge_rd ? std::min(limits_.max_send_sge, sge_rd) : limits_.max_send_sge;
    // Every completion_queue_base of the verbs backend is a verbs::completion_queue.
    send_shared_ = static_cast<completion_queue*>(shared_.send_cq());
    recv_shared_ = static_cast<completion_queue*>(shared_.recv_cq());
    strands_ = pd.siw();
    if (strands_) {
        mirror_.resize(limits_.send_queue_depth);
        if (send_shared_)
            end_.send_cq_watch = &send_shared_->stranded_watch;
    }
    for (completion_queue* q : {send_shared_, recv_shared_})
        if (q && q->context() != pd.native_context())
            throw_error(errc::invalid_argument,
                        std::string(verb) + ": the shared completion queue belongs to another device");
    // Own CQ: deep enough for every request of the sides that report to it to complete
    // unpolled. None if both sides are shared.
    // The send side's includes the goodbye's entry (own_send_entries).
    const std::uint32_t own = (send_shared_ ? 0 : limits_.send_queue_depth + detail::own_send_entries) +
                              (recv_shared_ ? 0 : limits_.recv_queue_depth);
    if (own == 0)
        return;
    channel_.reset(ibv_create_comp_channel(pd.native_context()));
    if (!channel_)
        throw_errno(errno, "ibv_create_comp_channel");
    // Non-blocking, so that ack_notify() never sleeps when no event is pending.
    int fl = fcntl(channel_->fd, F_GETFL);
    if (fl < 0 || fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        throw_errno(errno, "fcntl(completion channel, O_NONBLOCK)");
    // With a shared receive queue, recv_queue_depth is its depth: no more of its receives
    // can be outstanding, whichever connections consume them.
    int cqe = static_cast<int>(own);
    errno = 0; // providers may fail without one (throw_errno says so)
    cq_.reset(ibv_create_cq(pd.native_context(), cqe, this, channel_.get(), 0));
    if (!cq_)
        throw_errno(errno, "ibv_create_cq");
    stash_.resize(static_cast<std::size_t>(std::max(cq_->cqe, cqe)));
}

verbs_connection::~verbs_connection()
{
    destroy_queues();
}

detached_queues verbs_connection::take_queues() noexcept
{
    detached_queues q;
    if (qp_) {
        q.qp_num_ = qp_->qp_num;
        // No completion reaches this connection once its destruction began...
        for (completion_queue* sq : {send_shared_, recv_shared_})
            if (sq)
                sq->detach(q.qp_num_);
        pd_.revoke_windows_of(qp_.get()); // before the QP: protection_domain.hpp says why
        q.send_shared_ = send_shared_;
        q.recv_shared_ = recv_shared_;
    }
    q.qp_ = std::move(qp_);
    q.cq_ = std::move(cq_);
    q.channel_ = std::move(channel_);
    q.shared_ = std::move(shared_);
    q.srq_owner_ = std::move(srq_owner_);
    send_shared_ = recv_shared_ = nullptr;
    srq_ = nullptr;
    return q;
}

detached_queues::~detached_queues()
{
    const bool had_qp = static_cast<bool>(qp_);
    qp_.reset(); // QP before its CQ
    // None of the QP's completions stays on a shared queue, where a later QP with its
    // number would be handed it.
    if (had_qp) {
        if (send_shared_)
            send_shared_->purge(qp_num_);
        if (recv_shared_ && recv_shared_ != send_shared_)
            recv_shared_->purge(qp_num_);
    }
    cq_.reset(); // CQ before its completion channel
    channel_.reset();
    // Then the room on the shared queues and the queues themselves (the reservation), and
    // the shared receive queue: the QP that used them is gone.
}

void verbs_connection::create_qp()
{
    ibv_qp_init_attr init{};
    init.send_cq = send_cq();
    init.recv_cq = recv_cq();
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0; // selective signalling: send_flags::signaled decides per request
    // One slot more than the application may fill: the goodbye's (write_goodbye).
    init.cap.max_send_wr = limits_.send_queue_depth + detail::own_send_entries;
    init.cap.max_send_sge = limits_.max_send_sge;
    if (srq_) {
        init.srq = srq_->native(); // no receive queue of its own: the recv caps are ignored
    } else {
        init.cap.max_recv_wr = limits_.recv_queue_depth;
        init.cap.max_recv_sge = limits_.max_recv_sge;
    }
    init.cap.max_inline_data = limits_.max_inline;
    errno = 0; // siw may fail without one (verbs/siw_mmap_guard.hpp)
    qp_.reset(ibv_create_qp(pd_.native_pd(), &init));
    if (!qp_)
        throw_errno(errno, "ibv_create_qp");
    // Drivers may grant more than asked; report what is in effect.
    limits_.max_inline = init.cap.max_inline_data;
    if (send_shared_)
        send_shared_->attach(qp_->qp_num, *this, srq_);
    if (recv_shared_ && recv_shared_ != send_shared_)
        recv_shared_->attach(qp_->qp_num, *this, srq_);
}

void verbs_connection::drop_completions() noexcept
{
    if (!srq_ || !cq_)
        return;
    for (; stash_count_; --stash_count_) {
        const ibv_wc& w = stash_[stash_head_];
        stash_head_ = stash_head_ + 1 == stash_.size() ? 0 : stash_head_ + 1;
        if (srq_->owns(w.wr_id))
            srq_->complete(w.wr_id);
    }
    ibv_wc wc[poll_batch];
    int got = 0;
    while ((got = ibv_poll_cq(cq_.get(), poll_batch, wc)) > 0)
        for (int i = 0; i < got; ++i)
            if (srq_->owns(wc[i].wr_id))
                srq_->complete(wc[i].wr_id);
}

bool verbs_connection::write_goodbye(const ibv_sge& src, std::uint32_t rkey, std::uint64_t addr,
                                     std::chrono::milliseconds bound) noexcept
{
    if (!qp_)
        return false;
    ibv_sge sg = src;
    ibv_send_wr wr{};
    wr.wr_id = reserved_wr_id;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    // Signalled: its completion says the peer has it (RC: acknowledged; iWARP: in the
    // ordered stream ahead of the disconnect). Inline where the QP allows it.
    wr.send_flags = IBV_SEND_SIGNALED;
    if (limits_.max_inline >= sg.length)
        wr.send_flags |= IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    goodbye_.store(goodbye_state::none, std::memory_order_relaxed);
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp_.get(), &wr, &bad))
        return false;
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (;;) {
        if (send_shared_) {
            send_shared_->stash_polled();
        } else {
            // Everything but the goodbye goes to the stash, in order: entries in the CQ and
            // the stash together are at most what the CQ holds.
            ibv_wc wc[poll_batch];
            int got = ibv_poll_cq(cq_.get(), poll_batch, wc);
            for (int i = 0; i < got; ++i) {
                if (wc[i].wr_id == reserved_wr_id) {
                    completion ignored;
                    complete(wc[i], ignored, nullptr);
                } else if (stash_count_ < stash_.size()) { // always: the CQ's depth bounds it
                    stash_[(stash_head_ + stash_count_++) % stash_.size()] = wc[i];
                }
            }
        }
        const goodbye_state g = goodbye_.load(std::memory_order_acquire);
        if (g != goodbye_state::none)
            return g == goodbye_state::ok;
        if (std::chrono::steady_clock::now() >= deadline)
            return false;
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

void verbs_connection::note_error(std::error_code status) noexcept
{
    if (counting_) {
        // Everything still counted may yet complete, on the CQ of its side.
        const bool same = send_shared_ && send_shared_ == recv_shared_;
        owed_send_cq_ = sq_outstanding_ + (same ? rq_outstanding_ : 0);
        owed_recv_cq_ = same ? 0 : rq_outstanding_;
    }
    counting_ = false;
    on_error_completion(status);
}

} // namespace rdmx::verbs
