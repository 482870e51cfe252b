// The byte stream under a connection's frames (lib/tcp/tcp_link.hpp), on bare sockets
// without an engine: a socket link as recvmsg/sendmsg; a rings link with the socket as
// doorbell and end of stream, and the three ways its reader waits (link_waiter); the
// socket's wake mark (SO_RCVLOWAT) on TCP.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tcp/tcp_link.hpp"
#include "tcp/tcp_ring.hpp"
#include "tcp/tcp_socket.hpp"

namespace rdmx::test
{
namespace
{

using tcp::byte_ring_pair;
using tcp::link_waiter;
using tcp::stream_link;
using tcp::unique_fd;

/// Two ends of a UNIX stream socket pair, each with its link (socket mode until rings()).
struct link_pair {
    unique_fd fa, fb;
    std::unique_ptr<stream_link> a, b;
    std::array<std::byte, 256> sink{};

    link_pair()
    {
        int sv[2];
        EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0)
            << std::strerror(errno);
        fa = unique_fd(sv[0]);
        fb = unique_fd(sv[1]);
        a = std::make_unique<stream_link>(fa.get());
        b = std::make_unique<stream_link>(fb.get());
    }
    /// a takes the listener's side of a fresh ring pair, b the client's.
    void rings()
    {
        unique_fd memfd;
        std::string why;
        auto l = byte_ring_pair::create(memfd, why);
        ASSERT_NE(l, nullptr) << why;
        auto c = byte_ring_pair::adopt(memfd.get(), why);
        ASSERT_NE(c, nullptr) << why;
        a->use_rings(std::move(l));
        b->use_rings(std::move(c));
    }
    std::span<std::byte> bin() { return {sink.data(), sink.size()}; }
};

ssize_t send_text(stream_link& l, const std::string& s)
{
    iovec v{const_cast<char*>(s.data()), s.size()};
    return l.send(&v, 1);
}

/// recv into a string of up to `max` bytes; the result and errno of the call.
struct got {
    ssize_t n;
    int err;
    std::string text;
};
got recv_text(stream_link& l, link_waiter how, std::span<std::byte> sink, std::size_t max = 64)
{
    std::string buf(max, '\0');
    iovec v{buf.data(), buf.size()};
    errno = 0;
    ssize_t n = l.recv(&v, 1, how, sink);
    const int err = errno;
    buf.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return {n, err, buf};
}

/// Bytes waiting in the socket `fd` (doorbells, on a rings link), without reading them.
bool socket_readable(int fd)
{
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

TEST(tcp_link, a_socket_link_is_recvmsg_and_sendmsg_until_the_peer_closes)
{
    link_pair lp;
    EXPECT_EQ(lp.a->current(), stream_link::mode::socket);
    EXPECT_TRUE(lp.b->empty());
    got g = recv_text(*lp.b, link_waiter::polls, lp.bin());
    EXPECT_EQ(g.n, -1);
    EXPECT_EQ(g.err, EAGAIN);
    // Two iovecs in, one out; a socket link has no doorbells and never reads before a wait.
    std::string h = "hello ", w = "world";
    iovec v[2] = {{h.data(), h.size()}, {w.data(), w.size()}};
    ASSERT_EQ(lp.a->send(v, 2), 11);
    EXPECT_FALSE(lp.b->empty());
    EXPECT_FALSE(lp.b->must_read_before_wait(lp.bin()));
    EXPECT_EQ(lp.b->take_doorbells(lp.bin()), stream_link::doorbells::taken);
    EXPECT_FALSE(lp.b->empty()) << "the doorbell look read the socket's data";
    g = recv_text(*lp.b, link_waiter::sleeps, lp.bin());
    EXPECT_EQ(g.text, "hello world");
    lp.fa.reset();
    g = recv_text(*lp.b, link_waiter::sleeps, lp.bin());
    EXPECT_EQ(g.n, 0) << "end of stream";
}

TEST(tcp_link, a_reader_that_polls_is_never_rung_and_a_sleeper_is_rung_once)
{
    link_pair lp;
    ASSERT_NO_FATAL_FAILURE(lp.rings());
    EXPECT_EQ(lp.b->current(), stream_link::mode::rings);
    // A fresh ring's flag is up (its first frames wake whoever waits): the first write rings.
    ASSERT_EQ(send_text(*lp.a, "zero"), 4);
    EXPECT_TRUE(socket_readable(lp.fb.get()));
    EXPECT_EQ(recv_text(*lp.b, link_waiter::polls, lp.bin()).text, "zero");
    EXPECT_TRUE(socket_readable(lp.fb.get())) << "a poller read the socket with bytes in the ring";
    EXPECT_EQ(lp.b->take_doorbells(lp.bin()), stream_link::doorbells::taken);
    // A poller that finds nothing raises no flag: the writer does not ring.
    EXPECT_EQ(recv_text(*lp.b, link_waiter::polls, lp.bin()).err, EAGAIN);
    ASSERT_EQ(send_text(*lp.a, "one"), 3);
    EXPECT_FALSE(socket_readable(lp.fb.get())) << "rang a reader that polls";
    EXPECT_TRUE(lp.b->ring_has_data());
    EXPECT_EQ(recv_text(*lp.b, link_waiter::polls, lp.bin()).text, "one");
    // A sleeper that finds it empty raises its flag: the next write rings, once.
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps, lp.bin()).err, EAGAIN);
    ASSERT_EQ(send_text(*lp.a, "two"), 3);
    EXPECT_TRUE(socket_readable(lp.fb.get())) << "a sleeping reader was not rung";
    ASSERT_EQ(send_text(*lp.a, "three"), 5);
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps, lp.bin()).text, "twothree");
    // The ring is empty: the next read takes the doorbell out of the socket and raises the
    // flag again.
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps, lp.bin()).err, EAGAIN);
    EXPECT_FALSE(socket_readable(lp.fb.get())) << "the doorbell stayed in the socket";
}

