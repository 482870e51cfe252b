// The shared completion queue of the TCP backend (tcp_completion_queue.hpp).
#include "tcp/tcp_completion_queue.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "tcp/tcp_engine.hpp"

namespace rdmx::tcp
{

tcp_completion_queue::tcp_completion_queue(std::uint32_t depth)
    : completion_queue_base(std::clamp<std::uint32_t>(depth, 1, max_depth)),
      efd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC))
{
    if (!efd_)
        throw_errno(errno, "eventfd");
    engine_lock lk(mu_);
    ring_.resize(this->depth());
}

tcp_completion_queue::~tcp_completion_queue() = default;

bool tcp_completion_queue::push(const completion& c, connection_engine& owner, cq_side side,
                                bool solicited) noexcept
{
    engine_lock lk(mu_);
    if (count_ == ring_.size())
        return false;
    ring_[(head_ + count_) % ring_.size()] = {c, &owner, side};
    ++count_;
    if (notify_.fire(c, solicited)) {
        std::uint64_t one = 1;
        // Only fails if the counter would overflow, which cannot happen with one per arm.
        [[maybe_unused]] auto r = ::write(efd_.get(), &one, sizeof one);
    }
    return true;
}

std::size_t tcp_completion_queue::poll(std::span<completion> out) noexcept
{
    engine_lock lk(mu_);
    std::size_t n = std::min(out.size(), count_);
    for (std::size_t i = 0; i < n; ++i) {
        entry& e = ring_[head_];
        out[i] = e.c;
        // The engine frees the queue slot the completion held (purge() makes sure that an
        // entry's engine is alive while it is queued).
        e.owner->shared_polled(e.side);
        head_ = head_ + 1 == ring_.size() ? 0 : head_ + 1;
    }
    count_ -= n;
    return n;
}

void tcp_completion_queue::purge(const connection_engine& owner) noexcept
{
    engine_lock lk(mu_);
    std::size_t kept = 0;
    for (std::size_t i = 0; i < count_; ++i) {
        const entry& e = ring_[(head_ + i) % ring_.size()];
        if (e.owner != &owner)
            ring_[(head_ + kept++) % ring_.size()] = e;
    }
    count_ = kept;
}

std::error_code tcp_completion_queue::request_notify(bool solicited_only) noexcept
{
    engine_lock lk(mu_);
    notify_.arm(solicited_only);
    return {};
}

std::error_code tcp_completion_queue::ack_notify() noexcept
{
    std::uint64_t v;
    if (::read(efd_.get(), &v, sizeof v) < 0 && errno != EAGAIN)
        return {errno, std::system_category()};
    return {};
}

} // namespace rdmx::tcp
