// The handshake's state machine (lib/tcp/tcp_connector.hpp) on real sockets, without an
// engine: what each step sends, reads and asks for, and how each failure is named.
#include <sys/socket.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <rdmx/error.hpp>

#include "tcp/tcp_connector.hpp"
#include "tcp/tcp_ring.hpp"

namespace rdmx::tcp
{
namespace
{

using next = connector::next;
using phase = connector::phase;

/// A connected pair of non-blocking stream sockets: [0] the connector's, [1] the peer's.
struct socket_pair {
    int fd[2] = {-1, -1};
    socket_pair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fd), 0); }
    ~socket_pair()
    {
        for (int f : fd)
            if (f >= 0)
                ::close(f);
    }
    void close_peer()
    {
        ::close(fd[1]);
        fd[1] = -1;
    }
};

std::vector<std::byte> encoded(handshake_type t, std::uint32_t max_rd, std::uint8_t flags,
                               std::string_view pdata)
{
    handshake h;
    h.type = t;
    h.max_rd_atomic = max_rd;
    h.flags = flags;
    h.private_data_len = static_cast<std::uint8_t>(pdata.size());
    std::memcpy(h.private_data.data(), pdata.data(), pdata.size());
    std::vector<std::byte> out(h.wire_size());
    h.encode(out.data());
    return out;
}

std::vector<std::byte> read_all(int fd)
{
    std::vector<std::byte> got(4096);
    ssize_t n = ::recv(fd, got.data(), got.size(), MSG_DONTWAIT);
    got.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return got;
}

void send_all(int fd, std::span<const std::byte> b)
{
    ASSERT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), static_cast<ssize_t>(b.size()));
}

TEST(tcp_connector, a_client_sends_hello_and_is_established_by_an_accept_that_comes_in_pieces)
{
    socket_pair s;
    connector c;
    const auto hello = encoded(handshake_type::hello, 4, handshake_flag_goodbye, "hi");
    c.begin(phase::connect, hello);
    EXPECT_TRUE(c.owns_socket());
    // Connected already: HELLO goes out at once, then it waits for the reply.
    ASSERT_EQ(c.step(s.fd[0]), next::wait_read);
    EXPECT_EQ(c.current(), phase::reply);
    EXPECT_EQ(read_all(s.fd[1]), hello);

    const auto reply = encoded(handshake_type::accept, 2, handshake_flag_goodbye, "welcome");
    const std::size_t half = reply.size() / 2;
    send_all(s.fd[1], std::span(reply).first(half));
    ASSERT_EQ(c.step(s.fd[0]), next::wait_read);
    // The reply and a frame behind it: the connector takes exactly the reply.
    std::vector<std::byte> rest(reply.begin() + static_cast<std::ptrdiff_t>(half), reply.end());
    rest.push_back(std::byte{0x5a});
    send_all(s.fd[1], rest);
    ASSERT_EQ(c.step(s.fd[0]), next::established);
    EXPECT_FALSE(c.owns_socket());
    ASSERT_TRUE(c.reply().has_value());
    EXPECT_EQ(c.reply()->type, handshake_type::accept);
    EXPECT_EQ(c.reply()->max_rd_atomic, 2u);
    EXPECT_EQ(c.reply()->flags, handshake_flag_goodbye);
    const auto d = c.reply()->data();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(d.data()), d.size()), "welcome");
    EXPECT_EQ(read_all(s.fd[0]), std::vector<std::byte>{std::byte{0x5a}});
}