TEST(tcp_link, a_poller_sees_the_peers_end_late_unless_the_socket_was_found_readable)
{
    for (bool told : {false, true}) {
        SCOPED_TRACE(told ? "socket_readable() said so" : "left to the every-1024th look");
        link_pair lp;
        ASSERT_NO_FATAL_FAILURE(lp.rings());
        ASSERT_EQ(send_text(*lp.a, "last words"), 10);
        lp.fa.reset(); // the peer went: its socket end closed, what it wrote in the ring
        if (told)
            lp.b->socket_readable();
        EXPECT_EQ(recv_text(*lp.b, link_waiter::polls, lp.bin()).text, "last words");
        int empty_reads = 0;
        got g{};
        for (; empty_reads < 2048; ++empty_reads) {
            g = recv_text(*lp.b, link_waiter::polls, lp.bin());
            if (g.n != -1 || g.err != EAGAIN)
                break;
        }
        EXPECT_EQ(g.n, 0) << "the end of the stream never came";
        if (told)
            EXPECT_EQ(empty_reads, 0) << "a socket found readable is looked at by the next empty read";
        else
            EXPECT_GT(empty_reads, 1000) << "a poller looked at the socket on an empty read";
    }
}

TEST(tcp_link, what_the_peer_wrote_before_its_end_is_read_before_the_end)
{
    link_pair lp;
    ASSERT_NO_FATAL_FAILURE(lp.rings());
    // A sleeper's flag is up, so the write rings; then the peer goes. The doorbell read
    // meets the end, and the ring's bytes come first.
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps, lp.bin()).err, EAGAIN);
    ASSERT_EQ(send_text(*lp.a, "goodbye"), 7);
    lp.fa.reset();
    EXPECT_TRUE(lp.b->must_read_before_wait(lp.bin())) << "a reader about to wait missed the end";
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps, lp.bin(), 4).text, "good");
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps, lp.bin()).text, "bye");
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps, lp.bin()).n, 0);
}

