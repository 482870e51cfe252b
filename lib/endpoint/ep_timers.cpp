// The endpoint's timers: redials with backoff, the connect deadline of queued operations,
// nudges of a peer that owes us a connection, and the one timerfd that wakes poll() for
// the earliest of them (docs/endpoints.md, "Connections").
#include <sys/timerfd.h>

#include <algorithm>

#include <rdmx/error.hpp>

#include "endpoint/ep_endpoint.hpp"
#include "log.hpp"

namespace rdmx::ep
{
namespace
{

/// The connect deadline's warnings (run_timers): 20 at once, then 10 a second.
constinit detail::log_rate_limit deadline_log_limit(10, 20);

} // namespace

void endpoint_impl::schedule_redial(std::uint32_t pi) noexcept
{
    peer_entry& p = *peers_[pi];
    p.next_dial = clock::now() + p.backoff;
    p.backoff = std::min(max_backoff, p.backoff * 2);
    need_timers(pi);
}

void endpoint_impl::need_timers(std::uint32_t pi) noexcept
{
    list_once(timers_, peers_[pi]->in_timers, pi);
}

void endpoint_impl::run_timers() noexcept
{
    if (timers_.empty())
        return; // no clock read: a spinning poll() comes here every call
    auto now = clock::now();
    for (std::size_t k = 0; k < timers_.size();) {
        std::uint32_t pi = timers_[k];
        peer_entry& p = *peers_[pi];
        if (!p.chosen && p.queued.size != 0 && now >= p.deadline) {
            // Not up within the connect deadline: the queued operations fail with the
            // last cause of a failed dial (timed_out while one was still under way).
            std::error_code cause = p.last_cause ? p.last_cause : std::error_code(errc::timed_out);
            // Said once per deadline, with what was tried: a peer that cannot be reached is
            // worth knowing about, and why (a client gone for good, a network that drops).
            // Rate limited, as everything a peer can provoke: a server whose thousand
            // clients crashed with replies queued says so in a few lines, not a thousand.
            if (detail::log_enabled(log_level::warn))
                detail::log_limited(
                    deadline_log_limit, log_level::warn,
                    "endpoint %s: %s not reached within the connect deadline (%lld ms): %u dials, %u of them "
                    "refused as duplicates; %s%s; %u queued operations fail with \"%s\"",
                    self_.text.c_str(), p.addr.text.c_str(),
                    static_cast<long long>(opts_.connect_deadline.count()), p.dials, p.duplicates,
                    p.dial             ? "a dial still under way"
                    : !p.accepted      ? "no dial under way"
                    : p.accepted_up    ? "its connection to us established, nothing heard over it"
                    : p.accepted_heard ? "its connection to us heard from, its established event not seen"
                                       : "its connection to us being accepted",
                    p.last_cause ? (", the last failed with " + p.last_cause.message()).c_str() : "",
                    p.queued.size, cause.message().c_str());
            p.dials = p.duplicates = 0;
            if (p.dial)
                drop_connection(pi, p.dial.get(), cause);
            if (p.accepted) // its dialler was never heard from: the next operation dials
                drop_connection(pi, p.accepted.get(), cause);
            fail_queued(pi, cause);
            p.next_dial = clock::time_point::max();
            p.backoff = first_backoff;
        }
        if (now >= p.next_dial) {
            p.next_dial = clock::time_point::max();
            if (p.queued.size != 0)
                start_dial(pi);
        }
        if (nudging(p) && now >= p.nudge_at) {
            nudge(pi);
            p.nudge_every = std::min(max_nudge, p.nudge_every * 2);
            p.nudge_at = now + p.nudge_every;
        }
        bool keep =
            (!p.chosen && (p.queued.size != 0 || p.next_dial != clock::time_point::max())) || nudging(p);
        if (!keep) {
            p.in_timers = false;
            timers_[k] = timers_.back();
            timers_.pop_back();
        } else {
            ++k;
        }
    }
}

void endpoint_impl::arm_timerfd() noexcept
{
    auto next = clock::time_point::max();
    for (std::uint32_t pi : timers_) {
        const peer_entry& p = *peers_[pi];
        if (p.queued.size != 0 && !p.chosen)
            next = std::min(next, p.deadline);
        next = std::min(next, p.next_dial);
        if (nudging(p))
            next = std::min(next, p.nudge_at);
    }
    // Set only when it changes (a system call per poll() otherwise), or when it is due
    // already: the fd must be readable again for a deadline that is still pending.
    if (next == timer_set_ && (next == clock::time_point::max() || next > clock::now()))
        return;
    timer_set_ = next;
    itimerspec its{};
    if (next != clock::time_point::max()) {
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(next.time_since_epoch()).count();
        if (ns <= 0)
            ns = 1;
        its.it_value.tv_sec = ns / 1000000000;
        its.it_value.tv_nsec = ns % 1000000000;
        if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
            its.it_value.tv_nsec = 1;
    }
    ::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &its, nullptr);
}

} // namespace rdmx::ep
