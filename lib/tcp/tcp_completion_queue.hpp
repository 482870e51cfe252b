// A completion queue that many TCP connections report to (rdmx::completion_queue): one
// bounded FIFO of completions, each tagged with the engine it came from, and an eventfd
// for event mode. Engines push into it (the engine thread, or an application thread that
// posts) while they hold their own mutex; the application polls it. A poll that finds it
// empty progresses its connections on the caller's thread: a list of those with work no
// socket announces (mark_pending) and an epoll set of their sockets say which, and those
// read, answer what came and send what they held back (docs/tcp-engine.md, "Progress by
// the polled queue"), so that a completion needs no hop through the engine thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cq_reservation.hpp"
#include "tcp/tcp_completion.hpp"
#include "tcp/tcp_poll_ownership.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_thread_safety.hpp"

namespace rdmx::tcp
{

class connection_engine;

class tcp_completion_queue final : public detail::completion_queue_base
{
public:
    /// `depth` is clamped to 1 .. max_depth.
    explicit tcp_completion_queue(std::uint32_t depth);
    ~tcp_completion_queue() override;

    static constexpr std::uint32_t max_depth = 1u << 20;

    rdmx::backend backend() const noexcept override { return backend::tcp; }
    std::size_t poll(std::span<completion> out) noexcept override RDMX_EXCLUDES(mu_);
    int fd() const noexcept override { return efd_.get(); }
    std::error_code request_notify(bool solicited_only) noexcept override RDMX_EXCLUDES(mu_);
    std::error_code ack_notify() noexcept override;
    /// The epoll set of the attached connections' sockets (level-triggered).
    int progress_fd() const noexcept override { return epfd_.get(); }
    /// Arms for a sleeper that watches progress_fd() too: the engines keep standing down
    /// (and stand down at their next read wake), and what they would leave for the next
    /// poll (mark_pending) fires the arming instead. Runs the pending list first, sending
    /// what it holds back.
    std::error_code request_notify_watching() noexcept override RDMX_EXCLUDES(reg_mu_, mu_);

    // --- for the engines (any thread, with the engine's own mutex held: lock order engine,
    // then queue) ---
    /// Queues `c` of `owner`'s `side` (`solicited`: a receive the peer marked so); false,
    /// and nothing queued, when the queue is full (the reservations make that impossible).
    /// `from_srq`: a receive of a shared receive queue, whose slot there the poll frees.
    bool push(const completion& c, connection_engine& owner, cq_side side, bool solicited,
              bool from_srq) noexcept RDMX_EXCLUDES(mu_);
    /// Drops what `owner` still has queued: its connection object is going away. Returns
    /// how many of the dropped were receives of a shared receive queue (whose slots the
    /// caller frees).
    std::size_t purge(const connection_engine& owner) noexcept RDMX_EXCLUDES(mu_);

    // --- the connections it progresses (lock order: reg_mu_, then an engine's, then mu_) ---
    /// `e` reports to this queue: its socket `fd` joins the epoll set. Connection set-up
    /// (allocates); throws what epoll_ctl says.
    void attach(connection_engine& e, int fd) RDMX_EXCLUDES(reg_mu_);
    /// `e`'s connection object is going: no poll progresses it again once this returns (its
    /// socket left the epoll set before: unwatch).
    void detach(connection_engine& e) noexcept RDMX_EXCLUDES(reg_mu_);
    /// `fd` leaves the epoll set: its engine reads it no more, or is about to close it (a
    /// closed socket's number may name another one soon). Under the engine's mutex.
    void unwatch(int fd) noexcept;
    /// `e`, attached, has work that no readiness of its socket will announce (frames a read
    /// left staged, its budget spent; requests post() held back for a batch): the next
    /// poll progresses it first. Under `e`'s mutex, at most once until that poll ran it
    /// from the list (the engine remembers); never allocates (room for every attached
    /// engine is kept: false, and the engine does without, would say otherwise).
    bool mark_pending(connection_engine& e) noexcept RDMX_EXCLUDES(pending_mu_);
    /// `fd`, a new socket of the attached `e` under a number unwatched before (a client's
    /// next address, connection_engine::redial), joins the set again. Under the engine's
    /// mutex; false (errno set) if epoll_ctl refused.
    bool watch(connection_engine& e, int fd) noexcept;
    /// Polls so far, and the latest one's time: a connection whose reads are left to this
    /// queue's poller (stood down) stays so while these move.
    std::uint64_t polls() const noexcept { return polls_.load(std::memory_order_relaxed); }
    std::chrono::steady_clock::time_point last_poll() const noexcept { return activity_.last_entered(); }
    /// An application thread is in a poll of this queue, or left one just now
    /// (poll_activity): a read wake of an attached engine then most likely preempted it.
    bool polling(std::chrono::steady_clock::time_point now) const noexcept { return activity_.polling(now); }
    /// A notification is armed for a poller that sleeps on fd() alone: the engines read.
    bool armed() noexcept RDMX_EXCLUDES(mu_);
    /// A notification is armed for a poller that watches progress_fd() too
    /// (request_notify_watching): data wakes it, and its polls read the sockets.
    bool watched() noexcept RDMX_EXCLUDES(mu_);

private:
    /// Reads the sockets that have data, on the caller's thread.
    void progress() noexcept RDMX_EXCLUDES(reg_mu_, mu_);
    std::size_t take(std::span<completion> out) noexcept RDMX_EXCLUDES(mu_);

    struct entry {
        completion c;
        connection_engine* owner = nullptr;
        cq_side side = cq_side::send;
        bool from_srq = false;
    };

    engine_mutex mu_;
    std::vector<entry> ring_ RDMX_GUARDED_BY(mu_);
    std::size_t head_ RDMX_GUARDED_BY(mu_) = 0;
    std::size_t count_ RDMX_GUARDED_BY(mu_) = 0;
    notify_arm notify_ RDMX_GUARDED_BY(mu_);
    /// notify_ was armed by request_notify_watching(): the sleeper watches epfd_ too.
    bool watching_ RDMX_GUARDED_BY(mu_) = false;
    unique_fd efd_; ///< readable after a notification fired, until ack_notify()
    /// Fires an arming of request_notify_watching() for work that only a poll does.
    void wake_watcher() noexcept RDMX_EXCLUDES(mu_);

    /// Held while a poll progresses the engines (they stay alive and attached meanwhile).
    engine_mutex reg_mu_;
    std::vector<connection_engine*> engines_ RDMX_GUARDED_BY(reg_mu_);
    /// mark_pending()'s engines (lock order: reg_mu_, an engine's mutex, then pending_mu_),
    /// swapped into pending_run_ by a poll, which progresses them. Both keep room for every
    /// attached engine (attach reserves), and an engine is on the list at most once (it
    /// remembers until the poll ran it from there).
    engine_mutex pending_mu_;
    std::vector<connection_engine*> pending_ RDMX_GUARDED_BY(pending_mu_);
    std::vector<connection_engine*> pending_run_ RDMX_GUARDED_BY(reg_mu_);
    /// The latest progress() found sockets with data (ACKs of the listed may wait on).
    bool busy_ RDMX_GUARDED_BY(reg_mu_) = false;
    unique_fd epfd_; ///< the attached engines' sockets, level-triggered, data = the engine
    std::atomic<std::uint64_t> polls_{0};
    poll_activity activity_;
};

} // namespace rdmx::tcp
