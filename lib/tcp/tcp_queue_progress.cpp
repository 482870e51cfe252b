// Progress by the polled queue: a connection that reports to a shared completion queue is
// read and answered by the poll of any queue of its domain, on the caller's thread
// (domain_progress::run, tcp_progress.hpp), not only by the engine thread, so that a
// completion needs no thread hop. Once the pollers take the data wake after wake, the
// engine stands down as it does for an application that polls its connection
// (tcp_busy_poll.cpp); those polls count as that application's calls, and a notification
// armed on one of its own queues gives the socket back.
#include "tcp/tcp_engine.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "tcp/tcp_log.hpp"

namespace rdmx::tcp
{

void connection_engine::attach_queues()
{
    for (domain_progress* p : progresses())
        if (p)
            p->attach(*this, fd_); // if this throws, the connection's destructor detaches
}

void connection_engine::detach_queues() noexcept
{
    if (!on_shared_cq_)
        return;
    {
        engine_lock lk(mu_);
        unwatch_queues(); // while the socket is surely open (its number is still ours)
    }
    // A poll that found the socket readable before it left the set may still be calling
    // queue_progress: detach waits for it, and none comes after.
    for (domain_progress* p : progresses())
        if (p)
            p->detach(*this);
}

void connection_engine::rings_ready() noexcept
{
    if (!link_.uses_rings() || !membership_.reaches() || detached_)
        return;
    if (membership_.watched())
        ring_peek_.store(link_.rings(), std::memory_order_release);
    for (domain_progress* p : progresses())
        if (p)
            p->add_rings(*this);
}

void connection_engine::unwatch_queues() noexcept
{
    if (detached_ || !membership_.leave())
        return;
    ring_peek_.store(nullptr, std::memory_order_relaxed);
    for (domain_progress* p : progresses())
        if (p)
            p->unwatch(fd_);
}

void connection_engine::pause_queue_watch() noexcept
{
    if (detached_ || !membership_.pause())
        return;
    ring_peek_.store(nullptr, std::memory_order_relaxed);
    for (domain_progress* p : progresses())
        if (p)
            p->unwatch(fd_);
}

void connection_engine::resume_queue_watch() noexcept
{
    if (!membership_.resume())
        return;
    if (detached_ || closed_)
        return;
    for (domain_progress* p : progresses())
        if (p && !p->watch(*this, fd_)) {
            const int err = errno;
            for (domain_progress* o : progresses())
                if (o)
                    o->unwatch(fd_); // where it went back in (the rest say ENOENT)
            membership_.refused();
            log_limited("epoll_ctl(EPOLL_CTL_ADD) of a TCP domain's progress set after a stall: %s; "
                        "connection to error",
                        std::strerror(err));
            rx_state_ = rx_state::done;
            tx_.shut();
            ::shutdown(fd_, SHUT_RDWR);
            fail(connection_state::error);
            return;
        }
    if (link_.uses_rings())
        ring_peek_.store(link_.rings(), std::memory_order_release);
}

clock::time_point connection_engine::queue_progress(domain_progress& p, queue_visit why, bool queue_busy,
                                                    clock::time_point now) noexcept
{
    engine_lock lk(mu_);
    const bool listed = why == queue_visit::listed;
    if (listed) // off the list now (a run for readiness leaves us there, marked)
        unmark(p);
    else if (why == queue_visit::socket)
        link_.socket_readable(); // read by the ring path only (stream_link::recv)
    if (closed_ || detached_ || hs_.owns_socket())
        return now; // the handshake's socket is the engine's; a reply there waits for it
    const std::uint64_t moved_before = moved();
    if (rx_state_ == rx_state::done) {
        unwatch_queues(); // EOF or an error: readable for good, and nothing more to read
        pump();           // what post() held back for this poll
        return poll_ownership::call_end(now, moved() - moved_before);
    }
    ownership_.on_poll(now);
    retry_rnr_if_due(now);
    const std::uint64_t carried_out = seq_.expected();
    rx_read();
    // As rx_poll does for a connection's own queue: an ACK for requests that arrived waits,
    // so that one ACK answers a stream of them rather than each read (and the sender's pipe
    // fills, and its requests leave in batches). The queue's next poll comes back here
    // first (the domain's pending list); the ACK leaves at the second visit in a row that
    // finds nothing new while the previous run found no socket with data either, else
    // at the ack_hold::busy_visits-th (so a sender that waits for it is not starved by the
    // others' traffic). A connection's own queue gets this spacing from the application's
    // polls of its other connections; a shared queue's next poll comes microseconds later,
    // and an ACK at the first idle visit still kept the pair in a mode of small reads and
    // frequent ACKs one run in three (docs/performance.md). If the poller stops, the
    // stand-down check (or its arming a notification) takes the socket back and sends it.
    // Read responses, NAKs and requests never wait.
    const bool wait = ack_hold_.may_wait(seq_.expected() != carried_out, listed, !resp_.empty(), queue_busy);
    if (!(ownership_.app_owns() && wait && only_acks_owed() && mark_on_queues())) {
        ack_hold_.sent();
        pump(); // what the frames owe (ACKs, read responses) leaves now
    }
    const auto end = poll_ownership::call_end(now, moved() - moved_before);
    ownership_.on_call_end(end);
    return end;
}

bool connection_engine::mark_on_queues() noexcept
{
    if (!membership_.reaches() || detached_)
        return false;
    auto progs = progresses();
    bool marked = false;
    for (std::size_t i = 0; i < progs.size(); ++i)
        if (progs[i] && !membership_.marked(i)) {
            if (!progs[i]->mark_pending(*this))
                return false;
            membership_.mark(i);
            marked = true;
        }
    if (marked) // a sleeper that watches the sockets would not see this work
        for (tcp_completion_queue* q : shared_queues())
            if (q)
                q->wake_watcher();
    return true;
}

void connection_engine::continue_staged() noexcept
{
    // Stood down for the queues' poller: their polls read this socket only when it is
    // readable, and these frames are in no socket, so they go on each queue's list, which
    // its next poll runs first. Nothing waits on the engine thread (which would take the
    // socket back at the end of its run, and the stand-down start over).
    if (on_shared_cq_ && ownership_.app_owns() && app_may_read() && mark_on_queues())
        return;
    if (!ownership_.app_owns() || on_shared_cq_)
        continue_rx();
}

void connection_engine::queue_sleeps() noexcept
{
    engine_lock lk(mu_);
    if (!closed_)
        post_reclaim();
}

void connection_engine::sync_queue_polls() noexcept
{
    if (!on_shared_cq_ || detached_)
        return;
    std::uint64_t polls = 0;
    auto latest = std::chrono::steady_clock::time_point::min();
    for (domain_progress* p : progresses())
        if (p) {
            polls += p->polls();
            latest = std::max(latest, p->last_poll());
        }
    if (membership_.polls_moved(polls))
        ownership_.on_queue_poll(latest);
}

bool connection_engine::queues_armed() const noexcept
{
    return any_shared_queue([](const tcp_completion_queue& q) { return q.armed(); });
}

bool connection_engine::queues_watched() const noexcept
{
    return any_shared_queue([](const tcp_completion_queue& q) { return q.watched(); });
}

bool connection_engine::queues_armed_either_way() const noexcept
{
    return any_shared_queue([](const tcp_completion_queue& q) { return q.armed_either_way(); });
}

bool connection_engine::sleeper_takes_over() noexcept
{
    // The poller sleeps on the queue's sockets as well as its fd (an endpoint's wait), so
    // arriving data wakes it, and its poll reads on its own thread: the engine waking too
    // would be a second thread hop per message. Only while a poller is seen alive (the
    // latest read wake found it had polled): after a stand-down check found no polls, the
    // engine reads until one comes again, so one-sided requests never wait on a sleeper
    // that is busy elsewhere for longer than that check allows. Not with a write wait
    // outstanding: standing down releases the descriptor. The arming counts as it was when
    // the wake came: a completion of the run that served it fires the arming, and the
    // sleeper it wakes arms again before it sleeps (or the stand-down check takes over).
    return on_shared_cq_ && !tx_.continuation_queued() && ownership_.wake_found_poller() &&
           state() == connection_state::established && app_may_read() &&
           (wake_saw_sleeper_ || queues_watched());
}

void connection_engine::queue_flush(domain_progress& p, queue_visit why) noexcept
{
    engine_lock lk(mu_);
    if (why == queue_visit::listed)
        unmark(p);
    if (closed_ || detached_ || hs_.owns_socket())
        return;
    const bool reads = ownership_.app_owns() && app_may_read();
    if (why == queue_visit::ring && !reads)
        return; // the engine reads the rings: its flag is up whenever it waits
    if (why == queue_visit::socket)
        link_.socket_readable();
    // Frames a budget left staged (a marking of them fires the arming); a ring read that
    // finds it empty raises the wake flag, since the poller sleeps now (rx_waiter). A
    // readable socket is read while the engine's wait is armed too: a doorbell left there
    // (one the engine's wait did not wake for) would wake the sleeper at once, again and
    // again.
    if (reads || (why == queue_visit::socket && work_.outstanding(engine_work::kind::read_wait)))
        rx_read();
    ack_hold_.sent();
    pump();
}

bool connection_engine::queues_polling(std::chrono::steady_clock::time_point now) const noexcept
{
    if (!on_shared_cq_ || detached_)
        return false;
    for (domain_progress* p : progresses())
        if (p && p->polling(now))
            return true;
    return false;
}

} // namespace rdmx::tcp