TEST(tcp_connector, a_reject_fails_it_as_rejected_with_the_private_data_kept)
{
    socket_pair s;
    connector c;
    c.begin(phase::connect, encoded(handshake_type::hello, 1, 0, ""));
    ASSERT_EQ(c.step(s.fd[0]), next::wait_read);
    send_all(s.fd[1], encoded(handshake_type::reject, 0, 0, "go away"));
    ASSERT_EQ(c.step(s.fd[0]), next::failed);
    EXPECT_EQ(c.current(), phase::failed);
    EXPECT_TRUE(c.owns_socket()); // the data path leaves a failed handshake's socket alone
    EXPECT_EQ(c.cause(), errc::rejected);
    EXPECT_STREQ(c.why(), "rejected by the listener");
    ASSERT_TRUE(c.reply().has_value());
    const auto d = c.reply()->data();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(d.data()), d.size()), "go away");
    EXPECT_EQ(c.step(s.fd[0]), next::failed); // and it stays failed
}

TEST(tcp_connector, a_listener_that_closes_without_a_reply_rejects)
{
    socket_pair s;
    connector c;
    c.begin(phase::connect, encoded(handshake_type::hello, 1, 0, ""));
    ASSERT_EQ(c.step(s.fd[0]), next::wait_read);
    const auto reply = encoded(handshake_type::accept, 1, 0, "");
    send_all(s.fd[1], std::span(reply).first(10)); // part of a reply, then gone
    s.close_peer();
    ASSERT_EQ(c.step(s.fd[0]), next::failed);
    EXPECT_EQ(c.cause(), errc::rejected);
    EXPECT_STREQ(c.why(), "the listener closed the connection");
    EXPECT_FALSE(c.reply().has_value());
}

TEST(tcp_connector, a_reply_of_another_version_or_malformed_is_a_protocol_error)
{
    {
        socket_pair s;
        connector c;
        c.begin(phase::connect, encoded(handshake_type::hello, 1, 0, ""));
        ASSERT_EQ(c.step(s.fd[0]), next::wait_read);
        auto reply = encoded(handshake_type::accept, 1, 0, "");
        const auto v = handshake::peer_version(reply);
        ASSERT_TRUE(v.has_value());
        reply[4] = std::byte{static_cast<std::uint8_t>(*v + 1)}; // the version byte (wire-format.md)
        ASSERT_EQ(handshake::peer_version(reply), *v + 1);
        send_all(s.fd[1], reply);
        ASSERT_EQ(c.step(s.fd[0]), next::failed);
        EXPECT_EQ(c.cause(), errc::protocol_error);
        EXPECT_NE(std::string(c.why()).find("wire protocol version " + std::to_string(*v + 1)),
                  std::string::npos)
            << c.why();
    }
    {
        socket_pair s;
        connector c;
        c.begin(phase::connect, encoded(handshake_type::hello, 1, 0, ""));
        ASSERT_EQ(c.step(s.fd[0]), next::wait_read);
        auto reply = encoded(handshake_type::accept, 1, 0, "");
        reply[0] = std::byte{'X'}; // not the magic
        send_all(s.fd[1], reply);
        ASSERT_EQ(c.step(s.fd[0]), next::failed);
        EXPECT_EQ(c.cause(), errc::protocol_error);
        EXPECT_STREQ(c.why(), "malformed handshake reply");
    }
}

TEST(tcp_connector, the_listener_side_sends_its_reply_and_is_established)
{
    socket_pair s;
    connector c;
    const auto reply = encoded(handshake_type::accept, 3, handshake_flag_goodbye, "ok");
    c.begin(phase::accept, reply);
    ASSERT_EQ(c.step(s.fd[0]), next::established);
    EXPECT_FALSE(c.owns_socket());
    EXPECT_FALSE(c.reply().has_value()); // the listener read the HELLO, not the connector
    EXPECT_EQ(read_all(s.fd[1]), reply);
}

/// Sends `b` with `fd_to_pass` attached (SCM_RIGHTS), as a listener that grants rings does.
void send_accept_with_fd(int fd, std::span<const std::byte> b, int fd_to_pass)
{
    ASSERT_EQ(send_with_fd(fd, b, fd_to_pass, MSG_NOSIGNAL), static_cast<ssize_t>(b.size()));
}

