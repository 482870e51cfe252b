// The verbs backend's shared receive queue: an ibv_srq on the domain's protection domain,
// which the QPs of many connections consume from (ibv_qp_init_attr::srq). rdmx counts its
// outstanding receives itself, as a connection counts its own queues: each posted receive
// holds a slot until its completion is polled, so that no receive CQ it feeds can overrun.
// The slot is also the wr_id the device sees (the eRPC pattern), which tells a receive of
// this queue from a send in the same CQ even in an error completion, whose opcode is
// undefined. How its asynchronous events reach it is cm/'s business (cm/cm_srq.cpp).
#pragma once

#include <rdmx/queues.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "verbs/handles.hpp"
#include "verbs/protection_domain.hpp"

namespace rdmx::verbs
{

class shared_receive_queue : public rdmx::shared_receive_queue
{
public:
    /// Throws errc::not_supported naming the device if it has no SRQs (max_srq 0).
    /// `keepalive` holds what owns `pd` (the domain), as for a connection.
    shared_receive_queue(const protection_domain& pd, std::shared_ptr<const void> keepalive,
                         const shared_receive_queue_options& opts);
    ~shared_receive_queue() override;

    rdmx::backend backend() const noexcept override { return backend::verbs; }
    std::uint32_t depth() const noexcept override { return depth_; }
    std::uint32_t max_sge() const noexcept override { return max_sge_; }
    using rdmx::shared_receive_queue::post_recv;
    std::error_code post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept override;
    std::error_code arm_limit(std::uint32_t limit) noexcept override;
    ibv_srq* native() const noexcept override { return srq_.get(); }

    const protection_domain& pd() const noexcept { return pd_; }

    // --- the connections' side (the thread that polls their CQ) ---
    /// Whether `wr_id` (of a polled ibv_wc) is one of this queue's slots.
    bool owns(std::uint64_t wr_id) const noexcept
    {
        const auto base = reinterpret_cast<std::uintptr_t>(wr_ids_.data());
        return wr_id >= base && wr_id < base + wr_ids_.size() * sizeof(std::uint64_t) &&
               (wr_id - base) % sizeof(std::uint64_t) == 0;
    }
    /// The receive in slot `wr_id` (owns() holds) completed and was polled: frees the slot
    /// and returns the application's wr_id.
    std::uint64_t complete(std::uint64_t wr_id) noexcept;

    /// The device reported IBV_EVENT_SRQ_LIMIT_REACHED (the event loop's thread).
    void limit_reached() noexcept;

private:
    std::shared_ptr<const void> keepalive_; ///< owner of pd_; declared first, destroyed last
    const protection_domain& pd_;
    std::uint32_t depth_ = 0;
    std::uint32_t max_sge_ = 0;
    const std::shared_ptr<event_queue> events_;
    const std::uint64_t context_;

    std::mutex mu_; ///< posting and completing may run on different threads
    /// Slot -> the application's wr_id; never resized (owns() checks addresses in it).
    std::vector<std::uint64_t> wr_ids_;
    std::vector<std::uint32_t> free_; ///< a stack of free slots: [0, nfree_)
    std::size_t nfree_ = 0;
    /// The provider work requests of a post, built once (post_batch of them).
    std::vector<ibv_recv_wr> wrs_;
    std::vector<ibv_sge> sges_;
    srq_ptr srq_; ///< last: destroyed first, before the PD that keepalive_ holds
};

} // namespace rdmx::verbs
