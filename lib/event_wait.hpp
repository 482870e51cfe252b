// Internal: the event-mode wait that connection::wait and completion_queue::wait share.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>

#include <rdmx/connection.hpp>

namespace rdmx::detail
{

/// Sleeps until `fd` is readable or `deadline` passes; false on timeout or failure.
bool wait_readable(int fd, std::chrono::steady_clock::time_point deadline) noexcept;

/// Polls `q`; if nothing is there, arms it, polls again (a completion that arrived before
/// arming raises no event), and sleeps on `fd` up to `timeout`, then acknowledges and
/// repeats. On timeout it polls a last time. `Q` has poll, request_notify, ack_notify.
template <class Q>
std::size_t wait_for_completions(Q& q, int fd, std::span<completion> out,
                                 std::chrono::milliseconds timeout) noexcept
{
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        if (auto n = q.poll(out))
            return n;
        if (q.request_notify())
            return 0;
        if (auto n = q.poll(out))
            return n;
        if (!wait_readable(fd, deadline))
            return q.poll(out);
        q.ack_notify();
    }
}

} // namespace rdmx::detail
