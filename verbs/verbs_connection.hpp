// The verbs half of an RC connection: CQ with its completion channel (for the sides that
// do not report to a shared completion queue, verbs/completion_queue.hpp), QP, and the
// data path (verbs_datapath.cpp) over them. It knows nothing of how the QP gets connected: cm/
// derives the connection that rdma_cm sets up (cm/cm_connection.hpp) and adds the state,
// the cm_id and disconnect. Set-up (this file's .cpp) is separate from the data path, as
// in eRPC.
#pragma once

#include <atomic>
#include <chrono>

#include <rdmx/connection.hpp>

#include <string_view>
#include <vector>

#include "cq_reservation.hpp"
#include "verbs/completion_queue.hpp"
#include "verbs/handles.hpp"
#include "verbs/protection_domain.hpp"
#include "verbs/qp_end.hpp"

namespace rdmx::verbs
{

/// Requests per ibv_post_send / ibv_post_recv call when converting a post list, and SGEs
/// per request; both bound the work-request arrays each connection builds once.
inline constexpr std::size_t post_batch = 16;
inline constexpr std::uint32_t max_sge_per_wr = 32;
inline constexpr int poll_batch = 32;

class shared_receive_queue;

/// Moves `qp` (if any) to the error state, so that everything posted completes with
/// IBV_WC_WR_FLUSH_ERR. Our QPs are not rdma_cm's: rdma_disconnect does not do this.
void flush_qp(ibv_qp* qp) noexcept;

/// A connection's QP, CQ and completion channel, taken out of it so that another thread can
/// destroy them later (cm/cm_connection.cpp: an iWARP QP whose connect the provider has not
/// answered, which ibv_destroy_qp waits for). Destroying it is the tear-down
/// verbs_connection::destroy_queues() describes; it holds the shared queues (and the shared
/// receive queue) the QP reports to until the QP is gone.
class detached_queues
{
public:
    detached_queues() noexcept = default;
    detached_queues(detached_queues&&) noexcept = default;
    detached_queues& operator=(detached_queues&&) = delete;
    ~detached_queues();

private:
    friend class verbs_connection;
    // The destructor destroys QP, CQ and channel; then the reservation goes (it reads the
    // shared receive queue's depth), then the shared receive queue.
    std::shared_ptr<rdmx::shared_receive_queue> srq_owner_;
    detail::cq_reservation shared_; ///< holds the shared CQs below
    completion_queue* send_shared_ = nullptr;
    completion_queue* recv_shared_ = nullptr;
    std::uint32_t qp_num_ = 0;
    comp_channel_ptr channel_;
    cq_ptr cq_;
    qp_ptr qp_;
};

class verbs_connection : public connection
{
public:
    ~verbs_connection() override;

    rdmx::backend backend() const noexcept override { return backend::verbs; }
    const connection_limits& limits() const noexcept override { return limits_; }

    std::error_code post(std::span<const work_request> wrs, std::size_t* posted) noexcept override;
    std::error_code post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept override;
    /// The completions of this connection's own CQ: those of the sides without a shared
    /// one (none if both sides are shared).
    std::size_t poll(std::span<completion> out) noexcept override;
    int completion_fd() const noexcept override { return channel_ ? channel_->fd : -1; }
    std::error_code request_notify(bool solicited_only) noexcept override;
    std::error_code ack_notify() noexcept override;

