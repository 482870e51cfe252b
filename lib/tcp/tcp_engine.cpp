// The engine's life: construction (all allocation happens here), the start on the engine
// thread, and after the connection object is gone, the linger that finishes what is owed
// to the peer before the socket closes.
#include "tcp/tcp_engine.hpp"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>

#include <boost/asio/post.hpp>

#include "validate.hpp"

namespace rdmx::tcp
{

namespace
{

// Every completion_queue_base of the TCP backend is a tcp_completion_queue.
tcp_completion_queue* typed(detail::completion_queue_base* q) noexcept
{
    return static_cast<tcp_completion_queue*>(q);
}

} // namespace

connection_engine::connection_engine(tcp_domain& dom, unique_fd fd, const connection_limits& lim,
                                     const connection_options& opts, std::uint32_t peer_max_rd,
                                     detail::cq_reservation shared)
    : dom_(dom), lim_(lim), rnr_delay_(detail::rnr_delay(opts.min_rnr_timer)),
      max_rd_out_(std::max<std::uint32_t>(1, std::min(lim.max_rd_atomic, peer_max_rd))),
      shared_(std::move(shared)), send_cq_(typed(shared_.send_cq())), recv_cq_(typed(shared_.recv_cq())),
      on_shared_cq_(send_cq_ || recv_cq_), membership_(on_shared_cq_), context_(opts.context), fd_(fd.get()),
      efd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      sq_(lim.send_queue_depth, lim.max_send_sge, lim.max_inline,
          dom.backend() == backend::shm || dom.local_peers()),
      rnr_(opts.rnr_retry_count), rq_(opts.srq ? 0 : lim.recv_queue_depth, lim.max_recv_sge),
      srq_(tcp_srq::of(opts, dom, "connection").get()), slots_(srq_.queue()),
      // The own ring holds both depths of the sides that complete into it; with a shared
      // receive queue, recv_queue_depth is its depth: no more of its receives can be
      // outstanding.
      cq_(std::max<std::size_t>(1, (send_cq_ ? 0 : std::size_t{lim.send_queue_depth}) +
                                       (recv_cq_ ? 0 : lim.recv_queue_depth))),
      // A well-behaved peer has at most max_rd_atomic reads outstanding here; between them
      // at most one ACK each (ACKs coalesce), plus the NAKs of an RNR cycle.
      resp_(2 * std::size_t{lim.max_rd_atomic} + 8), link_(fd.get()), desc_(dom.io(), fd.release()),
      rnr_timer_(dom.io()),
      takeover_check_(std::clamp<std::chrono::microseconds>(
          opts.tcp.takeover_check, std::chrono::microseconds(100), std::chrono::seconds(1))),
      standdown_timer_(dom.io()), tx_check_timer_(dom.io()), linger_timer_(dom.io()), ring_timer_(dom.io()),
      // At least 1 s: below that the kernel's own retransmission timeouts (200 ms at the
      // least, doubling) on a lossy link would look like a dead peer.
      progress_timeout_(std::max<std::chrono::steady_clock::duration>(
          opts.ack_timeout * (std::min<int>(opts.retry_count, 7) + 1), std::chrono::seconds(1))),
      live_(progress_timeout_, std::chrono::steady_clock::now()), progress_timer_(dom.io()),
      handshake_timer_(dom.io())
{
    if (!efd_)
        throw_errno(errno, "eventfd");
    // What the socket is now (settle_transport says it again once it is final).
    local_ = is_unix_socket(fd_);
    set_liveness_options(fd_, std::chrono::duration_cast<std::chrono::milliseconds>(progress_timeout_));
}

connection_engine::~connection_engine()
{
    // Stood down, the descriptor object does not hold the socket; close it here (the io
    // context dropped the close handler, e.g. when the domain went first).
    if (ownership_.app_owns())
        ::close(fd_);
}

void connection_engine::use_rings(std::unique_ptr<byte_ring_pair> rings, unique_fd memfd) noexcept
{
    engine_lock lk(mu_);
    link_.use_rings(std::move(rings));
    hs_.pass_fd(std::move(memfd));
    rings_ready();
}

void connection_engine::start()
{
    dom_.track(weak_from_this());
    asio::post(dom_.io(), [self = shared_from_this()] {
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        self->settle_transport();
        self->rx_run();
        self->arm_progress_check();
        // Asio's timer queue (one heap per engine) allocates when more timers are pending
        // at once than ever before: make room for the stand-down check now, at set-up,
        // rather than the first time the engine stands down.
        self->standdown_timer_.expires_after(std::chrono::hours(1));
        self->standdown_timer_.async_wait([](const boost::system::error_code&) {});
        self->tx_check_timer_.expires_after(std::chrono::hours(1));
        self->tx_check_timer_.async_wait([](const boost::system::error_code&) {});
        self->standdown_timer_.cancel();
        self->tx_check_timer_.cancel();
    });
}

void connection_engine::bind_events(std::shared_ptr<event_queue> q, connection* conn, std::uint64_t context,
                                    bool started) noexcept
{
    engine_lock lk(mu_);
    events_.bind(std::move(q), conn, context, started);
}

bool connection_engine::on_engine() const noexcept
{
    return dom_.io().get_executor().running_in_this_thread();
}

void connection_engine::assert_on_engine() const noexcept
{
    assert(on_engine());
}

void connection_engine::close() noexcept
{
    bool connecting;
    {
        engine_lock lk(mu_);
        // The connection object goes: nothing more names it in an event queue.
        events_.close();
        local_disconnect_ = true;
        connecting = state() == connection_state::connecting || hs_.current() == connector::phase::failed;
        ownership_.on_app_idle(); // no call will come again: what is left to send is the engine's
        // Nothing of a connection the application destroyed is polled from a shared queue
        // (it would name a connection that is gone): its flush goes nowhere, what it left
        // there is dropped, and its room there is free for the next connection.
        detached_ = true;
        fail(connection_state::disconnected);
        if (!connecting)
            pump();
        // Nobody polls this connection again: its completions of shared receives free
        // their slots now (the receives that were not taken stay in the shared queue).
        std::size_t dropped = 0;
        for (tcp_completion_queue* q : shared_queues())
            if (q)
                dropped += q->purge(slots_);
        shared_ = {};
        srq_.release(dropped + cq_.drop_tagged()); // the connection object, which holds the queue, is going
        // close_socket() ends the domain's count of lingering engines, so only a socket still
        // open is counted: one closed already (a handshake that failed, a connection that
        // ended) would hold the domain's destructor for the whole linger bound.
        if (!closed_)
            dom_.linger_begin(progress_timeout_);
    }
    // The descriptor belongs to the engine thread, and so does what is still owed. A
    // handshake still in progress owes the listener nothing: the socket just closes.
    asio::post(dom_.io(), [self = shared_from_this(), connecting] {
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        if (connecting)
            self->close_socket();
        else
            self->start_linger();
    });
}

void connection_engine::start_linger() noexcept
{
    // The connection object is gone, but the peer is still owed the frame on the wire and
    // the responses (a NAK saying why, above all) and then FIN (docs/wire-format.md
    // section 6): the engine goes on sending them, and reads (discarding) until the peer's
    // EOF, so that closing never meets unread data (which would reset the connection and
    // could discard what is still on its way). Both done, or after progress_timeout_ at
    // the latest, the socket closes.
    rnr_timer_.cancel();
    progress_timer_.cancel(); // its handler holds the state (and its eventfd) alive
    standdown_timer_.cancel();
    tx_check_timer_.cancel();
    if (ownership_.app_owns()) {
        reclaim_rx(); // reads and sends on the engine again
    } else {
        arm_read();
        pump();
    }
    if (closed_)
        return;
    linger_timer_.expires_after(progress_timeout_);
    linger_timer_.async_wait(
        with_memory(hmem_, [self = shared_from_this()](const boost::system::error_code& ec) {
            if (ec == asio::error::operation_aborted)
                return;
            engine_lock lk(self->mu_);
            self->assert_on_engine();
            self->close_socket();
        }));
    linger_check();
}

void connection_engine::linger_check() noexcept
{
    if (detached_ && tx_.is_shut() && rx_state_ == rx_state::done && on_engine()) {
        assert_on_engine();
        close_socket();
    }
}

void connection_engine::close_socket() noexcept
{
    if (closed_)
        return;
    closed_ = true;
    if (detached_)
        dom_.linger_end(); // the domain's destructor may go on
    // Closing the descriptor also cancels its waits.
    boost::system::error_code ignored;
    rnr_timer_.cancel();
    progress_timer_.cancel();
    standdown_timer_.cancel();
    tx_check_timer_.cancel();
    linger_timer_.cancel();
    handshake_timer_.cancel();
    unwatch_queues(); // before its number can name another socket
    if (ownership_.app_owns()) {
        ownership_.socket_closed();
        left_to_queue_.store(false);
        ::close(fd_);
    } else {
        desc_.close(ignored);
    }
}

} // namespace rdmx::tcp
