// The verbs half of an RC connection: CQ with its completion channel, QP, and the data path
// (verbs_datapath.cpp) over them. It knows nothing of how the QP gets connected: cm/
// derives the connection that rdma_cm sets up (cm/cm_connection.hpp) and adds the state,
// the cm_id and disconnect. Set-up (this file's .cpp) is separate from the data path, as
// in eRPC.
#pragma once

#include <atomic>

#include <rdmx/connection.hpp>

#include <vector>

#include "verbs/handles.hpp"
#include "verbs/protection_domain.hpp"

namespace rdmx::verbs
{

/// Requests per ibv_post_send / ibv_post_recv call when converting a post list, and SGEs
/// per request; both bound the work-request arrays each connection builds once.
inline constexpr std::size_t post_batch = 16;
inline constexpr std::uint32_t max_sge_per_wr = 32;
inline constexpr int poll_batch = 32;

/// Moves `qp` (if any) to the error state, so that everything posted completes with
/// IBV_WC_WR_FLUSH_ERR. Our QPs are not rdma_cm's: rdma_disconnect does not do this.
void flush_qp(ibv_qp* qp) noexcept;

class verbs_connection : public connection
{
public:
    ~verbs_connection() override;

    rdmx::backend backend() const noexcept override { return backend::verbs; }
    const connection_limits& limits() const noexcept override { return limits_; }

    std::error_code post(std::span<const work_request> wrs, std::size_t* posted) noexcept override;
    std::error_code post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept override;
    std::size_t poll(std::span<completion> out) noexcept override;
    int completion_fd() const noexcept override { return channel_->fd; }
    std::error_code request_notify(bool solicited_only) noexcept override;
    std::error_code ack_notify() noexcept override;

protected:
    /// Creates the completion channel and the CQ; the QP comes with create_qp().
    /// `keepalive` holds what owns `pd` (the domain), so that the PD outlives the queues
    /// whatever the order in which the application destroys domain and connection.
    verbs_connection(const protection_domain& pd, std::shared_ptr<const void> keepalive,
                     const connection_options& opts);

    /// Creates the QP (RESET state) with this connection's limits, and records the inline
    /// size the driver granted.
    void create_qp();
    /// Destroys QP, CQ and completion channel, in that order (QP before its CQ, CQ before
    /// its channel). The derived class calls it when its own order requires; idempotent.
    void destroy_queues() noexcept;

    const protection_domain& pd() const noexcept { return pd_; }
    ibv_qp* qp() const noexcept { return qp_.get(); }
    /// False while a connection started without waiting is still connecting: post() then
    /// returns errc::not_connected (post_recv works once the QP exists). Set by the flow.
    std::atomic<bool> sendable_{true};
    ibv_cq* cq() const noexcept { return cq_.get(); }

    /// An error completion (`status`) showed the QP in the error state: the connection
    /// says so in its state (as the TCP backend does). Called from poll(), on the
    /// data-path thread.
    virtual void on_error_completion(std::error_code status) noexcept = 0;

private:
    /// Stops counting queue slots and hands `status` to on_error_completion. Slow path,
    /// kept out of poll()'s loop body.
    [[gnu::noinline, gnu::cold]] void note_error(std::error_code status) noexcept;
    /// Frees the queue slots that a successful completion of `op` stands for.
    void retire(rdmx::opcode op) noexcept
    {
        if (op == opcode::recv || op == opcode::recv_with_imm) {
            if (rq_outstanding_)
                --rq_outstanding_;
        } else if (retire_count_) {
            sq_outstanding_ -= sq_retire_[retire_head_];
            retire_head_ = retire_head_ + 1 == sq_retire_.size() ? 0 : retire_head_ + 1;
            --retire_count_;
        }
    }

    std::shared_ptr<const void> keepalive_; ///< owner of pd_; declared first, destroyed last
    const protection_domain& pd_;
    connection_limits limits_;
    // Destroyed by destroy_queues() in the order the device requires (see there).
    comp_channel_ptr channel_;
    cq_ptr cq_;
    qp_ptr qp_;

    /// The provider work requests of the data path, built once, as perftest builds its own:
    /// a post writes only the fields a request sets, so nothing is allocated or cleared per
    /// operation (a 128-byte clear per request is a `rep stos`, which an emulated guest runs
    /// one word at a time). post_batch slots chained by `next` for lists, and one more, on
    /// its own, for a single request; each slot has `sges` SGEs of its own
    /// (limits_.max_send_sge or max_recv_sge).
    template <class IbvWr> struct wr_array {
        std::vector<IbvWr> wr;
        std::vector<ibv_sge> sge;

        explicit wr_array(std::size_t sges) : wr(post_batch + 1), sge((post_batch + 1) * sges)
        {
            for (std::size_t i = 0; i <= post_batch; ++i) {
                wr[i].sg_list = sge.data() + i * sges;
                wr[i].next = i + 1 < post_batch ? &wr[i + 1] : nullptr;
            }
        }
        wr_array(const wr_array&) = delete; // `next` and `sg_list` point into it
        wr_array& operator=(const wr_array&) = delete;
    };
    wr_array<ibv_send_wr> send_wrs_;
    wr_array<ibv_recv_wr> recv_wrs_;

    /// SGEs a read may scatter into: max_send_sge, and no more than the device's max_sge_rd.
    std::uint32_t max_read_sge_ = 1;
    // rdmx's own count of each queue's outstanding requests, so that post() says
    // would_block at the depth on every provider (siw took 1590 writes on a queue of 8)
    // and the CQ, sized for both depths, cannot overrun. Data-path thread only.
    std::uint32_t sq_outstanding_ = 0;
    std::uint32_t rq_outstanding_ = 0;
    std::uint32_t sq_unsignaled_ = 0;      ///< posted since the last signalled request
    std::vector<std::uint32_t> sq_retire_; ///< ring: slots each outstanding signalled request frees
    std::size_t retire_head_ = 0;
    std::size_t retire_count_ = 0;
    /// False once an error completion was polled: the QP is in the error state and flushes
    /// both queues, and a flushed completion does not say which queue it came from.
    bool counting_ = true;
};

} // namespace rdmx::verbs