/// A client whose HELLO (`hello_flags`) went out, waiting for its reply.
void hello_sent(connector& c, socket_pair& s, std::uint8_t hello_flags)
{
    c.begin(phase::connect, encoded(handshake_type::hello, 4, hello_flags, ""));
    ASSERT_EQ(c.step(s.fd[0]), next::wait_read);
    (void)read_all(s.fd[1]);
}

TEST(tcp_connector, rings_come_as_a_sealed_memfd_with_an_accept_that_grants_them)
{
    const std::uint8_t offer = handshake_flag_goodbye | handshake_flag_ring;
    const auto grant = encoded(handshake_type::accept, 2, offer, "");
    {
        SCOPED_TRACE("granted");
        socket_pair s;
        connector c;
        ASSERT_NO_FATAL_FAILURE(hello_sent(c, s, offer));
        unique_fd memfd;
        std::string why;
        auto listener_side = byte_ring_pair::create(memfd, why);
        ASSERT_NE(listener_side, nullptr) << why;
        ASSERT_NO_FATAL_FAILURE(send_accept_with_fd(s.fd[1], grant, memfd.get()));
        ASSERT_EQ(c.step(s.fd[0]), next::established) << c.why();
        auto client_side = c.take_rings();
        ASSERT_NE(client_side, nullptr);
        // The same memory: what one side writes, the other reads.
        iovec v{const_cast<char*>("ring"), 4};
        bool bell;
        ASSERT_EQ(listener_side->write(&v, 1, bell), 4);
        char got[8]{};
        iovec r{got, sizeof got};
        ASSERT_EQ(client_side->read(&r, 1), 4);
        EXPECT_STREQ(got, "ring");
    }
    {
        SCOPED_TRACE("granted without a memfd");
        socket_pair s;
        connector c;
        ASSERT_NO_FATAL_FAILURE(hello_sent(c, s, offer));
        send_all(s.fd[1], grant);
        ASSERT_EQ(c.step(s.fd[0]), next::failed);
        EXPECT_EQ(c.cause(), errc::protocol_error);
        EXPECT_NE(std::string(c.why()).find("no memfd"), std::string::npos) << c.why();
    }
    {
        SCOPED_TRACE("granted to a HELLO that did not offer them");
        socket_pair s;
        connector c;
        ASSERT_NO_FATAL_FAILURE(hello_sent(c, s, handshake_flag_goodbye));
        unique_fd memfd;
        std::string why;
        auto listener_side = byte_ring_pair::create(memfd, why);
        ASSERT_NE(listener_side, nullptr) << why;
        ASSERT_NO_FATAL_FAILURE(send_accept_with_fd(s.fd[1], grant, memfd.get()));
        ASSERT_EQ(c.step(s.fd[0]), next::failed);
        EXPECT_EQ(c.cause(), errc::protocol_error);
        EXPECT_NE(std::string(c.why()).find("did not offer"), std::string::npos) << c.why();
    }
    {
        SCOPED_TRACE("a memfd that could be resized");
        socket_pair s;
        connector c;
        ASSERT_NO_FATAL_FAILURE(hello_sent(c, s, offer));
        unique_fd m(::memfd_create("unsealed", MFD_CLOEXEC));
        ASSERT_TRUE(m);
        ASSERT_EQ(::ftruncate(m.get(), byte_ring_pair::map_size), 0);
        ASSERT_NO_FATAL_FAILURE(send_accept_with_fd(s.fd[1], grant, m.get()));
        ASSERT_EQ(c.step(s.fd[0]), next::failed);
        EXPECT_EQ(c.cause(), errc::protocol_error);
        EXPECT_NE(std::string(c.why()).find("sealed"), std::string::npos) << c.why();
    }
    {
        SCOPED_TRACE("a memfd the ACCEPT does not announce is not used");
        socket_pair s;
        connector c;
        ASSERT_NO_FATAL_FAILURE(hello_sent(c, s, offer));
        unique_fd m(::memfd_create("stray", MFD_CLOEXEC));
        ASSERT_TRUE(m);
        ASSERT_NO_FATAL_FAILURE(send_accept_with_fd(
            s.fd[1], encoded(handshake_type::accept, 2, handshake_flag_goodbye, ""), m.get()));
        ASSERT_EQ(c.step(s.fd[0]), next::established) << c.why();
        EXPECT_EQ(c.take_rings(), nullptr);
    }
}

