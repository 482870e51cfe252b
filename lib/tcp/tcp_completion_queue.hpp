// A completion queue that many TCP connections report to (rdmx::completion_queue): one
// bounded FIFO of completions, each tagged with the engine it came from, and an eventfd
// for event mode. Engines push into it (the engine thread, or an application thread that
// posts) while they hold their own mutex; the application polls it. A poll that finds it
// empty runs its domain's progress on the caller's thread (domain_progress, tcp_progress.hpp:
// the connections of every shared queue of the domain that have data or work pending
// read, answer what came and send what they held back; docs/tcp-engine.md, "Progress by
// the polled queue"), so that a completion needs no hop through the engine thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cq_reservation.hpp"
#include "tcp/tcp_completion.hpp"
#include "tcp/tcp_progress.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_thread_safety.hpp"

namespace rdmx::tcp
{

class tcp_srq;

/// The slots one connection's completions hold on its shared completion queues until they
/// are polled (as on verbs: a shared queue never holds more of a connection's completions
/// than it reserved). Its engine counts one up before it pushes (under the engine's
/// mutex); the queue's poll counts it down and gives a receive of a shared receive queue its
/// slot there back, on the polling thread, without calling into the engine.
class queue_slots
{
public:
    /// `srq`: the connection's shared receive queue, or null. Its connection object holds
    /// it, and close() purges the connection's entries from the queues before that goes.
    explicit queue_slots(tcp_srq* srq) noexcept : srq_(srq) {}
    queue_slots(const queue_slots&) = delete;
    queue_slots& operator=(const queue_slots&) = delete;

    /// Completions of `side` that wait, unpolled, on a shared queue.
    std::uint32_t held(cq_side side) const noexcept { return at(side).load(std::memory_order_relaxed); }
    void hold(cq_side side) noexcept { at(side).fetch_add(1, std::memory_order_relaxed); }
    /// A completion of `side` left the queue (polled, or not queued after all);
    /// `from_srq`: it was a receive of the shared receive queue, whose slot is free again.
    void release(cq_side side, bool from_srq) noexcept;

private:
    std::atomic<std::uint32_t>& at(cq_side side) noexcept { return held_[side == cq_side::send ? 0 : 1]; }
    const std::atomic<std::uint32_t>& at(cq_side side) const noexcept
    {
        return held_[side == cq_side::send ? 0 : 1];
    }

    std::atomic<std::uint32_t> held_[2] = {0, 0};
    tcp_srq* const srq_;
};

class tcp_completion_queue final : public detail::completion_queue_base
{
public:
    /// `depth` is clamped to 1 .. max_depth; `progress` is its domain's, `b` its backend
    /// (tcp, or shm).
    tcp_completion_queue(std::uint32_t depth, std::shared_ptr<domain_progress> progress,
                         rdmx::backend b = backend::tcp);
    ~tcp_completion_queue() override;

    static constexpr std::uint32_t max_depth = 1u << 20;

    rdmx::backend backend() const noexcept override { return backend_; }
    std::size_t poll(std::span<completion> out) noexcept override RDMX_EXCLUDES(mu_);
    int fd() const noexcept override { return efd_.get(); }
    std::error_code request_notify(bool solicited_only) noexcept override RDMX_EXCLUDES(mu_);
    std::error_code ack_notify() noexcept override;
    /// The epoll set of the sockets of the domain's connections on shared queues
    /// (level-triggered): its polls read them.
    int progress_fd() const noexcept override { return progress_->fd(); }
    int nest_progress_fd() noexcept override { return progress_->add_nesting() ? progress_->fd() : -1; }
    void unnest_progress_fd() noexcept override { progress_->remove_nesting(); }
    /// Arms for a sleeper that watches progress_fd() too: the engines keep standing down
    /// (and stand down at their next read wake), and what they would leave for the next
    /// poll (mark_pending) fires the arming instead. Runs the domain's pending list first,
    /// sending what it holds back.
    std::error_code request_notify_watching() noexcept override RDMX_EXCLUDES(mu_);