    /// Turns `wc`, a work completion of this QP polled from `from` (null: the own CQ), into
    /// `out` and frees the queue slots it stands for; false (nothing in `out`) for the
    /// goodbye's, which is rdmx's own (reserved_wr_id). Data-path thread (verbs_datapath.cpp).
    bool complete(const ibv_wc& wc, completion& out, const completion_queue* from) noexcept;
    /// Requests siw stranded (strands_): the connection ended with requests of its send
    /// queue not completed. Then, with the CQ its send side reports to polled empty, the
    /// caller calls flush_stranded() and, if that returns true, polls that CQ once more
    /// (siw has written the flush's completions by the time it returns), then
    /// complete_stranded(). Data-path thread.
    bool has_stranded() const noexcept
    {
        return strands_ && mirror_count_ && end_.ended.load(std::memory_order_acquire);
    }
    /// Moves the QP to the error state, once (siw: that waits for a flush in progress);
    /// true if it did so now. `from`: the CQ polled (null: the own one); false for any
    /// other than the send side's.
    bool flush_stranded(const completion_queue* from) noexcept;
    /// After flush_stranded() and the poll it asks for: what is left of the send queue,
    /// completed as flushed into `out`; how many.
    std::size_t complete_stranded(std::span<completion> out, const completion_queue* from) noexcept;

protected:
    /// What the connection set-up negotiated (the reads outstanding at the peer), for
    /// limits(); before the connection is handed out.
    void set_max_rd_atomic(std::uint32_t n) noexcept { limits_.max_rd_atomic = n; }
    /// The same, for the connection manager's event thread (before `established`).
    std::uint32_t* max_rd_atomic_slot() noexcept { return &limits_.max_rd_atomic; }
    /// Reserves room on the shared completion queues of `opts` (throws errc::no_resources
    /// naming `verb` and the queue without room) and creates the completion channel and
    /// the CQ of the sides without one; the QP comes with create_qp(). `keepalive` holds
    /// what owns `pd` (the domain), so that the PD outlives the queues whatever the order
    /// in which the application destroys domain and connection.
    verbs_connection(const protection_domain& pd, std::shared_ptr<const void> keepalive,
                     const connection_options& opts, std::string_view verb);

    /// Creates the QP (RESET state) with this connection's limits, records the inline size
    /// the driver granted, and attaches it to its shared completion queues (and, with a
    /// shared receive queue, to that).
    void create_qp();
    /// Tear-down with a shared receive queue, after the QP reported its last WQE: polls
    /// what is left in the (own) CQ, so that the receives this QP consumed and nobody will
    /// poll free their slots in the shared queue.
    void drop_completions() noexcept;
    /// Detaches the QP from its shared completion queues and destroys QP, CQ and
    /// completion channel, in that order (QP before its CQ, CQ before its channel; the
    /// shared queues drop what the QP left in them). The derived class calls it when its
    /// own order requires; idempotent.
    void destroy_queues() noexcept { [[maybe_unused]] detached_queues gone = take_queues(); }
    /// The first half of destroy_queues() (the QP leaves its shared completion queues, its
    /// windows are revoked); the rest happens when the result is destroyed, on whichever
    /// thread. Afterwards the connection has no QP, CQ or shared queue: only its destructor
    /// may follow.
    [[nodiscard]] detached_queues take_queues() noexcept;

    /// The goodbye before a disconnect: posts an RDMA write of the 8 bytes at `src` (a
    /// region of this PD) to (`rkey`, `addr`) at the peer, signalled, with reserved_wr_id,
    /// and waits up to `bound` for its completion, polling the CQ its send side reports to.
    /// The completions of other requests polled meanwhile are kept, in order, for the next
    /// poll() (the own CQ's here, a shared one's in that queue's stash). It has a send-queue
    /// slot and a CQ entry of its own (own_send_entries), so it never overruns either.
    /// True if the write completed successfully within `bound`. Calls the data path: the
    /// thread that polls, or none polls this connection's own CQ meanwhile.
    bool write_goodbye(const ibv_sge& src, std::uint32_t rkey, std::uint64_t addr,
                       std::chrono::milliseconds bound) noexcept;

    const protection_domain& pd() const noexcept { return pd_; }
    ibv_qp* qp() const noexcept { return qp_.get(); }
    /// False while a connection started without waiting is still connecting: post() then
    /// returns errc::not_connected (post_recv works once the QP exists). Set by the flow.
    std::atomic<bool> sendable_{true};
    /// The passive side (accept): its QP can send before ESTABLISHED reaches this side
    /// (RTS before rdma_accept; iWARP: once the stream is up), and a receive completion
    /// shows that the peer is up too, so it makes the connection sendable at once: a
    /// reply to a request that overtook the peer's RTU must not fail with not_connected.
    bool passive_ = false;
    /// Its own CQ (null when both sides report to shared ones).
    ibv_cq* cq() const noexcept { return cq_.get(); }
    /// The CQs its QP reports to, shared or its own.
    ibv_cq* send_cq() const noexcept { return send_shared_ ? send_shared_->native() : cq_.get(); }
    ibv_cq* recv_cq() const noexcept { return recv_shared_ ? recv_shared_->native() : cq_.get(); }
    /// The shared receive queue the QP consumes from; null: it has its own.
    shared_receive_queue* srq() const noexcept { return srq_; }
    /// The connection manager raises it when the connection ends (cm_state::report()).
    qp_end end_;

