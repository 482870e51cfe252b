// The progress of a TCP domain's connections by whichever completion queue is polled: one
// per domain (tcp_domain::progress), shared by the domain and each of its completion
// queues. It holds the epoll set of the sockets of the connections that report to any
// shared queue of the domain, the list of those with work that no readiness announces
// (frames a read left staged, an ACK held back, posts held for a batch), and the count and
// times of the polls that ran it. A poll of any of the domain's shared queues runs it (and
// so does a connection's own poll() where the domain has such connections), on the
// caller's thread: the connections read, answer what came and send what they held back,
// and their completions go straight into the queues they report to, the polled one or
// another (docs/tcp-engine.md, "Progress by the polled queue"). libfabric's xnet is the
// model (`xnet_progress`, run from `xnet_cq_progress` of any of its queues).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "tcp/tcp_poll_ownership.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_thread_safety.hpp"

namespace rdmx::tcp
{

class connection_engine;

/// Why a run of the domain's progress visits an engine (connection_engine::queue_progress).
enum class queue_visit : std::uint8_t {
    listed, ///< it was on the pending list (mark_pending)
    ring,   ///< its rings hold bytes (add_rings)
    socket, ///< epoll says its socket is readable
};

class domain_progress
{
public:
    domain_progress();
    domain_progress(const domain_progress&) = delete;
    domain_progress& operator=(const domain_progress&) = delete;

    /// One poll's progress (the caller's thread): the listed engines first, then those whose
    /// rings hold bytes (shm://: a look at two indices each, no system call), then those
    /// whose sockets have data (one epoll_wait with a zero timeout, at most 32 sockets;
    /// while every attached engine has rings, whose sockets then carry just the doorbells
    /// of sleepers and the end of the stream, only after ring_only_socket_runs runs and
    /// 200 us, and at least once a millisecond). Level-triggered, so what a budget left is
    /// seen by the next run. `now`: the poll's start (begin_poll's); returns when the run
    /// ended, as far as its visits read the clock (visit_clock).
    clock::time_point run(clock::time_point now) noexcept RDMX_EXCLUDES(reg_mu_, pending_mu_);
    /// Before a sleep on a queue's fd and the sockets (request_notify_watching): the listed
    /// engines read what they left staged and send what they held back, now; the engines
    /// with rings raise their wake flags (their writers ring the doorbell from now on) and
    /// read what came before; the sockets are read (doorbells left there would wake the
    /// sleeper at once).
    void flush() noexcept RDMX_EXCLUDES(reg_mu_, pending_mu_);
    /// Some connection reports to a shared queue of the domain: a run may find work. A
    /// connection's own poll() runs the domain's progress only then (one relaxed load).
    bool attached() const noexcept { return attached_.load(std::memory_order_relaxed) != 0; }

