// A connection's place in the domain progress of its shared queues (tcp_progress.hpp):
// whether its socket is in their epoll sets, on which of their pending lists it is marked,
// and how many of their polls it has counted. Three engine members before (the watch
// state, two marks, a poll count); the rules of their changes are here, socket-free and
// unit-tested (tests/tcp/queue_membership_test.cpp). The engine makes the calls into the
// sets that each change asks for.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace rdmx::tcp
{

class queue_membership
{
public:
    enum class watch : std::uint8_t {
        none,    ///< no side reports to a shared queue
        watched, ///< in the sets (attach_queues, and back after a stall)
        paused,  ///< out while reading stalls (pause_queue_watch, resume_queue_watch)
        gone,    ///< out for good: reading ended, the socket closes, a set refused it
    };

    explicit queue_membership(bool on_shared_queue) noexcept
        : watch_(on_shared_queue ? watch::watched : watch::none)
    {
    }

    watch current() const noexcept { return watch_; }
    /// The sets still know this socket (in them, or out for a stall only).
    bool reaches() const noexcept { return watch_ == watch::watched || watch_ == watch::paused; }
    bool watched() const noexcept { return watch_ == watch::watched; }

    /// Reading stalls: out of the sets until it resumes. False (nothing to do) unless watched.
    bool pause() noexcept { return move(watch::watched, watch::paused); }
    /// Reading goes on after a stall: back into the sets. False unless paused.
    bool resume() noexcept { return move(watch::paused, watch::watched); }
    /// Out for good (reading ended, the socket closes): false if the sets know it no more.
    bool leave() noexcept
    {
        if (!reaches())
            return false;
        watch_ = watch::gone;
        return true;
    }
    /// A set refused the socket (epoll_ctl failed), or it went with a descriptor replaced.
    void refused() noexcept { watch_ = watch::gone; }

    /// Marks it on pending list `i` (0 or 1, a queue domain's): true once per list until
    /// that list's run takes it off (unmark), so that the list's reserved room suffices.
    bool mark(std::size_t i) noexcept
    {
        if (marked_[i])
            return false;
        marked_[i] = true;
        return true;
    }
    bool marked(std::size_t i) const noexcept { return marked_[i]; }
    /// List `i`'s run took it off: it may be marked there again.
    void unmark(std::size_t i) noexcept { marked_[i] = false; }

    /// The queues' polls counted so far: true when `polls` differs from the last count seen
    /// (an application poll came since), which it keeps.
    bool polls_moved(std::uint64_t polls) noexcept
    {
        if (polls == polls_seen_)
            return false;
        polls_seen_ = polls;
        return true;
    }

private:
    bool move(watch from, watch to) noexcept
    {
        if (watch_ != from)
            return false;
        watch_ = to;
        return true;
    }

    watch watch_;
    std::array<bool, 2> marked_{};
    std::uint64_t polls_seen_ = 0;
};

} // namespace rdmx::tcp
