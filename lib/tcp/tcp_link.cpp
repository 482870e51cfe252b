// The byte stream under the frames (tcp_link.hpp): the socket, or the rings with the socket
// as their doorbell.
#include "tcp/tcp_link.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <utility>

#include "tcp/tcp_syscall.hpp"

namespace rdmx::tcp
{

ssize_t stream_link::recv(const iovec* iov, int n, link_waiter how, std::span<std::byte> sink) noexcept
{
    if (!rings_) {
        if (n == 1)
            return sys::recv(fd_, iov->iov_base, iov->iov_len, MSG_DONTWAIT);
        msghdr mh{};
        mh.msg_iov = const_cast<iovec*>(iov);
        mh.msg_iovlen = static_cast<std::size_t>(n);
        return sys::recvmsg(fd_, &mh, MSG_DONTWAIT);
    }
    const bool sleeps = how != link_waiter::polls;
    bool short_read = false;
    if (ssize_t got = rings_->read(iov, n, 0, &short_read); got != 0) {
        // A short read emptied the ring, and the framing stops reading for this run (as
        // after a short read of a socket): a reader that may sleep raises its flag now, or
        // what comes next would wake nobody. What came meanwhile is read on.
        if (got > 0 && sleeps && short_read && rings_->reader_waits())
            if (ssize_t more = rings_->read(iov, n, static_cast<std::size_t>(got)); more > 0)
                got += more;
        return got; // bytes, or -1 with EPROTO
    }
    // Empty. A poller looks at the socket (the peer's end) every 1024th time only (a
    // system call costs more than ten polls; its peer never rings it anyway), or when it
    // was found readable.
    const bool look = std::exchange(socket_ready_, false);
    if (!sleeps && !look && (++idle_ & 1023u) != 0) {
        errno = EAGAIN;
        return -1;
    }
    if (how == link_waiter::sleeps_flag_kept && !look && rings_->reader_asked()) {
        // The flag is still up: no byte came since it went up, and the writer's next one
        // rings (one system call less per connection and sleep).
        errno = EAGAIN;
        return -1;
    }
    // The doorbells that woke us, read before the flag goes up again (a byte that comes
    // after it is a new wake).
    switch (take_doorbells(sink)) {
    case doorbells::taken: break;
    case doorbells::more:
        errno = EINTR; // more doorbells than a peer sends: again, within the reader's budget
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

stream_link::doorbells stream_link::take_doorbells(std::span<std::byte> sink) noexcept
{
    if (!rings_)
        return doorbells::taken;
    // A peer that floods bytes is read in bounded pieces.
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

bool stream_link::must_read_before_wait(std::span<std::byte> sink, bool raise_flag) noexcept
{
    if (!rings_)
        return false;
    if (take_doorbells(sink) != doorbells::taken)
        return true;
    return raise_flag && rings_->reader_waits();
}

ssize_t stream_link::send(const iovec* iov, int n) noexcept
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
        backoff_us_ = backoff_min_us;
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

bool stream_link::empty() noexcept
{
    if (rings_)
        return rings_->rx_empty();
    std::byte probe;
    ssize_t n = sys::recv(fd_, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

std::chrono::microseconds stream_link::next_space_wait() noexcept
{
    // The reader frees space without a word: look again shortly. (A full ring means a
    // reader slower than this side; 20 us is a tenth of what it takes to read a ring.) A
    // reader that stays behind (stopped, or stalled on its responses) is looked at less
    // often, up to every millisecond, so that it does not cost the writer a wake-up every
    // 20 us until the dead-peer rule ends the connection.
    const std::chrono::microseconds wait(backoff_us_);
    backoff_us_ = std::min(2 * backoff_us_, backoff_max_us);
    return wait;
}

void stream_link::set_wake_mark(int bytes) noexcept
{
    if (bytes == wake_mark_ || rings_)
        return;
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes) == 0)
        wake_mark_ = bytes;
}

} // namespace rdmx::tcp
