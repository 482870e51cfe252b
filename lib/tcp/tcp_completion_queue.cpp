// The shared completion queue of the TCP backend (tcp_completion_queue.hpp).
#include "tcp/tcp_completion_queue.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "tcp/tcp_engine.hpp"

namespace rdmx::tcp
{

tcp_completion_queue::tcp_completion_queue(std::uint32_t depth)
    : completion_queue_base(std::clamp<std::uint32_t>(depth, 1, max_depth)),
      efd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), epfd_(::epoll_create1(EPOLL_CLOEXEC))
{
    if (!efd_)
        throw_errno(errno, "eventfd");
    if (!epfd_)
        throw_errno(errno, "epoll_create1");
    engine_lock lk(mu_);
    ring_.resize(this->depth());
}

tcp_completion_queue::~tcp_completion_queue() = default;

bool tcp_completion_queue::push(const completion& c, connection_engine& owner, cq_side side, bool solicited,
                                bool from_srq) noexcept
{
    engine_lock lk(mu_);
    if (count_ == ring_.size())
        return false;
    ring_[(head_ + count_) % ring_.size()] = {c, &owner, side, from_srq};
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
    if (out.empty())
        return 0;
    const std::uint64_t k = polls_.fetch_add(1, std::memory_order_relaxed) + 1;
    activity_.enter(std::chrono::steady_clock::now());
    std::size_t n = take(out);
    // Progress when this poll emptied the queue, and every 16th poll regardless: the
    // engines that left their sockets to the poller are read by nobody else, and a queue
    // that other connections' engines keep filling would starve them otherwise.
    if (n < out.size() || k % 16 == 0) {
        progress();
        n += take(out.subspan(n));
    }
    activity_.leave(std::chrono::steady_clock::now());
    return n;
}

std::size_t tcp_completion_queue::take(std::span<completion> out) noexcept
{
    engine_lock lk(mu_);
    std::size_t n = std::min(out.size(), count_);
    for (std::size_t i = 0; i < n; ++i) {
        entry& e = ring_[head_];
        out[i] = e.c;
        // The engine frees the queue slot the completion held (purge() makes sure that an
        // entry's engine is alive while it is queued).
        e.owner->shared_polled(e.side, e.from_srq);
        head_ = head_ + 1 == ring_.size() ? 0 : head_ + 1;
    }
    count_ -= n;
    return n;
}

void tcp_completion_queue::progress() noexcept
{
    // Only the sockets with data (one epoll_wait, not a read per connection), at most a
    // batch per poll; level-triggered, so what a budget left is seen by the next poll.
    // reg_mu_ keeps every engine named in the set alive and attached meanwhile.
    engine_lock rl(reg_mu_);
    if (engines_.empty())
        return;
    // First the engines with work pending (mark_pending): their sockets may be silent.
    {
        engine_lock sl(pending_mu_);
        pending_run_.swap(pending_);
    }
    for (connection_engine* e : pending_run_)
        e->queue_progress(*this, true, busy_);
    pending_run_.clear();
    epoll_event ev[32];
    int n = ::epoll_wait(epfd_.get(), ev, 32, 0);
    for (int i = 0; i < n; ++i)
        static_cast<connection_engine*>(ev[i].data.ptr)->queue_progress(*this, false, busy_);
    busy_ = n > 0;
}

bool tcp_completion_queue::mark_pending(connection_engine& e) noexcept
{
    {
        engine_lock sl(pending_mu_);
        if (pending_.size() == pending_.capacity())
            return false; // not while each attached engine is marked at most once
        pending_.push_back(&e);
    }
    wake_watcher(); // a sleeper that watches the sockets would not see this work
    return true;
}

void tcp_completion_queue::wake_watcher() noexcept
{
    engine_lock lk(mu_);
    if (watching_ && notify_.fire_any()) {
        std::uint64_t one = 1;
        [[maybe_unused]] auto r = ::write(efd_.get(), &one, sizeof one);
    }
}

void tcp_completion_queue::attach(connection_engine& e, int fd)
{
    engine_lock rl(reg_mu_);
    engines_.push_back(&e);
    {
        engine_lock sl(pending_mu_);
        pending_.reserve(engines_.capacity());
        pending_run_.reserve(engines_.capacity());
    }
    if (!watch(e, fd)) {
        engines_.pop_back();
        throw_errno(errno, "epoll_ctl(EPOLL_CTL_ADD) of a shared completion queue");
    }
}

void tcp_completion_queue::detach(connection_engine& e) noexcept
{
    engine_lock rl(reg_mu_);
    std::erase(engines_, &e);
    engine_lock sl(pending_mu_);
    std::erase(pending_, &e);
}

void tcp_completion_queue::unwatch(int fd) noexcept
{
    // Nothing to fail here: the socket is open and in the set (unwatch_queues, once).
    ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

bool tcp_completion_queue::watch(connection_engine& e, int fd) noexcept
{
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &e;
    return ::epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
}

bool tcp_completion_queue::armed() noexcept
{
    engine_lock lk(mu_);
    return notify_.armed() && !watching_;
}

bool tcp_completion_queue::watched() noexcept
{
    engine_lock lk(mu_);
    return notify_.armed() && watching_;
}

std::size_t tcp_completion_queue::purge(const connection_engine& owner) noexcept
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
    return from_srq;
}

std::error_code tcp_completion_queue::request_notify(bool solicited_only) noexcept
{
    {
        engine_lock lk(mu_);
        notify_.arm(solicited_only);
        watching_ = false;
    }
    // The poller is about to sleep on fd(): connections that left their reads to its polls
    // (stood down) go back to their engines, which read, complete and notify. An engine
    // that stands down at this moment sees the arm (connection_engine::stand_down).
    engine_lock rl(reg_mu_);
    for (connection_engine* e : engines_)
        if (e->left_to_queue())
            e->queue_sleeps();
    return {};
}

std::error_code tcp_completion_queue::request_notify_watching() noexcept
{
    {
        engine_lock lk(mu_);
        notify_.arm(false);
        watching_ = true;
    }
    // The sleeper wakes for data on the sockets (progress_fd) and for completions; work
    // that a poll would find only on the pending list (frames staged, an ACK held back, a
    // batch of posts) is done now, without waiting: what it completes fires the arming.
    // An engine that stands down or marks itself pending from now on sees the arming.
    engine_lock rl(reg_mu_);
    {
        engine_lock sl(pending_mu_);
        pending_run_.swap(pending_);
    }
    for (connection_engine* e : pending_run_)
        e->queue_flush(*this);
    pending_run_.clear();
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