TEST(tcp_link, a_kept_flag_saves_the_socket_look_and_a_plain_sleeper_takes_the_doorbells)
{
    link_pair lp;
    ASSERT_NO_FATAL_FAILURE(lp.rings());
    EXPECT_FALSE(lp.b->must_read_before_wait(lp.bin())) << "nothing came: the reader may sleep";
    // A stray byte in the socket (a doorbell the wake did not take). While the flag stays
    // up nothing was written since: sleeps_flag_kept leaves the socket alone...
    const char stray = 0;
    ASSERT_EQ(::send(lp.fa.get(), &stray, 1, MSG_DONTWAIT), 1);
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps_flag_kept, lp.bin()).err, EAGAIN);
    EXPECT_TRUE(socket_readable(lp.fb.get()));
    // ...and a plain sleeper reads the doorbells first.
    EXPECT_EQ(recv_text(*lp.b, link_waiter::sleeps, lp.bin()).err, EAGAIN);
    EXPECT_FALSE(socket_readable(lp.fb.get()));
    // Bytes in the ring that no doorbell announced (written while no flag was up): a reader
    // about to wait reads them first.
    EXPECT_EQ(recv_text(*lp.b, link_waiter::polls, lp.bin()).err, EAGAIN);
    EXPECT_EQ(lp.b->take_doorbells(lp.bin()), stream_link::doorbells::taken);
    ASSERT_EQ(send_text(*lp.a, "x"), 1);
    EXPECT_TRUE(lp.b->must_read_before_wait(lp.bin()));
    // Without raising the flag (a stand-down that leaves the ring to a poller) it only
    // takes the doorbells.
    EXPECT_FALSE(lp.b->must_read_before_wait(lp.bin(), false));
}

TEST(tcp_link, a_doorbell_flood_is_read_in_bounded_pieces)
{
    link_pair lp;
    ASSERT_NO_FATAL_FAILURE(lp.rings());
    std::vector<char> flood(8 * lp.sink.size(), 0);
    ASSERT_EQ(::send(lp.fa.get(), flood.data(), flood.size(), MSG_DONTWAIT),
              static_cast<ssize_t>(flood.size()));
    EXPECT_EQ(lp.b->take_doorbells(lp.bin()), stream_link::doorbells::more);
    got g = recv_text(*lp.b, link_waiter::sleeps, lp.bin());
    EXPECT_EQ(g.n, -1);
    EXPECT_EQ(g.err, EINTR) << "a flood the read did not finish must be read again";
    EXPECT_EQ(lp.b->take_doorbells(lp.bin()), stream_link::doorbells::taken);
}

TEST(tcp_link, a_full_ring_waits_longer_each_time_says_epipe_once_the_peer_went)
{
    link_pair lp;
    ASSERT_NO_FATAL_FAILURE(lp.rings());
    std::vector<char> big(byte_ring_pair::capacity, 'z');
    iovec v{big.data(), big.size()};
    ASSERT_EQ(lp.a->send(&v, 1), static_cast<ssize_t>(big.size()));
    errno = 0;
    EXPECT_EQ(lp.a->send(&v, 1), -1);
    EXPECT_EQ(errno, EAGAIN);
    using us = std::chrono::microseconds;
    std::vector<us> waits;
    for (int i = 0; i < 8; ++i)
        waits.push_back(lp.a->next_space_wait());
    EXPECT_EQ(waits.front(), us(stream_link::backoff_min_us));
    EXPECT_EQ(waits[1], us(2 * stream_link::backoff_min_us));
    EXPECT_EQ(waits.back(), us(stream_link::backoff_max_us)) << "the wait is bounded";
    // Room again: a write that goes in starts the waits over.
    EXPECT_EQ(recv_text(*lp.b, link_waiter::polls, lp.bin(), 100).n, 100);
    ASSERT_EQ(send_text(*lp.a, "z"), 1);
    EXPECT_EQ(lp.a->next_space_wait(), us(stream_link::backoff_min_us));
    // Full again, and the reader gone: the writer hears EPIPE, as from a socket.
    iovec rest{big.data(), 99};
    ASSERT_EQ(lp.a->send(&rest, 1), 99);
    lp.b.reset();
    lp.fb.reset();
    errno = 0;
    EXPECT_EQ(lp.a->send(&v, 1), -1);
    EXPECT_EQ(errno, EPIPE);
}

