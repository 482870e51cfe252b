// A completion queue that many verbs connections report to (rdmx::completion_queue): an
// ibv_cq with a completion channel of its own, and the table that routes each work
// completion to its connection by qp_num, so that the connection frees the queue slots
// the completion stands for, as its own poll() would. Set-up and tear-down here; poll()
// is data path and lives in verbs_datapath.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cq_reservation.hpp"
#include "verbs/handles.hpp"
#include "verbs/protection_domain.hpp"

namespace rdmx::verbs
{

class verbs_connection;

class completion_queue final : public detail::completion_queue_base
{
public:
    /// `depth` is clamped to the device's max_cqe. `keepalive` holds what owns `pd` (the
    /// domain), so that the device context outlives the CQ.
    completion_queue(const protection_domain& pd, std::shared_ptr<const void> keepalive, std::uint32_t depth);
    ~completion_queue() override;

    rdmx::backend backend() const noexcept override { return backend::verbs; }
    std::size_t poll(std::span<completion> out) noexcept override;
    int fd() const noexcept override { return channel_->fd; }
    std::error_code request_notify(bool solicited_only) noexcept override;
    std::error_code ack_notify() noexcept override;
    ibv_cq* native() const noexcept override { return cq_.get(); }

    ibv_context* context() const noexcept { return cq_->context; }

    // --- for the connections (set-up and tear-down threads) ---
    /// Routes the completions of `qp_num` to `c` from now on. May allocate; throws.
    void attach(std::uint32_t qp_num, verbs_connection& c);
    /// Stops routing `qp_num`: its completions polled from now on are dropped. Waits for a
    /// poll() in progress, which may be handing one to the connection.
    void detach(std::uint32_t qp_num) noexcept;
    /// After the QP of `qp_num` was destroyed: drops its completions that are still queued,
    /// so that a later QP with the same number never receives them. The others are moved,
    /// in order, to the stash that poll() empties first.
    void purge(std::uint32_t qp_num) noexcept;

private:
    /// Hands `wc` to its connection as `out`; false if it has none (dropped).
    bool route(const ibv_wc& wc, completion& out) noexcept;

    std::shared_ptr<const void> keepalive_; ///< owner of the device context; destroyed last
    comp_channel_ptr channel_;
    cq_ptr cq_;     ///< destroyed before its channel; every QP on it is gone first (it holds us)
    std::mutex mu_; ///< routes_ and the stash; held through each poll()
    std::unordered_map<std::uint32_t, verbs_connection*> routes_;
    /// Completions purge() took out of the CQ for connections still attached: a ring as
    /// large as the CQ (its entries and the CQ's together are at most what is reserved).
    std::vector<ibv_wc> stash_;
    std::size_t stash_head_ = 0, stash_count_ = 0;
};

} // namespace rdmx::verbs
