// A verbs RC connection: cm_id, CQ with its completion channel, QP. Set-up (this file's
// .cpp and cm/cm_flow.cpp) is separate from the data path (verbs_datapath.cpp), as in eRPC.
#pragma once

#include <rdmx/connection.hpp>

#include <vector>

#include "cm/event_loop.hpp"
#include "verbs/handles.hpp"

namespace rdmx::verbs
{

class verbs_domain;

/// Requests per ibv_post_send / ibv_post_recv call when converting a post list, and SGEs
/// per request; both bound the work-request arrays each connection builds once.
inline constexpr std::size_t post_batch = 16;
inline constexpr std::uint32_t max_sge_per_wr = 32;
inline constexpr int poll_batch = 32;

class verbs_connection final : public connection
{
public:
    verbs_connection(verbs_domain& dom, const connection_options& opts);
    ~verbs_connection() override;

    /// Client side: resolve, route, QP, rdma_connect; waits for ESTABLISHED.
    void connect(const uri& address, std::span<const std::byte> private_data);
    /// Server side: takes over `id` (from a CONNECT_REQUEST), QP, rdma_accept; waits.
    void accept(cm_id_ptr id, const rdma_conn_param& request, std::span<const std::byte> private_data,
                std::vector<std::byte> peer_private_data);

    rdmx::backend backend() const noexcept override { return backend::verbs; }
    connection_state state() const noexcept override;
    std::error_code last_error() const noexcept override;
    const connection_limits& limits() const noexcept override { return limits_; }
    std::span<const std::byte> peer_private_data() const noexcept override { return peer_private_; }

    std::error_code post(std::span<const work_request> wrs, std::size_t* posted) noexcept override;
    std::error_code post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept override;
    std::size_t poll(std::span<completion> out) noexcept override;
    int completion_fd() const noexcept override { return channel_->fd; }
    std::error_code request_notify(bool solicited_only) noexcept override;
    std::error_code ack_notify() noexcept override;
    void disconnect() noexcept override;
    native_handles native() const noexcept override;

private:
    /// Creates the QP ourselves (ibv_create_qp, not rdma_create_qp) and moves it to INIT.
    void create_qp();
    /// Moves the QP to RTR or RTS with the attributes rdma_cm negotiated
    /// (rdma_init_qp_attr), then overrides the ones that are ours to choose. rdma_cm alone
    /// would give each side the RNR retry count the *peer* offered (IB CM REQ/REP) and a
    /// min_rnr_timer of 0 (655 ms); doing the transitions here makes connection_options
    /// mean this side's own behaviour, as it does on TCP.
    /// `rd_atomic`, when not 0, overrides the negotiated read depth: max_dest_rd_atomic at
    /// RTR, max_rd_atomic at RTS (the passive side applies what its accept promised, as
    /// librdmacm's rdma_accept does).
    void modify_qp(ibv_qp_state to, std::uint8_t rd_atomic = 0);
    /// Moves the QP to the error state so that everything posted is flushed.
    void flush_qp() noexcept;
    /// An error completion (`status`) showed the QP in the error state: say so in state()
    /// and last_error(), as the TCP backend does, and stop counting queue slots. Slow path,
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
    rdma_conn_param conn_param(std::span<const std::byte> private_data) const noexcept;

    std::shared_ptr<verbs_domain> owner_; ///< keeps domain_ alive; declared first, destroyed last
    verbs_domain& domain_;
    connection_options opts_;
    connection_limits limits_;
    std::vector<std::byte> peer_private_;
    mutable cm::cm_state cm_;
    // Destruction order matters and is done by hand in the destructor: detach from the
    // event loop, destroy the QP, then the CQ, then its channel, then the cm_id (which
    // waits for its events to be acknowledged).
    comp_channel_ptr channel_;
    cq_ptr cq_;
    cm_id_ptr id_;
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
