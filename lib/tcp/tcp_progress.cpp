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

clock::time_point domain_progress::run(clock::time_point now) noexcept
{
    // reg_mu_ keeps every engine named in the set alive and attached meanwhile.
    engine_lock rl(reg_mu_);
    if (engines_.empty())
        return now;
    // The visits' times (queue_progress): the poll's clock read, then the end of the latest
    // visit that read the clock, or a read of its own every visits_per_clock_read visits.
    visit_clock t{now};
    // First the engines with work pending (mark_pending): their sockets may be silent.
    if (pending_any_.load(std::memory_order_relaxed))
        take_pending();
    for (connection_engine* e : pending_run_)
        t.ended(e->queue_progress(*this, queue_visit::listed, busy_, t.next()));
    pending_run_.clear();
    // The rings: their writers ring no doorbell while this poller reads them
    // (connection_engine::rx_waiter), so their sockets would not say.
    take_ringed();
    bool found = false;
    for (connection_engine* e : ringed_run_)
        if (e->ring_has_data()) {
            t.ended(e->queue_progress(*this, queue_visit::ring, busy_, t.next()));
            found = true;
        }
    // The sockets: every run while some attached engine has no rings. Theirs carry only the
    // doorbells of sleepers and the end of the stream: then at the ring_only_socket_runs-th
    // run since the latest look if that was ring_only_socket_gap ago or more, and at the
    // first run of a poll that starts 1 ms or more after it (a peer that went is seen as
    // soon by a poller that polls seldom). A count alone asked more often the quicker the
    // polls, a system call in a good part of an endpoint's round trips over shm://
    // (docs/performance.md, "What an endpoint's message costs over shm://").
    const auto since = now - sockets_at_;
    if (ringed_run_.size() == engines_.size() && since < std::chrono::milliseconds(1) &&
        (++ring_only_runs_ < ring_only_socket_runs || since < ring_only_socket_gap)) {
        busy_ = found;
        return t.end();
    }
    ring_only_runs_ = 0;
    sockets_at_ = now;
    run_sockets(t);
    busy_ = busy_ || found;
    return t.end();
}

void domain_progress::run_sockets(visit_clock& t) noexcept
{
    epoll_event ev[32];
    int n = ::epoll_wait(epfd_.get(), ev, 32, 0);
    for (int i = 0; i < n; ++i)
        t.ended(static_cast<connection_engine*>(ev[i].data.ptr)
                    ->queue_progress(*this, queue_visit::socket, busy_, t.next()));
    busy_ = n > 0;
}

void domain_progress::flush() noexcept
{
    engine_lock rl(reg_mu_);
    take_pending();
    for (connection_engine* e : pending_run_)
        e->queue_flush(*this, queue_visit::listed);
    pending_run_.clear();
    take_ringed();
    for (connection_engine* e : ringed_run_)
        e->queue_flush(*this, queue_visit::ring);
    if (ringed_run_.empty())
        return;
    epoll_event ev[32];
    int n = ::epoll_wait(epfd_.get(), ev, 32, 0);
    for (int i = 0; i < n; ++i)
        static_cast<connection_engine*>(ev[i].data.ptr)->queue_flush(*this, queue_visit::socket);
}

void domain_progress::take_pending() noexcept
{
    engine_lock sl(pending_mu_);
    pending_run_.swap(pending_);
    pending_any_.store(false, std::memory_order_relaxed);
}

void domain_progress::take_ringed() noexcept
{
    const std::uint64_t changes = ringed_changes_.load(std::memory_order_acquire);
    if (changes == ringed_seen_)
        return;
    engine_lock sl(pending_mu_);
    ringed_run_.assign(ringed_.begin(), ringed_.end()); // within the room attach reserved
    ringed_seen_ = changes;
}

void domain_progress::add_rings(connection_engine& e) noexcept
{
    engine_lock sl(pending_mu_);
    if (ringed_.size() == ringed_.capacity() ||
        std::find(ringed_.begin(), ringed_.end(), &e) != ringed_.end())
        return; // (cannot be: one per attached engine)
    ringed_.push_back(&e);
    ringed_changes_.fetch_add(1, std::memory_order_release);
}

bool domain_progress::mark_pending(connection_engine& e) noexcept
{
    engine_lock sl(pending_mu_);
    if (pending_.size() == pending_.capacity())
        return false; // not while each attached engine is marked at most once
    pending_.push_back(&e);
    pending_any_.store(true, std::memory_order_relaxed);
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
        ringed_.reserve(engines_.capacity());
        ringed_run_.reserve(engines_.capacity());
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
    std::erase(ringed_run_, &e);
    engine_lock sl(pending_mu_);
    std::erase(pending_, &e);
    if (std::erase(ringed_, &e) != 0)
        ringed_changes_.fetch_add(1, std::memory_order_release);
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
