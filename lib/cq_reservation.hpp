// Internal: what every backend's shared completion queue has in common, the ledger of the
// entries its connections reserved (rdmx/queues.hpp: overrun is impossible by
// construction), and the reservation one connection holds on its shared queues.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <rdmx/queues.hpp>

namespace rdmx::detail
{

/// The base of both backends' shared completion queues: depth() and reserved().
class completion_queue_base : public completion_queue
{
public:
    std::uint32_t depth() const noexcept override { return depth_; }
    std::uint32_t reserved() const noexcept override;

    /// For a poller inside rdmx (an endpoint) that sleeps on a set of its own: a
    /// descriptor readable while the queue's connections have data that a poll() would
    /// read on the caller's thread (TCP: the epoll set of their sockets), or -1 where
    /// completions come from elsewhere (verbs). A sleeper that watches it beside fd()
    /// arms with request_notify_watching().
    virtual int progress_fd() const noexcept { return -1; }
    /// progress_fd() for a sleeper that puts it into an epoll set of its own, counted: -1
    /// also when too many sets nest it already (TCP: domain_progress::add_nesting); the
    /// sleeper then arms with request_notify(). unnest_progress_fd() after its set is
    /// closed, for each descriptor it got.
    virtual int nest_progress_fd() noexcept { return -1; }
    virtual void unnest_progress_fd() noexcept {}
    /// request_notify() for a sleeper that also watches progress_fd(): data that arrives
    /// wakes it through that descriptor, so the queue's connections need not be read for
    /// it meanwhile (TCP: their engine threads leave the sockets to its polls).
    virtual std::error_code request_notify_watching() noexcept { return request_notify(false); }

    /// Reserves `n` entries, plus `srq->depth()` if `srq` is not null and no other
    /// connection on this queue reserved for that SRQ yet (refcounted per SRQ). Throws
    /// rdmx::error(no_resources) naming `role` ("send_cq", "recv_cq"), `verb` and `why`
    /// (the depth that did not fit) when depth() - reserved() has no room.
    void reserve(std::uint32_t n, const shared_receive_queue* srq, std::string_view verb,
                 std::string_view role, std::string_view why);
    /// Gives back what reserve() took.
    void release(std::uint32_t n, const shared_receive_queue* srq) noexcept;

protected:
    explicit completion_queue_base(std::uint32_t depth) noexcept : depth_(depth) {}

private:
    const std::uint32_t depth_;
    mutable std::mutex mu_; ///< reserved_ and srq_refs_ (set-up and tear-down only)
    std::uint32_t reserved_ = 0;
    /// The SRQs whose depth is reserved here, with the number of connections using each.
    std::vector<std::pair<const shared_receive_queue*, std::uint32_t>> srq_refs_;
};

/// Entries a connection reserves on a shared send CQ beyond send_queue_depth for a request
/// of rdmx's own: the goodbye a verbs connection writes before it disconnects
/// (cm_connection::disconnect). The TCP backend reserves it too, so that a queue's sizing
/// is the same on both.
inline constexpr std::uint32_t own_send_entries = 1;

/// What one connection reserved on the shared queues of its connection_options (send_cq:
/// send_queue_depth + own_send_entries; recv_cq: recv_queue_depth, or with opts.srq that SRQ's depth once per
/// queue); given back on destruction. Empty when the connection has queues of its own.
class cq_reservation
{
public:
    cq_reservation() noexcept = default;
    /// Throws rdmx::error: invalid_argument for a queue of another backend than `b`,
    /// no_resources (naming `verb`, the queue and the depth) for one without room; then
    /// nothing stays reserved.
    cq_reservation(const connection_options& opts, const connection_limits& lim, rdmx::backend b,
                   std::string_view verb);
    ~cq_reservation();
    cq_reservation(cq_reservation&& o) noexcept;
    cq_reservation& operator=(cq_reservation&& o) noexcept;

    /// The shared queues (null: that side has its own).
    completion_queue_base* send_cq() const noexcept { return send_.get(); }
    completion_queue_base* recv_cq() const noexcept { return recv_.get(); }
    /// Entries this connection holds on each (what its completions there may number).
    std::uint32_t send_entries() const noexcept { return send_n_; }
    std::uint32_t recv_entries() const noexcept { return recv_n_; }

private:
    void release() noexcept;

    std::shared_ptr<completion_queue_base> send_, recv_;
    std::uint32_t send_n_ = 0, recv_n_ = 0;
    const shared_receive_queue* srq_ = nullptr;
};

} // namespace rdmx::detail
