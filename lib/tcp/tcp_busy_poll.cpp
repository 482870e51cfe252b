// Busy-poll ownership: who reads and sends, the engine or an application that polls, and
// when the engine stands down or takes the socket back; plus post()'s coalescing.
#include "tcp/tcp_engine.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>

#include <boost/asio/post.hpp>

#include "tcp/tcp_log.hpp"
#include "tcp/tcp_syscall.hpp"

namespace rdmx::tcp
{

bool connection_engine::coalesce_post() noexcept
{
    // A busy application posting one request per call while the pipe is full: its requests
    // wait for its next call and leave several to one sendmsg (up to a batch: 16 frames,
    // 1 MiB), as a post list would. Only when the caller is in a tight loop (app_busy(), as
    // post() just set it) and enough is in flight (16 requests or 64 KiB) that the link does
    // not idle meanwhile; latency (one request at a time) never waits. The transmit check
    // (arm_tx_check) bounds the wait if the application stops calling. A connection on a
    // shared queue is put on the queue's list (mark_on_queues): the application's next
    // poll of the queue sends, whichever connection it posts to next.
    if (on_engine() || state() != connection_state::established || !ownership_.app_busy())
        return false;
    std::uint64_t bytes = 0;
    int n = 0;
    for (std::uint64_t q = sq_.next(); q > sq_.head() && n < max_batch_frames && bytes < (64u << 10); ++n)
        bytes += sq_.at(--q).length;
    if (n < max_batch_frames && bytes < (64u << 10))
        return false; // little in flight: send now
    bytes = 0;
    n = 0;
    for (std::uint64_t q = sq_.next(); q < sq_.tail(); ++q, ++n) {
        bytes += sq_.at(q).length;
        if (n + 1 >= max_batch_frames || bytes >= (1u << 20))
            return false; // a full batch: send it
    }
    return !on_shared_cq_ || mark_on_queues();
}

bool connection_engine::app_keeps_tx() noexcept
{
    // A busy application (polling, or posting in a tight loop: app_busy()) keeps a transfer
    // that stopped on the budget or on a full socket: its next post() or poll() goes on
    // (the socket's space frees meanwhile), instead of the engine waking on its CPU for
    // every MiB. If it stops calling, the engine takes over: at once when it arms a
    // notification, at the stand-down check when stood down, else at a check armed here
    // (tx_check), at most about two checks late.
    if (on_engine() || on_shared_cq_)
        return false;
    if (ownership_.app_owns())
        return true;
    if (!ownership_.app_busy())
        return false;
    arm_tx_check();
    return true;
}

void connection_engine::arm_tx_check() noexcept
{
    if (!work_.start(engine_work::kind::tx_check))
        return;
    ownership_.tx_check_armed();
    tx_check_timer_.expires_after(takeover_check_);
    auto on_timer = [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        self->work_.ran(engine_work::kind::tx_check);
        if (self->closed_)
            return;
        if (self->ownership_.app_owns())
            return; // stood down: the stand-down check rules
        bool pending = self->cur_.busy() || self->sq_.unstarted() || !self->resp_.empty();
        if (pending && self->ownership_.called_since_tx_check()) {
            self->arm_tx_check(); // still calling: its calls go on sending
            return;
        }
        self->pump(); // the application stopped calling: the engine goes on
    };
    tx_check_timer_.async_wait(with_memory(hmem_, std::move(on_timer)));
}

bool connection_engine::app_took_data(bool app_in_call) noexcept
{
    // Whether a busy-polling application is reading what wakes us, wake after wake
    // (poll_ownership::wake_may_count and count_wake say when that counts).
    sync_queue_polls();
    if (!ownership_.wake_may_count(app_in_call, app_may_read()))
        return false;
    if (tx_.continuation_queued())
        return false; // a transmit continuation is due: not now, but this wake counts neither way
    bool taken = link_.empty();
    // The application busy with another connection of this domain, or with its shared
    // queues' other sockets, counts as polling now: this wake preempted it on its CPU.
    const auto now = std::chrono::steady_clock::now();
    bool polling = app_in_call || dom_.polls().polling(now) || queues_polling(now);
    return ownership_.count_wake(taken, polling, now);
}

bool connection_engine::app_may_read() const noexcept
{
    // What rx_poll (or a shared queue's poll: queue_progress) needs to read on its own;
    // otherwise (a drain after an error, a stall that only the engine resumes, a sleeping
    // application) the engine reads.
    return !notify_.armed() && !closed_ && rx_state_ == rx_state::reading &&
           state() == connection_state::established && !queues_armed();
}

std::span<std::byte> connection_engine::rx_sink() noexcept
{
    return on_engine() ? dom_.discard_buffer() : std::span<std::byte>(app_discard_);
}

bool connection_engine::stand_down() noexcept
{
    // Rings: the doorbells still in the socket (rung for the engine, whose wake found the
    // ring read by a poller) would stay there once the engine stops reading it, and wake a
    // sleeper on the domain's sockets for nothing: read them now. At the end of the stream
    // the engine goes on reading (rx_run says so). A sleeper that watches the sockets
    // reads the ring from now on: its flag goes up (and what came meanwhile is read first).
    if (link_.must_read_before_wait(app_discard_, queues_watched()))
        return false;
    if (on_shared_cq_) {
        // The flag first, then the queues' arm: a poller that arms and then looks at the
        // flag (tcp_completion_queue::request_notify) either sees it or is seen here.
        left_to_queue_.store(true, std::memory_order_seq_cst);
        if (queues_armed()) {
            left_to_queue_.store(false);
            return false;
        }
    }
    // Engine thread, no wait outstanding on the descriptor (release() would drop it).
    // The socket stays open (fd_); only the epoll registration goes.
    [[maybe_unused]] int fd = desc_.release();
    // A shared queue's epoll set reports the socket readable only from this mark on, and
    // nothing lowers it while the engine waits no more (keep_rcvlowat_reachable).
    if (on_shared_cq_)
        link_.set_wake_mark(1);
    ownership_.stand_down();
    arm_standdown_check();
    return true;
}

void connection_engine::post_reclaim() noexcept
{
    if (!ownership_.app_owns() || !work_.start(engine_work::kind::reclaim))
        return;
    asio::post(dom_.io(), with_memory(hmem_, [self = shared_from_this()] {
                   engine_lock lk(self->mu_);
                   self->assert_on_engine();
                   self->work_.ran(engine_work::kind::reclaim);
                   if (!self->closed_)
                       self->reclaim_rx();
               }));
}

void connection_engine::arm_standdown_check() noexcept
{
    standdown_timer_.expires_after(takeover_check_);
    auto on_timer = [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        if (!self->ownership_.app_owns() || self->closed_)
            return;
        self->sync_queue_polls();
        if (self->ownership_.still_calling(self->app_may_read())) {
            // Still calling: leave it the socket, and what is left to send (its next call
            // sends it, deferred ACKs included).
            self->arm_standdown_check();
            return;
        }
        self->reclaim_rx(); // and sends what the application left
    };
    standdown_timer_.async_wait(with_memory(hmem_, std::move(on_timer)));
}

void connection_engine::reclaim_rx() noexcept
{
    if (!ownership_.app_owns())
        return;
    ownership_.reclaim();
    left_to_queue_.store(false);
    standdown_timer_.cancel();
    boost::system::error_code ec;
    desc_.assign(fd_, ec);
    if (ec) {
        // epoll_ctl(ADD) failed (out of memory): nobody could wait on this socket.
        log_limited("cannot watch the socket again (%s); connection to error", ec.message().c_str());
        rx_state_ = rx_state::done;
        tx_.shut();
        ::shutdown(fd_, SHUT_RDWR);
        fail(connection_state::error);
        return;
    }
    // EPOLL_CTL_ADD reports data already waiting, so this wait misses nothing that arrived
    // while the application owned the socket.
    arm_read();
    // Transmission left to the application (app_keeps_tx) is the engine's again.
    pump();
}

bool connection_engine::rx_poll() noexcept
{
    // A caller that polls receives what has arrived itself, instead of waiting for the
    // engine thread to wake up, read and hand it over: no thread hop per message. Only
    // while the engine's read wait is armed (it fires on the next data and re-reads, so
    // whichever thread reads first, nothing is missed and nothing is read twice: mu_), or
    // its continuation is posted (continue_rx: the same, it reads what is left), or while
    // the engine has stood down and left the socket to this thread (stand_down).
    const std::uint64_t carried_out = seq_.expected();
    if (!rx_read())
        return false;
    // The ACKs and read responses that the frames produced. An ACK for a request that
    // arrived in this very call (a completion to return, or a one-sided write that the
    // caller may be spinning on) may wait for its next post() or poll() (or the engine's
    // stand-down check): a caller that answers a message sends one segment, not two.
    // Not for a shared queue's connection: its next call need not come to this connection.
    if (!on_shared_cq_ && ownership_.app_owns() && (!cq_.empty() || seq_.expected() != carried_out) &&
        only_acks_owed())
        return false;
    pump();
    return true;
}

bool connection_engine::rx_read() noexcept
{
    // rx_poll without sending: reads what has arrived, on the application thread. Not
    // while the engine's continuation is posted, before: an engine that found bytes each
    // time it was about to wait (a ring its peer keeps filling) posted one after another
    // and never armed its wait, so only the engine thread read that connection, on a CPU
    // that two polling threads kept busy, a window's worth per few milliseconds, and one
    // connection of many on a shared queue starved (docs/performance.md, "a connection
    // left to its engine").
    if (!(work_.reading_soon() || ownership_.app_owns()) || closed_ || rx_state_ != rx_state::reading ||
        state() != connection_state::established)
        return false;
    rx_short_ = false;
    rx_steps(false);           // the engine drains what follows a failure
    keep_rcvlowat_reachable(); // the engine's wait may be armed for a payload read here
    // Budget spent with frames staged: no socket event will announce them.
    if (staged_work())
        continue_staged();
    return true;
}

bool connection_engine::only_acks_owed() const noexcept
{
    // Nothing but ACKs: no frame half sent, no request waiting (an ACK or read response
    // that just arrived may have unblocked a fenced one), no read response or NAK owed.
    if (cur_.busy() || sq_.unstarted())
        return false;
    return resp_.only_acks();
}

} // namespace rdmx::tcp
