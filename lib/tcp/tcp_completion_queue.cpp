// The shared completion queue of the TCP backend (tcp_completion_queue.hpp).
#include "tcp/tcp_completion_queue.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "tcp/tcp_engine.hpp"
#include "tcp/tcp_srq.hpp"

namespace rdmx::tcp
{

tcp_completion_queue::tcp_completion_queue(std::uint32_t depth, std::shared_ptr<domain_progress> progress,
                                           rdmx::backend b)
    : completion_queue_base(std::clamp<std::uint32_t>(depth, 1, max_depth)),
      efd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), progress_(std::move(progress)), backend_(b)
{
    if (!efd_)
        throw_errno(errno, "eventfd");
    engine_lock lk(mu_);
    ring_.resize(this->depth());
}

tcp_completion_queue::~tcp_completion_queue() = default;

void queue_slots::release(cq_side side, bool from_srq) noexcept
{
    at(side).fetch_sub(1, std::memory_order_relaxed);
    if (from_srq)
        srq_->retire(1);
}

bool tcp_completion_queue::push(const completion& c, queue_slots& owner, cq_side side, bool solicited,
                                bool from_srq) noexcept
{
    engine_lock lk(mu_);
    if (count_ == ring_.size())
        return false;
    ring_[(head_ + count_) % ring_.size()] = {c, &owner, side, from_srq};
    ++count_;
    queued_.store(count_, std::memory_order_relaxed);
    if (notify_.fire(c, solicited)) {
        publish_arm();
        std::uint64_t one = 1;
        // Only fails if the counter would overflow, which cannot happen with one per arm.
        [[maybe_unused]] auto r = ::write(efd_.get(), &one, sizeof one);
    }
    return true;
}

std::size_t tcp_completion_queue::poll(std::span<completion> out) noexcept
{
    if (out.empty())
        return 0;
    const auto now = std::chrono::steady_clock::now();
    const std::uint64_t k = progress_->begin_poll(now);
    std::size_t n = take(out);
    auto end = now;
    if (domain_progress::due(k, n, out.size())) {
        end = progress_->run(now);
        n += take(out.subspan(n));
    }
    // One clock read per poll: a poll ends when it began unless its run moved enough, or
    // visited enough connections, to read the clock again (domain_progress::run).
    progress_->end_poll(end);
    return n;
}

std::size_t tcp_completion_queue::take(std::span<completion> out) noexcept
{
    if (queued_.load(std::memory_order_relaxed) == 0)
        return 0;
    engine_lock lk(mu_);
    std::size_t n = std::min(out.size(), count_);
    for (std::size_t i = 0; i < n; ++i) {
        entry& e = ring_[head_];
        out[i] = e.c;
        // The slot the completion held is free (purge() makes sure that an entry's
        // connection, which holds its slots and its shared receive queue, is alive while
        // it is queued).
        e.owner->release(e.side, e.from_srq);
        head_ = head_ + 1 == ring_.size() ? 0 : head_ + 1;
    }
    count_ -= n;
    queued_.store(count_, std::memory_order_relaxed);
    return n;
}

void tcp_completion_queue::wake_watcher() noexcept
{
    // The caller marked itself on the pending list before: a sleeper that arms after this
    // look finds it there (its flush takes the list after arming).
    if (!watched())
        return;
    engine_lock lk(mu_);
    if (watching_ && notify_.fire_any()) {
        publish_arm();
        std::uint64_t one = 1;
        [[maybe_unused]] auto r = ::write(efd_.get(), &one, sizeof one);
    }
}

std::size_t tcp_completion_queue::purge(const queue_slots& owner) noexcept
{
    engine_lock lk(mu_);
    std::size_t kept = 0, from_srq = 0;
    for (std::size_t i = 0; i < count_; ++i) {
        const entry& e = ring_[(head_ + i) % ring_.size()];
        if (e.owner != &owner)
            ring_[(head_ + kept++) % ring_.size()] = e;
        else
            from_srq += e.from_srq;
    }
    count_ = kept;
    queued_.store(count_, std::memory_order_relaxed);
    return from_srq;
}

std::error_code tcp_completion_queue::request_notify(bool solicited_only) noexcept
{
    {
        engine_lock lk(mu_);
        notify_.arm(solicited_only);
        watching_ = false;
        publish_arm();
    }
    // The poller is about to sleep on fd(): connections of this queue that left their
    // reads to the domain's polls (stood down) go back to their engines, which read,
    // complete and notify. An engine that stands down at this moment sees the arm
    // (connection_engine::stand_down).
    progress_->for_each([this](connection_engine& e) {
        if (e.reports_to(*this) && e.left_to_queue())
            e.queue_sleeps();
    });
    return {};
}

std::error_code tcp_completion_queue::request_notify_watching() noexcept
{
    {
        engine_lock lk(mu_);
        notify_.arm(false);
        watching_ = true;
        publish_arm();
    }
    // The sleeper wakes for data on the sockets (progress_fd) and for completions; work
    // that a poll would find only on the pending list (frames staged, an ACK held back, a
    // batch of posts) is done now, without waiting: what it completes fires the arming.
    // An engine that stands down or marks itself pending from now on sees the arming.
    progress_->flush();
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
