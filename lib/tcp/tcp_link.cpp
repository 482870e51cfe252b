// The byte stream under the frames: the socket, or a shm:// connection's rings
// (tcp_ring.hpp), with the socket as their doorbell and as the sign of the peer's end. The
// framing above (tcp_receive.cpp, tcp_transmit.cpp) reads and writes through link_recv and
// link_send and waits as it does on a socket: a reader that found the rings empty sleeps
// on the socket, which its peer's next write rings (docs/shm.md, "Rings").
#include "tcp/tcp_engine.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <utility>

#include "tcp/tcp_log.hpp"
#include "tcp/tcp_syscall.hpp"

namespace rdmx::tcp
{

void connection_engine::use_rings(std::unique_ptr<byte_ring_pair> rings, unique_fd memfd) noexcept
{
    engine_lock lk(mu_);
    rings_ = std::move(rings);
    hs_.pass_fd(std::move(memfd));
    rings_ready();
}

bool connection_engine::rx_may_sleep() const noexcept
{
    // The engine sleeps on the socket once the ring is empty (and so does an application
    // that reads while the engine's wait is armed). An application that the engine stood
    // down for polls the rings itself and is never woken: its peer need not ring. Nor
    // while a shared queue's poller polls (each run of the domain's progress looks at the
    // rings); once it arms a notification it may sleep: armed to watch the sockets, its
    // flush() raises the flag (here) before the sleep; a plain arming gives the socket
    // back to the engine, which raises it (arm_read).
    if (!ownership_.app_owns())
        return true;
    return on_shared_cq_ && (queues_watched() || queues_armed());
}

ssize_t connection_engine::link_recv(const iovec* iov, int n) noexcept
{
    if (!rings_) {
        if (n == 1)
            return sys::recv(fd_, iov->iov_base, iov->iov_len, MSG_DONTWAIT);
        msghdr mh{};
        mh.msg_iov = const_cast<iovec*>(iov);
        mh.msg_iovlen = static_cast<std::size_t>(n);
        return sys::recvmsg(fd_, &mh, MSG_DONTWAIT);
    }
    const bool sleeps = rx_may_sleep();
    bool short_read = false;
    if (ssize_t got = rings_->read(iov, n, 0, &short_read); got != 0) {
        // A short read emptied the ring, and the framing stops reading for this run (as
        // after a short read of a socket, rx_short_): a reader that may sleep raises its
        // flag now, or what comes next would wake nobody. What came meanwhile is read on.
        if (got > 0 && sleeps && short_read && rings_->reader_waits())
            if (ssize_t more = rings_->read(iov, n, static_cast<std::size_t>(got)); more > 0)
                got += more;
        return got; // bytes, or -1 with EPROTO (rx_error)
    }
    // Empty. A stood-down poller looks at the socket (the peer's end) every 1024th time
    // only (a system call costs more than ten polls; its peer never rings it anyway),
    // or when the domain's progress found it readable.
    const bool look = std::exchange(socket_ready_, false);
    if (!sleeps && !look && (++ring_idle_ & 1023u) != 0) {
        errno = EAGAIN;
        return -1;
    }
    if (sleeps && !look && ownership_.app_owns() && rings_->reader_asked()) {
        // A shared queue's poller about to sleep, whose flag is still up: no byte came
        // since it went up, and the writer's next one rings (one system call less per
        // connection and sleep).
        errno = EAGAIN;
        return -1;
    }
    // The doorbells that woke us, read before the flag goes up again (a byte that comes
    // after it is a new wake).
    switch (take_doorbells()) {
    case doorbells::taken: break;
    case doorbells::more:
        errno = EINTR; // more doorbells than a peer sends: again (rx_error), within the budget
        return -1;
    case doorbells::end: {
        // The end of the stream (0) or a reset: what the peer wrote before it, its GOODBYE
        // say, is in the ring; read that first, and the end comes again after it.
        const int err = errno;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (ssize_t got = rings_->read(iov, n); got != 0)
            return got;
        errno = err;
        return err == 0 ? 0 : -1;
    }
    }
    if (sleeps && rings_->reader_waits())
        if (ssize_t got = rings_->read(iov, n); got != 0)
            return got; // came meanwhile
    errno = EAGAIN;
    return -1;
}

connection_engine::doorbells connection_engine::take_doorbells() noexcept
{
    // A peer that floods bytes is read in bounded pieces.
    std::span<std::byte> sink = on_engine() ? dom_.discard_buffer() : std::span<std::byte>(app_discard_);
    for (int i = 0; i < 4; ++i) {
        ssize_t r = sys::recv(fd_, sink.data(), sink.size(), MSG_DONTWAIT);
        if (r > 0 || (r < 0 && errno == EINTR))
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return doorbells::taken;
        if (r == 0)
            errno = 0;
        return doorbells::end;
    }
    return doorbells::more;
}

ssize_t connection_engine::link_send(const iovec* iov, int n) noexcept
{
    if (!rings_) {
        msghdr mh{};
        mh.msg_iov = const_cast<iovec*>(iov);
        mh.msg_iovlen = static_cast<std::size_t>(n);
        return sys::sendmsg(fd_, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    bool doorbell = false;
    const ssize_t put = rings_->write(iov, n, doorbell);
    if (doorbell) {
        // EAGAIN: the socket holds doorbells the peer has not read, which wake it all the
        // same. EPIPE, ECONNRESET: the peer went; the next full ring or read says so.
        const char b = 0;
        [[maybe_unused]] ssize_t r = ::send(fd_, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (put != 0) {
        ring_backoff_us_ = ring_backoff_min_us;
        return put; // bytes, or -1 with EPROTO
    }
    // Full. A peer that went reads no more: say so as the socket would (EPIPE), else wait.
    pollfd p{fd_, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)) != 0) {
        errno = EPIPE;
        return -1;
    }
    errno = EAGAIN;
    return -1;
}

bool connection_engine::link_empty() noexcept
{
    if (rings_)
        return rings_->rx_empty();
    std::byte probe;
    ssize_t n = sys::recv(fd_, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

void connection_engine::wait_ring_space() noexcept
{
    // The reader frees space without a word: look again shortly. (A full ring means a
    // reader slower than this side; 20 us is a tenth of what it takes to read a ring.) A
    // reader that stays behind (stopped, or stalled on its responses) is looked at less
    // often, up to every millisecond, so that it does not cost this thread a wake-up every
    // 20 us until the dead-peer rule ends the connection.
    ring_timer_.expires_after(std::chrono::microseconds(ring_backoff_us_));
    ring_backoff_us_ = std::min(2 * ring_backoff_us_, ring_backoff_max_us);
    ring_timer_.async_wait(with_memory(hmem_, [self = shared_from_this()](const boost::system::error_code&) {
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        self->tx_.continuation_ran();
        self->pump();
    }));
}

} // namespace rdmx::tcp