TEST(tcp_link, the_wake_mark_grows_with_the_payload_to_come_and_is_bounded)
{
    EXPECT_EQ(stream_link::wake_mark_for(0), 1) << "between frames: every byte wakes";
    EXPECT_EQ(stream_link::wake_mark_for(stream_link::wake_mark_min - 1), 1);
    EXPECT_EQ(stream_link::wake_mark_for(stream_link::wake_mark_min),
              static_cast<int>(stream_link::wake_mark_min));
    EXPECT_EQ(stream_link::wake_mark_for(100000), 100000) << "never more than what is to come";
    EXPECT_EQ(stream_link::wake_mark_for(std::uint64_t{1} << 40),
              static_cast<int>(stream_link::wake_mark_max));
}

TEST(tcp_link, a_wait_wakes_at_its_mark_and_at_once_when_a_read_lowers_it)
{
    // TCP over loopback: its poll honours SO_RCVLOWAT (tcp_epollin_ready), unless receive
    // memory runs short or the window nearly closes: a large buffer and a small part of it
    // in flight keep those out of this test.
    unique_fd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const int rcvbuf = 4 << 20;
    ASSERT_EQ(::setsockopt(l.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&in), sizeof in), 0) << std::strerror(errno);
    ASSERT_EQ(::listen(l.get(), 1), 0);
    socklen_t len = sizeof in;
    ASSERT_EQ(::getsockname(l.get(), reinterpret_cast<sockaddr*>(&in), &len), 0);
    unique_fd tx(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(::connect(tx.get(), reinterpret_cast<sockaddr*>(&in), sizeof in), 0) << std::strerror(errno);
    unique_fd rx(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    ASSERT_TRUE(rx) << std::strerror(errno);
    stream_link link(rx.get());

    // A payload of 128 KiB to come: the wait's mark is all of it.
    const std::uint64_t payload = 128u << 10;
    link.set_wake_mark(stream_link::wake_mark_for(payload));
    ASSERT_EQ(link.wake_mark(), static_cast<int>(payload));
    int kernel_mark = 0;
    socklen_t ml = sizeof kernel_mark;
    ASSERT_EQ(::getsockopt(rx.get(), SOL_SOCKET, SO_RCVLOWAT, &kernel_mark, &ml), 0);
    EXPECT_EQ(kernel_mark, static_cast<int>(payload));
    // An eighth of it arrives: the wait sleeps on.
    std::vector<char> part(payload / 8, 'p');
    ASSERT_EQ(::send(tx.get(), part.data(), part.size(), 0), static_cast<ssize_t>(part.size()));
    pollfd p{rx.get(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 100), 0) << "woke below its mark";
    // A mark only comes down: a larger payload to come leaves it.
    link.keep_wake_mark_reachable(1u << 30);
    EXPECT_EQ(link.wake_mark(), static_cast<int>(payload));
    // Another thread read the frame's payload up to its last 1000 bytes (the engine's wait
    // still armed): the mark comes down to 1, and the wait wakes for what is there.
    link.keep_wake_mark_reachable(1000);
    EXPECT_EQ(link.wake_mark(), 1);
    EXPECT_EQ(::poll(&p, 1, 1000), 1) << "a lowered mark left the wait asleep";
    // Rings: the socket carries one-byte doorbells, so the mark stays.
    link_pair lp;
    ASSERT_NO_FATAL_FAILURE(lp.rings());
    lp.b->set_wake_mark(100000);
    EXPECT_EQ(lp.b->wake_mark(), 1);
}

} // namespace
} // namespace rdmx::test
