// The backend-neutral parts of rdmx/queues.hpp: the event queue and the event-mode
// wait helpers of the queues.
#include "event_queue.hpp"
#include "event_wait.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include <rdmx/error.hpp>

#include "log.hpp"

namespace rdmx
{

const char* to_string(event_type t) noexcept
{
    switch (t) {
    case event_type::established: return "established";
    case event_type::disconnected: return "disconnected";
    case event_type::error: return "error";
    case event_type::srq_limit_reached: return "srq_limit_reached";
    }
    return "?";
}

bool detail::wait_readable(int fd, std::chrono::steady_clock::time_point deadline) noexcept
{
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                          std::chrono::steady_clock::now());
        if (left.count() <= 0)
            return false;
        pollfd pfd{fd, POLLIN, 0};
        int rc = ::poll(&pfd, 1, static_cast<int>(left.count()));
        if (rc > 0)
            return true;
        if (rc == 0 || errno != EINTR)
            return false;
    }
}

std::size_t completion_queue::wait(std::span<completion> out, std::chrono::milliseconds timeout) noexcept
{
    return detail::wait_for_completions(*this, fd(), out, timeout);
}

std::shared_ptr<event_queue> event_queue::create()
{
    return std::make_shared<detail::event_queue_impl>();
}

std::size_t event_queue::wait(std::span<event> out, std::chrono::milliseconds timeout) noexcept
{
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        if (auto n = poll(out))
            return n;
        if (!detail::wait_readable(fd(), deadline))
            return 0;
    }
}

namespace detail
{

event_queue_impl::event_queue_impl()
{
    efd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_ < 0)
        throw_errno(errno, "eventfd");
}

event_queue_impl::~event_queue_impl()
{
    ::close(efd_);
}

// The eventfd's counter is 1 exactly while the FIFO is not empty: set by the push that
// fills an empty FIFO, cleared by the poll or purge that empties it (both under mu_).
namespace
{
void raise(int fd) noexcept
{
    std::uint64_t one = 1;
    [[maybe_unused]] auto rc = ::write(fd, &one, sizeof one);
}
void lower(int fd) noexcept
{
    std::uint64_t v;
    [[maybe_unused]] auto rc = ::read(fd, &v, sizeof v);
}
} // namespace

void event_queue_impl::push(const event& ev) noexcept
{
    std::lock_guard lk(mu_);
    try {
        queue_.push_back(ev);
    } catch (...) {
        log_write(log_level::error, "event_queue: out of memory, an event of type %s was dropped",
                  to_string(ev.type));
        return;
    }
    size_.store(queue_.size(), std::memory_order_relaxed);
    if (queue_.size() == 1)
        raise(efd_);
}

std::size_t event_queue_impl::poll(std::span<event> out) noexcept
{
    if (size_.load(std::memory_order_relaxed) == 0)
        return 0;
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    while (n < out.size() && !queue_.empty()) {
        out[n++] = queue_.front();
        queue_.pop_front();
    }
    size_.store(queue_.size(), std::memory_order_relaxed);
    if (n && queue_.empty())
        lower(efd_);
    return n;
}

void event_queue_impl::purge(const connection* conn, const shared_receive_queue* srq) noexcept
{
    std::lock_guard lk(mu_);
    if (queue_.empty())
        return;
    std::erase_if(queue_,
                  [&](const event& ev) { return (conn && ev.conn == conn) || (srq && ev.srq == srq); });
    size_.store(queue_.size(), std::memory_order_relaxed);
    if (queue_.empty())
        lower(efd_);
}

} // namespace detail
} // namespace rdmx
