// The CMA state of a connection (lib/tcp/tcp_cma_peer.hpp), on bare sockets without an
// engine: when this side sends CMA requests, and the peer's process it serves them in,
// which names a process only while that process runs.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "tcp/tcp_cma_peer.hpp"
#include "tcp/tcp_socket.hpp"

namespace rdmx::test
{
namespace
{

using tcp::cma_peer;
using tcp::unique_fd;

/// A pidfd for `pid`, as tcp_domain::peer_process gives (null where the kernel has none).
std::shared_ptr<const unique_fd> open_pidfd(pid_t pid)
{
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    return fd < 0 ? nullptr : std::make_shared<const unique_fd>(fd);
}

TEST(tcp_cma_peer, sends_once_settled_local_and_never_again_after_a_refusal)
{
    cma_peer c;
    EXPECT_EQ(c.send_state(), cma_peer::sending::no);
    c.settle(false); // RDMX_SHM_CMA=off
    EXPECT_FALSE(c.sends());
    c.settle(true);
    EXPECT_TRUE(c.sends());
    c.refused();
    EXPECT_EQ(c.send_state(), cma_peer::sending::refused);
    c.settle(true); // a later settle (a reconnect of the same engine never happens, but)
    EXPECT_FALSE(c.sends()) << "a refusal is for good";
}

TEST(tcp_cma_peer, names_the_process_that_connected_until_it_exits)
{
    // A child connects to our UNIX listener, then exits when told.
    unique_fd lfd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(lfd) << std::strerror(errno);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string name = "rdmx-cma-peer-test-" + std::to_string(::getpid());
    std::memcpy(a.sun_path + 1, name.data(), name.size()); // abstract: nothing on disk
    const auto alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    ASSERT_EQ(::bind(lfd.get(), reinterpret_cast<sockaddr*>(&a), alen), 0) << std::strerror(errno);
    ASSERT_EQ(::listen(lfd.get(), 1), 0);
    int go[2];
    ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << std::strerror(errno);
    if (child == 0) {
        int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
        if (s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&a), alen) != 0)
            ::_exit(1);
        char b;
        ::close(go[1]);
        [[maybe_unused]] ssize_t r = ::read(go[0], &b, 1); // until the parent closes its end
        ::_exit(0);
    }
    ::close(go[0]);
    unique_fd conn(::accept4(lfd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(conn) << std::strerror(errno);

    cma_peer c;
    int opens = 0;
    auto open = [&](pid_t p) {
        ++opens;
        return open_pidfd(p);
    };
    EXPECT_EQ(c.looked_up(), cma_peer::lookup::not_yet);
    EXPECT_EQ(c.pid(conn.get(), open), child);
    EXPECT_EQ(c.looked_up(), cma_peer::lookup::found);
    EXPECT_EQ(c.pid(conn.get(), open), child);
    EXPECT_EQ(opens, 1) << "looked up more than once";

    ::close(go[1]); // the child exits
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(c.pid(conn.get(), open), 0) << "the pid of an exited process could name another";
}

TEST(tcp_cma_peer, no_pid_without_a_pidfd_or_a_unix_peer)
{
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    unique_fd x(sv[0]), y(sv[1]);
    {
        cma_peer c; // the kernel (or the domain's table) had no pidfd for it
        EXPECT_EQ(c.pid(x.get(), [](pid_t) { return std::shared_ptr<const unique_fd>(); }), 0);
        EXPECT_EQ(c.looked_up(), cma_peer::lookup::none);
    }
    {
        cma_peer c; // no memory for the table
        EXPECT_EQ(c.pid(x.get(), [](pid_t) -> std::shared_ptr<const unique_fd> { throw std::bad_alloc(); }),
                  0);
        EXPECT_EQ(c.looked_up(), cma_peer::lookup::none);
    }
    {
        cma_peer c; // a socket pair's peer is this process
        EXPECT_EQ(c.pid(y.get(), open_pidfd), ::getpid());
    }
    // A TCP peer has no process to name (a hostile peer's CMA request over TCP).
    unique_fd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&in), sizeof in), 0);
    ASSERT_EQ(::listen(l.get(), 1), 0);
    socklen_t len = sizeof in;
    ASSERT_EQ(::getsockname(l.get(), reinterpret_cast<sockaddr*>(&in), &len), 0);
    unique_fd cl(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(::connect(cl.get(), reinterpret_cast<sockaddr*>(&in), sizeof in), 0) << std::strerror(errno);
    unique_fd sv_(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(sv_);
    cma_peer c;
    int opens = 0;
    EXPECT_EQ(c.pid(sv_.get(),
                    [&](pid_t p) {
                        ++opens;
                        return open_pidfd(p);
                    }),
              0);
    EXPECT_EQ(c.looked_up(), cma_peer::lookup::none);
    EXPECT_EQ(opens, 0);
}

} // namespace
} // namespace rdmx::test
