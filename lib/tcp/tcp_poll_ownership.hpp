// Who reads and sends on a connection's socket: the engine thread, or an application that
// busy-polls. A policy with its own state and no socket, timer or lock of its own: the
// engine (tcp_busy_poll.cpp) asks it and does what it says, under the engine's mutex.
// Times are passed in, so that the unit tests drive it with a made-up clock.
//
// An application that busy-polls reads the socket itself (rx_poll); the engine then stands
// down: it takes the socket out of its epoll set, so that arriving data no longer wakes it
// on the poller's CPU and no longer contends for the mutex. It takes the socket back when
// the application is about to sleep (request_notify), when the engine must wait for
// writability, or when a check finds that the application stopped calling. Transmission
// follows the same rule (the engine's app_keeps_tx).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace rdmx::tcp
{

enum class rx_owner : std::uint8_t {
    engine,      ///< the socket is in the engine's epoll set; it reads on every wake
    application, ///< the engine stood down: the polling application reads and sends
};

class poll_ownership
{
public:
    using clock = std::chrono::steady_clock;
    /// Read wakes in a row that find the application polling before the engine stands down.
    static constexpr int standdown_wakes = 3;
    /// The application counts as polling right now within this of its latest poll(), and as
    /// busy when a call follows the end of its previous one within this.
    static constexpr std::chrono::microseconds busy_poll_window{20};
    /// Stood down, post() reads at most this often, so that an application that posts a long
    /// window without polling still serves the peer's requests.
    static constexpr std::chrono::microseconds app_rx_interval{50};
    /// A call (or a visit of the domain's progress) that moved fewer bytes than this, frames
    /// read and sent and CMA copies served, took a few microseconds at most, well inside
    /// busy_poll_window: it ends when it began (call_end), and reads the clock once, not
    /// twice (docs/performance.md, "One clock read per call").
    static constexpr std::uint64_t call_clock_bytes = 4096;
    /// When a call that began at `began` and moved `moved` bytes ended.
    static clock::time_point call_end(clock::time_point began, std::uint64_t moved) noexcept
    {
        return moved < call_clock_bytes ? began : clock::now();
    }

    rx_owner owner() const noexcept { return owner_; }
    bool app_owns() const noexcept { return owner_ == rx_owner::application; }

    /// The application is busy: its current call is a poll(), or a post() in a tight loop
    /// (within busy_poll_window of its previous call). Measured from call to call, not from
    /// the latest poll(): one call that sends a MiB takes longer than the window, and a
    /// window of large writes is posted for tens of milliseconds between polls.
    bool app_busy() const noexcept { return app_busy_; }

    // --- the application's calls ---
    /// post() began at `entry` (read before it waited for the lock).
    void on_post(clock::time_point entry) noexcept
    {
        app_busy_ = entry - last_call_end_ < busy_poll_window;
        ++app_calls_;
    }
    /// Stood down, should this post() read what came meanwhile? Then it counts as a read.
    bool post_should_read(clock::time_point entry) noexcept
    {
        if (!app_owns() || entry - last_app_rx_ < app_rx_interval)
            return false;
        last_app_rx_ = entry;
        return true;
    }
    void on_poll(clock::time_point now) noexcept
    {
        last_poll_ = now;
        last_app_rx_ = now;
        ++app_polls_;
        ++app_calls_;
        app_busy_ = true;
    }
    /// The shared completion queue this connection reports to was polled (at `latest`,
    /// the latest of those polls) since the engine last looked: as a poll() of its own.
    void on_queue_poll(clock::time_point latest) noexcept
    {
        if (latest > last_poll_)
            last_poll_ = latest;
        ++app_polls_;
        ++app_calls_;
    }
    /// A post() or poll() returned.
    void on_call_end(clock::time_point now) noexcept { last_call_end_ = now; }
    /// The application is about to sleep or will not call again: what is left is the engine's.
    void on_app_idle() noexcept { app_busy_ = false; }

    // --- the engine's read wake: first step ---
    /// Whether this wake may count towards a stand-down: the application polled since the
    /// previous wake (or is in a call now) and may read on its own. False resets the count.
    bool wake_may_count(bool app_in_call, bool app_may_read) noexcept
    {
        bool polled = app_in_call || app_polls_ != app_polls_seen_;
        app_polls_seen_ = app_polls_;
        wake_found_poller_ = polled;
        if (!polled || !app_may_read) {
            busy_wakes_ = 0;
            return false;
        }
        return true;
    }
    /// Second step: `data_taken` (nothing left to read at the wake) or the application
    /// polling right now (the engine, woken on the poller's CPU, often runs before the poller
    /// gets to the data) counts the wake; true once `standdown_wakes` in a row counted.
    /// `app_polling`: it is in a call on this connection, or in (or just out of) a poll of
    /// another connection or queue of its (poll_activity); else its latest poll() of this
    /// connection says. An application that polls only now and then has data waiting when
    /// the engine wakes and has not polled for a while, and keeps the engine reading.
    bool count_wake(bool data_taken, bool app_polling, clock::time_point now) noexcept
    {
        bool polling_now = app_polling || now - last_poll_ < busy_poll_window;
        if (!data_taken && !polling_now) {
            busy_wakes_ = 0;
            return false;
        }
        return ++busy_wakes_ >= standdown_wakes;
    }
    int busy_wakes() const noexcept { return busy_wakes_; }
    /// The latest read wake found that the application had polled since the one before
    /// (or was in a call): a poller is alive, and one that sleeps on the sockets too may
    /// be left them. False again once the engine takes the socket back.
    bool wake_found_poller() const noexcept { return wake_found_poller_; }

    // --- ownership changes (engine thread) ---
    void stand_down() noexcept
    {
        owner_ = rx_owner::application;
        busy_wakes_ = 0;
        app_calls_seen_ = app_calls_;
    }
    /// The stand-down check: the application called since the last check and may still
    /// read. True: leave it the socket until the next check.
    bool still_calling(bool app_may_read) noexcept
    {
        if (app_calls_ == app_calls_seen_ || !app_may_read)
            return false;
        app_calls_seen_ = app_calls_;
        return true;
    }
    void reclaim() noexcept
    {
        owner_ = rx_owner::engine;
        busy_wakes_ = 0;
        app_polls_seen_ = app_polls_;
        wake_found_poller_ = false;
    }
    /// The socket was closed while the application owned it: nobody owns it now.
    void socket_closed() noexcept { owner_ = rx_owner::engine; }

    // --- the transmit check (outside a stand-down) ---
    void tx_check_armed() noexcept { tx_check_calls_ = app_calls_; }
    bool called_since_tx_check() const noexcept { return app_calls_ != tx_check_calls_; }

private:
    rx_owner owner_ = rx_owner::engine;
    bool app_busy_ = false;
    bool wake_found_poller_ = false;    ///< wake_found_poller()
    int busy_wakes_ = 0;                ///< read wakes in a row that found the application polling
    std::uint64_t app_polls_ = 0;       ///< poll() calls
    std::uint64_t app_polls_seen_ = 0;  ///< app_polls_ when the engine last looked
    std::uint64_t app_calls_ = 0;       ///< post() and poll() calls
    std::uint64_t app_calls_seen_ = 0;  ///< app_calls_ at the latest stand-down check
    std::uint64_t tx_check_calls_ = 0;  ///< app_calls_ when the transmit check was armed
    clock::time_point last_poll_{};     ///< the application's latest poll()
    clock::time_point last_call_end_{}; ///< when its latest post() / poll() returned
    clock::time_point last_app_rx_{};   ///< latest poll(), or post() that read
};

/// The times a run of the domain's progress (domain_progress::run) hands its visits
/// (connection_engine::queue_progress): the poll's start, then the end of the latest visit
/// that read the clock (one that moved poll_ownership::call_clock_bytes or more), or
/// a read of its own once visits_per_clock_read visits went by without one, so that a
/// run over many connections does not hand the last of them (nor the poll's end) a
/// start tens of microseconds old. A run of a few small visits reads no clock at all.
class visit_clock
{
public:
    using clock = std::chrono::steady_clock;
    static constexpr unsigned visits_per_clock_read = 8;
    explicit visit_clock(clock::time_point start) noexcept : t_(start) {}
    /// The start of the next visit.
    clock::time_point next() noexcept
    {
        if (++since_read_ > visits_per_clock_read) {
            t_ = clock::now();
            since_read_ = 1;
        }
        return t_;
    }
    /// The visit ended at `end` (its start, unless it read the clock).
    void ended(clock::time_point end) noexcept
    {
        if (end != t_) {
            t_ = end;
            since_read_ = 0;
        }
    }
    /// When the run ended: the latest time read, or now if four visits or more went by
    /// since (a ping-pong's hit visits one or two engines, in a microsecond or so).
    clock::time_point end() noexcept { return since_read_ >= 4 ? clock::now() : t_; }

private:
    clock::time_point t_;
    unsigned since_read_ = 0;
};

/// Whether an application thread is polling: inside a poll() right now, or out of one for
/// less than poll_ownership::busy_poll_window. A domain keeps one for its connections' own
/// polls, a shared completion queue one for its polls. An engine's read wake asks it: the
/// kernel runs that wake on the poller's CPU, where it preempts the poller in the middle of
/// a poll of another connection (or of the queue's other sockets) or just after, and the
/// data it finds was surely on the poller's way. Relaxed stores and loads of two clocks, no
/// read-modify-write: several polling threads make it approximate, which costs at most a
/// stand-down that the stand-down check undoes, or one that comes a wake later.
class poll_activity
{
public:
    using clock = std::chrono::steady_clock;

    void enter(clock::time_point now) noexcept
    {
        entered_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    }
    void leave(clock::time_point now) noexcept
    {
        left_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    }
    bool polling(clock::time_point now) const noexcept
    {
        const clock::time_point left = at(left_);
        if (at(entered_) > left)
            return true; // entered after the latest leave: in a poll
        return left != clock::time_point{} && now - left < poll_ownership::busy_poll_window;
    }
    /// The latest poll's start (the epoch if none yet).
    clock::time_point last_entered() const noexcept { return at(entered_); }

private:
    static clock::time_point at(const std::atomic<clock::rep>& t) noexcept
    {
        return clock::time_point(clock::duration(t.load(std::memory_order_relaxed)));
    }

    std::atomic<clock::rep> entered_{0};
    std::atomic<clock::rep> left_{0};
};

} // namespace rdmx::tcp