    /// A poll of the domain's queues begins (it may run the progress) and ends: the engines
    /// that stand down for these polls stay so while they move (poll_ownership). begin()
    /// returns how many began so far, this one included.
    std::uint64_t begin_poll(std::chrono::steady_clock::time_point now) noexcept
    {
        activity_.enter(now);
        return polls_.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    void end_poll(std::chrono::steady_clock::time_point now) noexcept { activity_.leave(now); }
    /// Whether the `k`-th poll (begin_poll), which took `taken` completions into an array of
    /// `room`, runs the progress: when it did not fill the array, and every 16th poll
    /// regardless, since the engines that left their sockets to the pollers are read by
    /// nobody else, and a queue that other connections' engines keep filling would starve
    /// them otherwise.
    static bool due(std::uint64_t k, std::size_t taken, std::size_t room) noexcept
    {
        return taken < room || k % 16 == 0;
    }
    std::uint64_t polls() const noexcept { return polls_.load(std::memory_order_relaxed); }
    std::chrono::steady_clock::time_point last_poll() const noexcept { return activity_.last_entered(); }
    /// An application thread is in such a poll, or left one just now (poll_activity): a read
    /// wake of an attached engine then most likely preempted it.
    bool polling(std::chrono::steady_clock::time_point now) const noexcept { return activity_.polling(now); }

    /// The epoll set (level-triggered), for a sleeper that watches it (progress_fd()).
    int fd() const noexcept { return epfd_.get(); }
    /// A sleeper's epoll set is about to nest fd() (true), unless max_nesting sets do
    /// already: the kernel bounds the wakeup paths from a watched file through nested sets
    /// (fs/eventpoll.c, path_limits: 500 sets nesting the one that holds it, 100 one level
    /// further, as when a reactor nests an endpoint's fd), and past that every EPOLL_CTL_ADD
    /// of a socket to this set fails EINVAL. Such a sleeper arms with request_notify()
    /// instead, its queue's engines reading for it. remove_nesting() once its set is closed.
    bool add_nesting() noexcept
    {
        unsigned n = nesting_.load(std::memory_order_relaxed);
        do {
            if (n >= max_nesting)
                return false;
        } while (!nesting_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
        return true;
    }
    void remove_nesting() noexcept { nesting_.fetch_sub(1, std::memory_order_relaxed); }
    /// Below the kernel's 100 two-level paths, so that each nesting set may be nested once more.
    static constexpr unsigned max_nesting = 64;

    // --- the engines it progresses (lock order: reg_mu_, then an engine's mutex, then
    // pending_mu_) ---
    /// `e` reports to a shared queue of this domain: its socket `fd` joins the set.
    /// Connection set-up (allocates); throws what epoll_ctl says.
    void attach(connection_engine& e, int fd) RDMX_EXCLUDES(reg_mu_, pending_mu_);
    /// `e`'s connection object is going: no run progresses it again once this returns (its
    /// socket left the set before: unwatch).
    void detach(connection_engine& e) noexcept RDMX_EXCLUDES(reg_mu_, pending_mu_);
    /// `fd` leaves the set: its engine reads it no more, or is about to close it (a closed
    /// socket's number may name another one soon). Under the engine's mutex.
    void unwatch(int fd) noexcept;
    /// `fd`, a socket of the attached `e` (back after a stall, or a client's next address
    /// under a number unwatched before), joins the set. Under the engine's mutex; false
    /// (errno set) if epoll_ctl refused.
    bool watch(connection_engine& e, int fd) noexcept;
    /// `e`, attached, has work that no readiness of its socket will announce: the next run
    /// progresses it first. Under `e`'s mutex, at most once until a run took it from the
    /// list (the engine remembers); never allocates (room for every attached engine is
    /// kept: false, and the engine does without, would say otherwise).
    bool mark_pending(connection_engine& e) noexcept RDMX_EXCLUDES(pending_mu_);
    /// `e`, attached, reads frames from rings (shm://): each run looks at them, so that no
    /// doorbell is needed while the domain's queues are polled. Under `e`'s mutex; never
    /// allocates (attach reserved room).
    void add_rings(connection_engine& e) noexcept RDMX_EXCLUDES(pending_mu_);
    /// Runs `f(engine)` for each attached engine, with them kept attached meanwhile.
    template <class F> void for_each(F&& f) noexcept RDMX_EXCLUDES(reg_mu_)
    {
        engine_lock rl(reg_mu_);
        for (connection_engine* e : engines_)
            f(*e);
    }

private:
    /// Moves the pending list into pending_run_ (empty, with the same room), for a run.
    void take_pending() noexcept RDMX_REQUIRES(reg_mu_) RDMX_EXCLUDES(pending_mu_);
    /// ringed_run_ becomes ringed_ if that changed since.
    void take_ringed() noexcept RDMX_REQUIRES(reg_mu_) RDMX_EXCLUDES(pending_mu_);
    /// The engines whose sockets have data progress (one epoll_wait).
    void run_sockets(visit_clock& t) noexcept RDMX_REQUIRES(reg_mu_);

    /// Held while a run progresses the engines (they stay alive and attached meanwhile).
    engine_mutex reg_mu_;
    std::vector<connection_engine*> engines_ RDMX_GUARDED_BY(reg_mu_);
    std::atomic<std::size_t> attached_{0};
    /// mark_pending()'s engines, swapped into pending_run_ by a run, which progresses them.
    /// Both keep room for every attached engine (attach reserves), and an engine is on the
    /// list at most once (it remembers until a run took it from there).
    engine_mutex pending_mu_;
    std::vector<connection_engine*> pending_ RDMX_GUARDED_BY(pending_mu_);
    std::vector<connection_engine*> pending_run_ RDMX_GUARDED_BY(reg_mu_);
    /// pending_ may hold engines (set by mark_pending, cleared by take_pending): a run that
    /// finds it false takes no lock for the list. One marked meanwhile is the next run's.
    std::atomic<bool> pending_any_{false};
    /// The engines with rings (add_rings; room reserved as for pending_), and the copy a
    /// run goes through (taken when ringed_changes_ moved).
    std::vector<connection_engine*> ringed_ RDMX_GUARDED_BY(pending_mu_);
    std::vector<connection_engine*> ringed_run_ RDMX_GUARDED_BY(reg_mu_);
    std::atomic<std::uint64_t> ringed_changes_{0};
    std::uint64_t ringed_seen_ RDMX_GUARDED_BY(reg_mu_) = 0;
    /// Where every attached engine has rings, run() asks epoll after this many runs, once
    /// ring_only_socket_gap has passed since the latest look (and always after 1 ms). Not
    /// fewer runs: at 1024, shared_cq.sixty_four_connections_on_one_queue_all_progress on
    /// shm failed 2 runs in 15 once (the last connections starved), at 64 none in 50; not
    /// reproduced in 500 runs since (docs/performance.md, "Where every connection").
    static constexpr unsigned ring_only_socket_runs = 64;
    /// As the endpoint's spinning poll() (spin_scan_gap): one system call (1.1 us here) per
    /// 200 us of polling; where polls are slow, as in an emulated guest, or many rings are
    /// read per run (64 runs of 64 connections take longer), the count rules.
    static constexpr std::chrono::microseconds ring_only_socket_gap{200};
    unsigned ring_only_runs_ RDMX_GUARDED_BY(reg_mu_) = 0; ///< runs since the latest epoll_wait (run)
    /// The start of the poll whose run last asked epoll (run).
    std::chrono::steady_clock::time_point sockets_at_ RDMX_GUARDED_BY(reg_mu_){};
    /// The latest run found sockets or rings with data (ACKs of the listed may wait on).
    bool busy_ RDMX_GUARDED_BY(reg_mu_) = false;
    unique_fd epfd_; ///< the attached engines' sockets, level-triggered, data = the engine
    std::atomic<std::uint64_t> polls_{0};
    std::atomic<unsigned> nesting_{0}; ///< epoll sets that nest epfd_ (add_nesting)
    poll_activity activity_;
};

} // namespace rdmx::tcp
