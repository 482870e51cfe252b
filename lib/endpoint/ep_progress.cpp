// The endpoint's progress: poll() (one epoll_wait(0) on fd()'s set, then the completion
// queue, connection events, timers and the work that waited for room) and wait().
#include "endpoint/ep_endpoint.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace rdmx::ep
{

// --- progress ---

void endpoint_impl::scan_fds() noexcept
{
    // One system call tells which of fd()'s descriptors need one. A busy-polling caller
    // made five (TCP) or six (rxe) per call before, whether anything had come or not, each
    // a few microseconds under emulation (docs/endpoints.md, "What an endpoint holds").
    epoll_event evs[8];
    const int n = ::epoll_wait(epoll_fd_, evs, 8, 0);
    take_ready_fds(evs, n);
}

bool endpoint_impl::spin_scan_due() noexcept
{
    if (++polls_since_scan_ % spin_scan_every != 0)
        return false;
    const auto now = clock::now();
    if (now - scanned_at_ <
        (timers_.empty() && !scan_took_request_ ? spin_scan_gap : spin_scan_gap_connecting))
        return false;
    scanned_at_ = now; // the look follows at once
    return true;
}

void endpoint_impl::take_ready_fds(const epoll_event* evs, int nready) noexcept
{
    polls_since_scan_ = 0;
    scan_took_request_ = false;
    for (int i = 0; i < nready; ++i) {
        const int fd = evs[i].data.fd;
        std::uint64_t v;
        if (fd == timer_fd_) {
            [[maybe_unused]] auto r = ::read(timer_fd_, &v, sizeof v);
        } else if (fd == wake_fd_) {
            [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
            wake_raised_ = false;
        } else if (fd == cq_->fd()) {
            cq_->ack_notify(); // the armed notification fired: arm again below
            cq_armed_ = false;
        } else if (fd == listener_->fd()) {
            scan_took_request_ = true;
            take_requests();
        }
    }
}

std::size_t endpoint_impl::take_ready(std::span<endpoint_completion> out) noexcept
{
    std::size_t n = 0;
    while (n < out.size() && ring_count_ != 0) {
        out[n++] = ring_[ring_head_];
        ring_head_ = (ring_head_ + 1) % ring_.size();
        --ring_count_;
    }
    return n;
}

std::size_t endpoint_impl::poll(std::span<endpoint_completion> out) noexcept
{
    // Completions already due fill `out`: they are handed out without progress, which
    // costs at least one system call (the queue's epoll_wait(0)) whether anything came
    // or not. A caller that takes one completion per call from a batch that one read
    // completed made that call for every completion of the batch. Progress still runs
    // when the ring runs short, and at least every 16th call, so that a caller that never
    // drains the ring does not stop its connections, timers and credits.
    if (ring_count_ >= out.size() && !out.empty() && ++polls_from_ring_ < 16) {
        std::size_t n = take_ready(out);
        if (ring_count_ != 0)
            raise_wake(); // fd() stays readable
        return n;
    }
    polls_from_ring_ = 0;
    // Spinning: the queue is polled directly every call; the rest of fd()'s set (new
    // connection requests; the timerfd and eventfd are only for sleepers) now and then
    // (spin_scan_due).
    const bool spin = spinning();
    if (fds_taken_)
        fds_taken_ = false; // wait() took what woke it a moment ago: no second look
    else if (!spin || spin_scan_due())
        scan_fds();
    poll_cq();
    poll_events();
    run_timers();
    for (int pass = 0; pass < 2; ++pass) {
        for (std::uint32_t pi : kick_) {
            peers_[pi]->in_kick = false;
            flush_queue(pi);
        }
        kick_.clear();
        for (std::uint32_t ri = pending_recvs_.front(); ri != nil;) {
            std::uint32_t next = pending_recvs_.next(ri);
            progress_rndv(ri);
            ri = next;
        }
        give_back_deferred();
        if (pass == 0 && !cq_armed_ && !spin) {
            // Arm, then look once more: a completion that came before the arming raises no
            // event, so fd() would miss it. An arming stays until a completion fires it.
            arm_cq();
            cq_armed_ = true;
            poll_cq();
        }
    }
    if (!ack_due_.empty())
        send_due_acks();
    if (!event_peers_.empty())
        emit_peer_events();
    std::size_t n = take_ready(out);
    arm_timerfd();
    if (ring_count_ != 0)
        raise_wake(); // fd() stays readable
    return n;
}

void endpoint_impl::arm_cq() noexcept
{
    // A failed arming (a verbs ibv_req_notify_cq error) leaves the sleeper to its timeout
    // and the next poll, as before.
    if (progress_nested_)
        cqb_->request_notify_watching();
    else
        cq_->request_notify();
}

void endpoint_impl::give_back_deferred() noexcept
{
    while (!deferred_reposts_.empty()) {
        std::uint32_t buf = deferred_reposts_.back();
        deferred_reposts_.pop_back();
        sge s{recv_mr_.get(), static_cast<std::size_t>(buf) * buf_size_, buf_size_};
        if (srq_->post_recv({&s, 1}, make_wr_id(wr_kind::srq, buf))) {
            deferred_reposts_.push_back(buf);
            break;
        }
    }
}

int endpoint_impl::fd() const noexcept
{
    // Arming the queue after every completion costs two system calls on verbs, and on TCP
    // keeps the engine threads from standing down for the poller: done only once someone
    // may sleep on fd(). Readable once now, so that a first sleep on it returns, and the
    // poll() after it arms before anything can be missed.
    if (!fd_out_.exchange(true, std::memory_order_acq_rel)) {
        std::uint64_t one = 1;
        [[maybe_unused]] auto w = ::write(wake_fd_, &one, sizeof one);
    }
    return epoll_fd_;
}

void endpoint_impl::raise_wake() noexcept
{
    if (wake_raised_ || spinning())
        return;
    std::uint64_t one = 1;
    [[maybe_unused]] auto w = ::write(wake_fd_, &one, sizeof one);
    wake_raised_ = true;
}

void endpoint_impl::settle() noexcept
{
    // An application that posts receives (or removes peers, or sends) outside the loop
    // that polls, and sleeps on fd() (endpoint_watch), must be woken for what these calls
    // completed or made possible: nothing else would make fd() readable.
    give_back_deferred();
    if (ring_count_ != 0 || !kick_.empty() || !pending_recvs_.empty() || !ack_due_.empty())
        raise_wake();
    arm_timerfd();
}

std::size_t endpoint_impl::wait(std::span<endpoint_completion> out,
                                std::chrono::milliseconds timeout) noexcept
{
    const auto deadline = clock::now() + timeout;
    for (;;) {
        if (std::size_t n = poll(out))
            return n;
        const auto now = clock::now();
        if (now >= deadline)
            return 0;
        // Rounded up: a wait of 1 ms with 0.9 ms left sleeps, where truncating to 0 spun.
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
        if (!cq_armed_) {
            // poll() left the queue unarmed: arm it before sleeping, then look once more (a
            // completion that came before the arming raises no event).
            arm_cq();
            cq_armed_ = true;
            if (std::size_t n = poll(out))
                return n;
        }
        epoll_event evs[8];
        int rc = ::epoll_wait(epoll_fd_, evs, 8, static_cast<int>(std::min<long long>(left, 1000)));
        if (rc < 0 && errno != EINTR)
            return 0;
        if (rc > 0) {
            // What woke us is taken here, so the poll() that follows makes no second
            // epoll_wait(0) for it (one system call less per wake-up).
            take_ready_fds(evs, rc);
            fds_taken_ = true;
        } else {
            // spinning: the next poll() looks at fd()'s set
            polls_since_scan_ = spin_scan_every - 1;
            scanned_at_ = {};
        }
    }
}

} // namespace rdmx::ep