    // --- for the engines (any thread, with the engine's own mutex held: lock order engine,
    // then queue) ---
    /// Queues `c` of the connection whose slots are `owner`, of its `side` (`solicited`: a
    /// receive the peer marked so; `from_srq`: a receive of a shared receive queue); its
    /// poll releases the slot (queue_slots::release). False, and nothing queued, when the
    /// queue is full (the reservations make that impossible).
    bool push(const completion& c, queue_slots& owner, cq_side side, bool solicited, bool from_srq) noexcept
        RDMX_EXCLUDES(mu_);
    /// Drops what the connection whose slots are `owner` still has queued: its connection
    /// object is going away. Returns how many of the dropped were receives of a shared
    /// receive queue (whose slots the caller frees).
    std::size_t purge(const queue_slots& owner) noexcept RDMX_EXCLUDES(mu_);

    /// Its domain's progress, which its polls run.
    domain_progress& progress() const noexcept { return *progress_; }
    /// An engine that reports here marked itself pending on the domain's progress
    /// (mark_pending): a sleeper armed with request_notify_watching() would not see that
    /// work in the sockets, so the arming fires. No lock unless such a sleeper is armed.
    void wake_watcher() noexcept RDMX_EXCLUDES(mu_);
    /// A notification is armed for a poller that sleeps on fd() alone: the engines read.
    /// No lock (arm_view_).
    bool armed() const noexcept { return arm_view_.load(std::memory_order_seq_cst) == view_armed; }
    /// A notification is armed for a poller that watches progress_fd() too
    /// (request_notify_watching): data wakes it, and its polls read the sockets. No lock.
    bool watched() const noexcept
    {
        return arm_view_.load(std::memory_order_seq_cst) == (view_armed | view_watching);
    }
    /// armed() || watched(), in one look. No lock.
    bool armed_either_way() const noexcept { return arm_view_.load(std::memory_order_seq_cst) != 0; }

private:
    std::size_t take(std::span<completion> out) noexcept RDMX_EXCLUDES(mu_);

    struct entry {
        completion c;
        queue_slots* owner = nullptr;
        cq_side side = cq_side::send;
        bool from_srq = false;
    };

    engine_mutex mu_;
    std::vector<entry> ring_ RDMX_GUARDED_BY(mu_);
    std::size_t head_ RDMX_GUARDED_BY(mu_) = 0;
    std::size_t count_ RDMX_GUARDED_BY(mu_) = 0;
    /// count_ as last stored under mu_: a poll that finds it 0 takes no lock (an empty
    /// poll of a spinning endpoint took the mutex twice, each a locked instruction that
    /// waits for the stores before it). A push that lands meanwhile is the next poll's.
    std::atomic<std::size_t> queued_{0};
    notify_arm notify_ RDMX_GUARDED_BY(mu_);
    /// notify_ was armed by request_notify_watching(): the sleeper watches epfd_ too.
    bool watching_ RDMX_GUARDED_BY(mu_) = false;
    /// notify_.armed() and watching_ for the engines' looks without the lock (armed(),
    /// watched(), wake_watcher()): a hit poll of an endpoint over shm:// took this mutex
    /// three or four times for them. Stored under mu_ at each change (publish_arm), both
    /// ways seq_cst: an engine that stands down stores its flag and then looks here, a
    /// poller that arms stores here and then looks at the flag (stand_down,
    /// request_notify), and one of them sees the other. Every other look is made under
    /// the engine's mutex, which the sleeper's flush takes after arming.
    static constexpr std::uint8_t view_armed = 1, view_watching = 2;
    std::atomic<std::uint8_t> arm_view_{0};
    void publish_arm() noexcept RDMX_REQUIRES(mu_)
    {
        arm_view_.store(static_cast<std::uint8_t>((notify_.armed() ? view_armed : 0) |
                                                  (notify_.armed() && watching_ ? view_watching : 0)),
                        std::memory_order_seq_cst);
    }
    unique_fd efd_; ///< readable after a notification fired, until ack_notify()
    const std::shared_ptr<domain_progress> progress_;
    const rdmx::backend backend_;
};

} // namespace rdmx::tcp
