#include "tcp/tcp_socket.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <rdmx/error.hpp>

namespace rdmx::tcp
{

void unique_fd::reset(int fd) noexcept
{
    if (fd_ >= 0)
        ::close(fd_);
    fd_ = fd;
}

int poll_timeout(clock::time_point deadline) noexcept
{
    auto left = deadline - clock::now();
    if (left <= clock::duration::zero())
        return 0;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return ms > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(ms);
}

namespace
{

/// The socket's address family (SO_DOMAIN); AF_UNSPEC if it cannot say.
int socket_family(int fd) noexcept
{
    int domain = AF_UNSPEC;
    socklen_t len = sizeof domain;
    return ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 ? domain : AF_UNSPEC;
}

} // namespace

bool is_tcp_socket(int fd) noexcept
{
    const int domain = socket_family(fd);
    return domain == AF_INET || domain == AF_INET6;
}

bool is_unix_socket(int fd) noexcept
{
    return socket_family(fd) == AF_UNIX;
}

void set_socket_options(int fd)
{
    int flags = ::fcntl(fd, F_GETFL, 0);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        throw_errno(errno, "fcntl(O_NONBLOCK)");
    // Small frames (ACKs, sends of a few bytes) must leave at once: latency is the point.
    int one = 1;
    if (is_tcp_socket(fd) && ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        throw_errno(errno, "setsockopt(TCP_NODELAY)");
}

void set_congestion_control(int fd, const std::string& algorithm)
{
    if (algorithm.empty() || !is_tcp_socket(fd))
        return; // the system's (net.ipv4.tcp_congestion_control), or none (a UNIX socket)
    // The kernel reads at most TCP_CA_NAME_MAX - 1 bytes and would match a longer name by
    // its first 15: refuse what no algorithm can be called instead.
    constexpr std::size_t name_max = 15;
    if (algorithm.size() > name_max || algorithm.find('\0') != std::string::npos)
        throw_error(errc::invalid_argument, "setsockopt(TCP_CONGESTION): \"" + algorithm.substr(0, 32) +
                                                "\" is not an algorithm name (at most 15 bytes)");
    if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm.data(),
                     static_cast<socklen_t>(algorithm.size())) < 0)
        throw_errno(errno, ("setsockopt(TCP_CONGESTION, \"" + algorithm + "\")").c_str());
}

void set_liveness_options(int fd, std::chrono::milliseconds timeout)
{
    if (!is_tcp_socket(fd))
        return; // a UNIX socket: a peer that exits closes it at once
    // The kernel's own bounds, in line with the engine's progress timer: unacknowledged
    // data (TCP_USER_TIMEOUT) and an idle connection to a vanished host (keepalive) both
    // end the connection within about `timeout`, so nothing waits on a dead peer forever.
    unsigned user_timeout = static_cast<unsigned>(std::min<long long>(timeout.count(), 1ll << 30));
    int idle = static_cast<int>(std::clamp<long long>(timeout.count() / 2000, 1, 3600));
    int interval = std::max(1, idle / 4);
    int count = 4;
    int one = 1;
    if (::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout) < 0 ||
        ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) < 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) < 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) < 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) < 0)
        throw_errno(errno, "setsockopt(TCP_USER_TIMEOUT / keepalive)");
}

void send_exact(int fd, std::span<const std::byte> data, clock::time_point deadline, const std::string& what)
{
    std::size_t done = 0;
    while (done < data.size()) {
        ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            throw error(make_error_code(errc::disconnected), what + ": " + std::strerror(errno));
        pollfd p{fd, POLLOUT, 0};
        int rc = ::poll(&p, 1, poll_timeout(deadline));
        if (rc == 0)
            throw error(make_error_code(errc::timed_out), what);
    }
}

ssize_t send_with_fd(int fd, std::span<const std::byte> data, int pass, int flags) noexcept
{
    iovec iov{const_cast<std::byte*>(data.data()), data.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (pass >= 0) {
        mh.msg_control = control;
        mh.msg_controllen = sizeof control;
        cmsghdr* c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &pass, sizeof pass);
    }
    return ::sendmsg(fd, &mh, flags);
}

ssize_t recv_with_fd(int fd, std::span<std::byte> data, unique_fd& got, int flags) noexcept
{
    iovec iov{data.data(), data.size()};
    // Room for one descriptor: the kernel closes those that do not fit (MSG_CTRUNC).
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd, &mh, flags | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return n;
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
            int one;
            std::memcpy(&one, CMSG_DATA(c) + i * sizeof(int), sizeof one);
            if (got)
                ::close(one);
            else
                got.reset(one);
        }
    }
    return n;
}

} // namespace rdmx::tcp
