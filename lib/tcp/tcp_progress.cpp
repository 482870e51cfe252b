// A TCP domain's progress by whichever queue is polled (tcp_progress.hpp).
#include "tcp/tcp_progress.hpp"

#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>

#include "tcp/tcp_engine.hpp"

namespace rdmx::tcp
{

domain_progress::domain_progress() : epfd_(::epoll_create1(EPOLL_CLOEXEC))
{
    if (!epfd_)
        throw_errno(errno, "epoll_create1");
}

void domain_progress::run() noexcept
{
    // reg_mu_ keeps every engine named in the set alive and attached meanwhile.
    engine_lock rl(reg_mu_);
    if (engines_.empty())
        return;
    // First the engines with work pending (mark_pending): their sockets may be silent.
    take_pending();
    for (connection_engine* e : pending_run_)
        e->queue_progress(*this, true, busy_);
    pending_run_.clear();
    epoll_event ev[32];
    int n = ::epoll_wait(epfd_.get(), ev, 32, 0);
    for (int i = 0; i < n; ++i)
        static_cast<connection_engine*>(ev[i].data.ptr)->queue_progress(*this, false, busy_);
    busy_ = n > 0;
}

void domain_progress::flush() noexcept
{
    engine_lock rl(reg_mu_);
    take_pending();
    for (connection_engine* e : pending_run_)
        e->queue_flush(*this);
    pending_run_.clear();
}

void domain_progress::take_pending() noexcept
{
    engine_lock sl(pending_mu_);
    pending_run_.swap(pending_);
}

bool domain_progress::mark_pending(connection_engine& e) noexcept
{
    engine_lock sl(pending_mu_);
    if (pending_.size() == pending_.capacity())
        return false; // not while each attached engine is marked at most once
    pending_.push_back(&e);
    return true;
}

void domain_progress::attach(connection_engine& e, int fd)
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
        throw_errno(errno, "epoll_ctl(EPOLL_CTL_ADD) of a TCP domain's progress set");
    }
    attached_.store(engines_.size(), std::memory_order_relaxed);
}

void domain_progress::detach(connection_engine& e) noexcept
{
    engine_lock rl(reg_mu_);
    std::erase(engines_, &e);
    attached_.store(engines_.size(), std::memory_order_relaxed);
    engine_lock sl(pending_mu_);
    std::erase(pending_, &e);
}

void domain_progress::unwatch(int fd) noexcept
{
    // Nothing to fail here: the socket is open and in the set (unwatch_queues, once).
    ::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

bool domain_progress::watch(connection_engine& e, int fd) noexcept
{
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &e;
    return ::epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
}

} // namespace rdmx::tcp
