// The TCP backend's shared receive queue: a ring of posted receives that the engines of
// many connections take from (tcp_target.cpp), under a mutex of its own. Lock order: an
// engine's mutex, then this queue's; the event queue's last (after this one is released).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include <rdmx/queues.hpp>

#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_thread_safety.hpp"

namespace rdmx::tcp
{

class tcp_srq final : public shared_receive_queue
{
public:
    /// All allocation happens here. Throws invalid_argument for a depth or max_sge of 0.
    tcp_srq(std::shared_ptr<tcp_domain> dom, const shared_receive_queue_options& opts);
    ~tcp_srq() override;

    rdmx::backend backend() const noexcept override { return dom_->backend(); }
    std::uint32_t depth() const noexcept override { return depth_; }
    std::uint32_t max_sge() const noexcept override { return max_sge_; }
    using shared_receive_queue::post_recv;
    std::error_code post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept override
        RDMX_EXCLUDES(mu_);
    std::error_code arm_limit(std::uint32_t limit) noexcept override RDMX_EXCLUDES(mu_);

    /// The domain the receives' regions must belong to.
    const tcp_domain& domain() const noexcept { return *dom_; }
    /// The queue of `opts` (null if none) as a queue of domain `dom`; throws
    /// errc::invalid_argument naming `what` for one of another backend or domain.
    static std::shared_ptr<tcp_srq> of(const connection_options& opts, const tcp_domain& dom,
                                       std::string_view what);

    // --- the engines' side (any thread, the engine's mutex held) ---
    /// Takes the oldest posted receive: its wr_id, total length and SGEs (into `segs`, room
    /// for max_sge()). False when none is posted (the sender gets receiver-not-ready). May
    /// push srq_limit_reached.
    bool take(std::uint64_t& wr_id, std::uint64_t& length, std::uint32_t& nseg, seg* segs) noexcept
        RDMX_EXCLUDES(mu_);
    /// `n` completions of taken receives were polled (or dropped with their connection):
    /// their slots count against depth() no more.
    void retire(std::size_t n) noexcept;

private:
    struct entry {
        std::uint64_t wr_id = 0;
        std::uint64_t length = 0;
        std::uint32_t nseg = 0;
    };

    std::shared_ptr<tcp_domain> dom_; ///< owns the regions the receives name
    const std::uint32_t depth_;
    const std::uint32_t max_sge_;
    const std::shared_ptr<event_queue> events_;
    const std::uint64_t context_;

    engine_mutex mu_;
    std::vector<entry> ring_ RDMX_GUARDED_BY(mu_);
    std::vector<seg> segs_ RDMX_GUARDED_BY(mu_);  ///< max_sge_ per ring slot
    std::uint64_t head_ RDMX_GUARDED_BY(mu_) = 0; ///< posted, not taken: [head_, tail_)
    std::uint64_t tail_ RDMX_GUARDED_BY(mu_) = 0;
    /// Posted and not yet polled (taken or not): what depth() bounds. Raised under mu_ by
    /// post_recv; lowered without it by retire(), which a shared queue's poll calls for
    /// every receive it takes (a lock per message before). A post that reads it while a
    /// retire lands sees the larger count: it may refuse a receive early, never accept one
    /// too many.
    std::atomic<std::uint32_t> outstanding_{0};
    std::uint32_t limit_ RDMX_GUARDED_BY(mu_) = 0; ///< armed low watermark; 0: disarmed
};

} // namespace rdmx::tcp