    /// An error completion (`status`) showed the QP in the error state: the connection
    /// says so in its state (as the TCP backend does). Called from poll(), on the
    /// data-path thread.
    virtual void on_error_completion(std::error_code status) noexcept = 0;

private:
    /// The own CQ's completions that write_goodbye() polled while it waited, for poll().
    [[gnu::noinline, gnu::cold]] std::size_t poll_stash(std::span<completion> out) noexcept;
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

    /// After an error: the completions its sides on shared queues may still produce there,
    /// by queue (post() and post_recv() stay within the reservation): owed_send_cq_ counts
    /// the send CQ's, owed_recv_cq_ the receive CQ's when that is another queue.
    std::uint32_t& owed(const completion_queue* q) noexcept
    {
        return q == send_shared_ ? owed_send_cq_ : owed_recv_cq_;
    }

    std::shared_ptr<const void> keepalive_; ///< owner of pd_; declared first, destroyed last
    const protection_domain& pd_;
    connection_limits limits_;
    const std::uint64_t context_; ///< connection_options::context, in every completion
    /// connection_options::srq, held until the QP attached to it is gone and the
    /// reservation below (whose release reads its depth) is released: declared before both.
    std::shared_ptr<rdmx::shared_receive_queue> srq_owner_;
    /// Room on the shared completion queues (it holds them: they outlive the QP).
    detail::cq_reservation shared_;
    completion_queue* send_shared_ = nullptr; ///< shared_.send_cq(), typed; null: own CQ
    completion_queue* recv_shared_ = nullptr;
    shared_receive_queue* srq_ = nullptr; ///< srq_owner_, for the data path
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
    /// From then on a side on a shared CQ posts only what its reservation there still
    /// holds: each request counts until a completion of this QP is polled from that CQ
    /// (outstanding requests count from the error on), so that a failed connection cannot
    /// overrun a queue others use.
    std::uint32_t owed_send_cq_ = 0;
    std::uint32_t owed_recv_cq_ = 0;

    /// siw: a request posted after the QP went to the error state sits in its user-mapped
    /// send queue for good (the kernel flushed that queue when the state changed; the
    /// doorbell of a QP in error flushes nothing), and a service that replies to a client
    /// the moment it dies would wait forever. So on siw the data path mirrors the send
    /// queue, posted request by request (the goodbye excepted: rdmx's own, it waits with a
    /// bound), and completes what is left of it once the connection ended
    /// (complete_stranded()). siw gives the opcode of error completions too, so each of the
    /// send queue's is told from the receive queue's.
    bool strands_ = false;
    struct mirror_entry {
        std::uint64_t wr_id;
        bool signaled;
        bool done; ///< completed, behind one that has not (a read siw completes late)
    };
    std::vector<mirror_entry> mirror_; ///< ring, send_queue_depth entries (siw only)
    std::size_t mirror_head_ = 0, mirror_count_ = 0;
    bool end_flushed_ = false; ///< complete_stranded() moved the QP to the error state
    mirror_entry& mirror_at(std::size_t i) noexcept { return mirror_[(mirror_head_ + i) % mirror_.size()]; }
    void mirror_push(std::uint64_t wr_id, bool signaled) noexcept
    {
        mirror_[(mirror_head_ + mirror_count_++) % mirror_.size()] = {wr_id, signaled, false};
    }
    /// A completion of the send queue, for request `wr_id`: with `error`, that request
    /// alone (siw completes each request in error, signalled or not); otherwise a signalled
    /// one and the unsignalled posted before it. siw completes a read after requests posted
    /// behind it, so the request is looked for by wr_id (the first not done with it; none:
    /// the first not done), and entries leave from the front once done.
    void mirror_complete(std::uint64_t wr_id, bool error) noexcept;

    /// The goodbye's completion: none yet, polled successful, polled with an error.
    enum class goodbye_state : std::uint8_t { none, ok, failed };
    std::atomic<goodbye_state> goodbye_{goodbye_state::none};
    /// Completions of the own CQ that write_goodbye() took out while waiting for its own:
    /// a ring as large as the CQ (allocated with it), emptied first by poll().
    std::vector<ibv_wc> stash_;
    std::size_t stash_head_ = 0, stash_count_ = 0;
};

} // namespace rdmx::verbs
