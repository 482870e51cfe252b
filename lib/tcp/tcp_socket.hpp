// Set-up helpers of the TCP backend: an owning file descriptor, name resolution, and
// connect / exact send / exact receive bounded by a deadline. They run on the caller's
// thread (connect, get_request, accept), never on the engine.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include <rdmx/uri.hpp>

#include "resolve.hpp"

namespace rdmx::tcp
{

using clock = std::chrono::steady_clock;

/// Owns one file descriptor; closes it on destruction.
class unique_fd
{
public:
    unique_fd() noexcept = default;
    explicit unique_fd(int fd) noexcept : fd_(fd) {}
    unique_fd(unique_fd&& o) noexcept : fd_(o.release()) {}
    unique_fd& operator=(unique_fd&& o) noexcept
    {
        if (this != &o)
            reset(o.release());
        return *this;
    }
    ~unique_fd() { reset(); }

    int get() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }
    int release() noexcept
    {
        int fd = fd_;
        fd_ = -1;
        return fd;
    }
    void reset(int fd = -1) noexcept;

private:
    int fd_ = -1;
};

/// Name resolution is the core's (lib/resolve.hpp), shared with the verbs backend.
using detail::resolve;
using detail::socket_address;

/// Sends all of `data` on a non-blocking socket before `deadline`; throws rdmx::error
/// (timed_out, disconnected) otherwise.
void send_exact(int fd, std::span<const std::byte> data, clock::time_point deadline, const std::string& what);

/// Milliseconds from now to `deadline` for poll(): 0 if passed, rounded up otherwise.
int poll_timeout(clock::time_point deadline) noexcept;

/// sendmsg of `data` on a UNIX socket with the descriptor `pass` attached (SCM_RIGHTS;
/// none if it is -1): the bytes sent, or -1 with errno. The descriptor goes with the
/// first byte that leaves.
ssize_t send_with_fd(int fd, std::span<const std::byte> data, int pass, int flags) noexcept;
/// recvmsg into `data` that takes the descriptors passed with it (SCM_RIGHTS, close-on-exec):
/// the first into `got` if it is empty, every other one closed (a peer cannot leave this
/// process descriptors it does not ask for). As recvmsg otherwise.
ssize_t recv_with_fd(int fd, std::span<std::byte> data, unique_fd& got, int flags) noexcept;

/// An AF_INET or AF_INET6 socket (not a UNIX socket of the shm backend).
bool is_tcp_socket(int fd) noexcept;
/// An AF_UNIX socket: shm://, or an auto:// connection to a listener on this host.
bool is_unix_socket(int fd) noexcept;
void set_socket_options(int fd); ///< non-blocking, TCP_NODELAY (TCP sockets); throws on failure
/// TCP_CONGESTION (connection_options::tcp.congestion; empty: leave the system's); throws
/// rdmx::error naming it on failure.
void set_congestion_control(int fd, const std::string& algorithm);
/// TCP_USER_TIMEOUT and keepalive, so that the kernel too gives up on a dead peer within
/// about `timeout`; throws on failure.
void set_liveness_options(int fd, std::chrono::milliseconds timeout);

} // namespace rdmx::tcp