TEST(tcp_connector, the_listener_side_passes_the_rings_memfd_with_the_first_byte_of_its_reply)
{
    socket_pair s;
    connector c;
    unique_fd memfd;
    std::string why;
    auto rings = byte_ring_pair::create(memfd, why);
    ASSERT_NE(rings, nullptr) << why;
    const auto reply = encoded(handshake_type::accept, 3, handshake_flag_goodbye | handshake_flag_ring, "");
    c.pass_fd(std::move(memfd));
    c.begin(phase::accept, reply);
    ASSERT_EQ(c.step(s.fd[0]), next::established);
    std::vector<std::byte> got(reply.size());
    unique_fd p;
    ASSERT_EQ(recv_with_fd(s.fd[1], got, p, 0), static_cast<ssize_t>(reply.size()));
    EXPECT_EQ(got, reply);
    ASSERT_TRUE(p) << "no memfd came";
    auto peer = byte_ring_pair::adopt(p.get(), why);
    EXPECT_NE(peer, nullptr) << why;
}

TEST(tcp_connector, a_client_gone_before_the_listener_replies_is_named)
{
    socket_pair s;
    s.close_peer();
    connector c;
    c.begin(phase::accept, encoded(handshake_type::accept, 1, 0, ""));
    ASSERT_EQ(c.step(s.fd[0]), next::failed);
    EXPECT_EQ(c.cause(), errc::disconnected);
    EXPECT_STREQ(c.why(), "the client left before the reply");
}

TEST(tcp_connector, a_refused_connect_asks_its_driver_to_redial)
{
    // A loopback port nobody listens on: bound, noted and closed.
    int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(probe, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len), 0);
    ::close(probe);

    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ASSERT_TRUE(rc < 0 && (errno == EINPROGRESS || errno == ECONNREFUSED)) << std::strerror(errno);
    if (errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        ASSERT_EQ(::poll(&p, 1, 5000), 1);
    }
    connector c;
    c.begin(phase::connect, encoded(handshake_type::hello, 1, 0, ""));
    c.dial().addrs.resize(1); // the driver's business: the connector only keeps them
    EXPECT_EQ(c.step(fd), next::connect_failed);
    EXPECT_EQ(c.connect_error(), ECONNREFUSED);
    EXPECT_EQ(c.current(), phase::connect); // still connecting: the driver redials or fails
    EXPECT_EQ(c.dial().addrs.size(), 1u);
    c.fail(errc::connection_refused, "connect(): %s", std::strerror(ECONNREFUSED));
    EXPECT_EQ(c.current(), phase::failed);
    EXPECT_EQ(std::string(c.why()), std::string("connect(): ") + std::strerror(ECONNREFUSED));
    ::close(fd);
}

TEST(tcp_connector, begin_starts_afresh_after_a_failure)
{
    socket_pair s;
    connector c;
    c.begin(phase::accept, encoded(handshake_type::accept, 1, 0, ""));
    c.fail(errc::timed_out, "no answer within %s", "connection_options::timeout");
    EXPECT_STREQ(c.why(), "no answer within connection_options::timeout");
    c.begin(phase::accept, encoded(handshake_type::accept, 1, 0, ""));
    EXPECT_EQ(c.current(), phase::accept);
    EXPECT_FALSE(c.cause());
    EXPECT_STREQ(c.why(), "");
    EXPECT_EQ(c.step(s.fd[0]), next::established);
}

} // namespace
} // namespace rdmx::tcp
