// Internal: the event queue as the backends feed it. A mutex-guarded FIFO and an eventfd
// that stays readable while the FIFO holds an event (level-triggered, so that epoll and
// asio see it however many events one wake covers). Backends push from their own threads
// (the rdma_cm event loop, the TCP engine); the application polls.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>

#include <rdmx/queues.hpp>

namespace rdmx::detail
{

class event_queue_impl final : public event_queue
{
public:
    event_queue_impl();
    ~event_queue_impl() override;

    std::size_t poll(std::span<event> out) noexcept override;
    int fd() const noexcept override { return efd_; }

    /// Queues `ev` (any thread). Never throws: a queue that cannot grow drops the event
    /// and says so in the log (the state of the connection still tells).
    void push(const event& ev) noexcept;
    /// Removes the queued events that name `conn` or `srq` (either may be null): their
    /// object is going away, so an event must not hand out a dangling pointer.
    void purge(const connection* conn, const shared_receive_queue* srq) noexcept;

private:
    std::mutex mu_;
    std::deque<event> queue_;
    /// queue_.size() as last stored under mu_: a poll that finds it 0 takes no lock (an
    /// endpoint polls its event queue at every poll). An event pushed meanwhile is the next
    /// poll's.
    std::atomic<std::size_t> size_{0};
    int efd_ = -1;
};

/// The implementation behind a public event_queue (all of them are event_queue_impl).
inline event_queue_impl& impl(event_queue& q) noexcept
{
    return static_cast<event_queue_impl&>(q);
}

} // namespace rdmx::detail
