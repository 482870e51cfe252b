// A completion queue that many verbs connections report to (rdmx::completion_queue): an
// ibv_cq with a completion channel of its own, and the table that routes each work
// completion to its connection by qp_num, so that the connection frees the queue slots
// the completion stands for, as its own poll() would. Set-up and tear-down here; poll()
// is data path and lives in verbs_datapath.cpp.
#pragma once

#include <atomic>
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
class shared_receive_queue;

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
    /// Routes the completions of `qp_num` to `c` from now on; `srq`: the shared receive
    /// queue its QP consumes from (null: none). May allocate; throws.
    void attach(std::uint32_t qp_num, verbs_connection& c, shared_receive_queue* srq);
    /// Stops routing `qp_num`: its completions polled from now on are dropped (a receive
    /// of its shared receive queue among them frees its slot there). Waits for a poll() in
    /// progress, which may be handing one to the connection.
    void detach(std::uint32_t qp_num) noexcept;
    /// After the QP of `qp_num` was destroyed: drops its completions that are still queued,
    /// so that a later QP with the same number never receives them, and forgets the QP.
    /// The others are moved, in order, to the stash that poll() empties first. Nothing,
    /// if a new QP with that number is attached already.
    void purge(std::uint32_t qp_num) noexcept;

    /// For a connection waiting for its goodbye (verbs_connection::write_goodbye): polls
    /// everything queued, hands each goodbye to its connection and moves the rest, in
    /// order, to the stash that poll() empties first.
    void stash_polled() noexcept;

    /// Raised when a connection whose send side reports here ended on siw, which may have
    /// stranded requests (verbs_connection::has_stranded()): poll() looks for them once the
    /// CQ is empty.
    std::atomic<bool> stranded_watch{false};

private:
    /// Hands `wc` to its connection as `out`; false if it has none (dropped) or it is
    /// rdmx's own (a goodbye).
    bool route(const ibv_wc& wc, completion& out) noexcept;
    /// Polls the CQ into `out` (mu_ held); `drained`: it had no more.
    std::size_t drain(std::span<completion> out, bool& drained) noexcept;
    /// The requests that connections here stranded (stranded_watch), into `out`; mu_ held.
    [[gnu::noinline, gnu::cold]] std::size_t poll_stranded(std::span<completion> out) noexcept;

    std::shared_ptr<const void> keepalive_; ///< owner of the device context; destroyed last
    comp_channel_ptr channel_;
    cq_ptr cq_;     ///< destroyed before its channel; every QP on it is gone first (it holds us)
    std::mutex mu_; ///< routes_ and the stash; held through each poll()
    struct route_entry {
        verbs_connection* conn = nullptr; ///< null once detached, until purge()
        shared_receive_queue* srq = nullptr;
    };
    std::unordered_map<std::uint32_t, route_entry> routes_;
    /// A dropped completion of a QP on `srq`: a receive of that queue frees its slot.
    static void release(shared_receive_queue* srq, const ibv_wc& wc) noexcept;
    /// Completions purge() took out of the CQ for connections still attached: a ring as
    /// large as the CQ (its entries and the CQ's together are at most what is reserved).
    std::vector<ibv_wc> stash_;
    std::size_t stash_head_ = 0, stash_count_ = 0;
};

} // namespace rdmx::verbs
