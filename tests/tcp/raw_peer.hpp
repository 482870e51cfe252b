// A raw TCP peer of the engine, for the tests that speak the wire format by hand
// (engine_test.cpp, hostile_peer_test.cpp): blocking socket helpers, the handshake, frame
// headers, and a fixture with a listener that accepts such peers; and a hold on a domain's
// engine thread.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>

#include <boost/asio/post.hpp>

#include "backends.hpp"
#include "common/test_util.hpp"
#include "resolve.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::test
{

using tcp::frame_header;
using tcp::frame_op;
using tcp::handshake;
using tcp::handshake_type;

/// A blocking TCP connect to 127.0.0.1:port from `source` (a loopback address), with
/// TCP_NODELAY and, if given, a small receive buffer; -1 on failure.
inline int raw_connect(std::uint16_t port, const char* source = "127.0.0.1", int rcvbuf = 0)
{
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (rcvbuf > 0) // before connect, so that the window is small from the start
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &src.sin_addr);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
        ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
        ::close(fd);
        return -1;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/// A blocking connect to the listener of shm://`name`:`port` (its abstract UNIX socket,
/// lib/resolve.hpp); -1 on failure.
inline int raw_connect_shm(const std::string& name, std::uint16_t port)
{
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    const detail::socket_address a = detail::shm_socket_address(name, port);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

inline bool send_all(int fd, const void* p, std::size_t n)
{
    auto b = static_cast<const std::byte*>(p);
    while (n > 0) {
        ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        b += k;
        n -= static_cast<std::size_t>(k);
    }
    return true;
}

/// Reads up to n bytes, blocking; returns how many arrived before end of stream.
inline std::size_t recv_all(int fd, void* p, std::size_t n)
{
    auto b = static_cast<std::byte*>(p);
    std::size_t got = 0;
    while (got < n) {
        ssize_t k = ::recv(fd, b + got, n - got, 0);
        if (k <= 0)
            break;
        got += static_cast<std::size_t>(k);
    }
    return got;
}

/// The HELLO of a well-behaved peer (a read limit of 16, no private data).
inline bool send_hello(int fd)
{
    handshake h;
    h.type = handshake_type::hello;
    h.max_rd_atomic = 16;
    std::byte buf[handshake::reply_size];
    h.encode(buf);
    return send_all(fd, buf, handshake::hello_size);
}

/// Whether the listener's reply is a whole, valid ACCEPT.
inline bool read_accept(int fd)
{
    std::byte buf[handshake::reply_size];
    if (recv_all(fd, buf, sizeof buf) != sizeof buf)
        return false;
    auto r = handshake::decode(buf, false);
    return r && r->type == handshake_type::accept;
}

inline bool send_header(int fd, const frame_header& h)
{
    frame_header::bytes b;
    h.encode(b.data());
    return send_all(fd, b.data(), b.size());
}

/// The next frame header from the engine; false at end of stream (or a malformed one).
inline bool read_header(int fd, frame_header& h)
{
    frame_header::bytes b;
    if (recv_all(fd, b.data(), b.size()) != b.size())
        return false;
    return !frame_header::decode(b.data(), h);
}

/// Holds a TCP or shm domain's engine thread (its io context) from construction until
/// release() or the end of the scope: meanwhile only the application's polls progress the
/// domain's connections (docs/tcp-engine.md, "Progress by the polled queue").
class engine_hold
{
public:
    explicit engine_hold(domain& d)
    {
        std::shared_future<void> gate = gate_.get_future().share();
        boost::asio::post(static_cast<tcp::tcp_domain&>(detail::backend_domain(d)).io(), [this, gate] {
            held_.set_value(); // the last use of `this`: the constructor returns after it
            gate.wait();
        });
        held_.get_future().wait();
    }
    ~engine_hold() { release(); }
    engine_hold(const engine_hold&) = delete;
    engine_hold& operator=(const engine_hold&) = delete;

    void release()
    {
        if (!released_)
            gate_.set_value();
        released_ = true;
    }

private:
    std::promise<void> gate_, held_;
    bool released_ = false;
};

/// Two TCP domains on loopback and a listener (with `backlog`) on the server one; with
/// `b_` set to backend::shm before SetUp (a fixture of both, in its constructor), two shm
/// domains and a listener on shm://rdmx-raw:PORT, the same engine over UNIX sockets.
class tcp_loopback : public testing::Test
{
protected:
    explicit tcp_loopback(int backlog = 64) : backlog_(backlog) {}

    void SetUp() override
    {
        server_dom_ = domain::open(address(b_, host(), 0));
        client_dom_ = domain::open(address(b_, host(), 0));
        listener_ = server_dom_->listen(address(b_, host(), 0), backlog_);
        port_ = listener_->port();
    }
    std::string host() const { return b_ == backend::shm ? "rdmx-raw" : "127.0.0.1"; }
    std::string addr() const { return address(b_, host(), port_); }
    /// A raw socket connected to the listener (raw_connect, or raw_connect_shm on shm).
    int raw_dial(int rcvbuf = 0) const
    {
        return b_ == backend::shm ? raw_connect_shm(host(), port_) : raw_connect(port_, "127.0.0.1", rcvbuf);
    }

    /// A raw peer that said HELLO and was accepted; fd is its socket. Null (and a failed
    /// expectation) if the handshake did not complete.
    std::unique_ptr<connection> accept_raw(int& fd, const connection_options& opts = {}, int rcvbuf = 0)
    {
        fd = raw_dial(rcvbuf);
        EXPECT_GE(fd, 0);
        EXPECT_TRUE(send_hello(fd));
        auto req = listener_->get_request(5s);
        EXPECT_NE(req, nullptr);
        if (!req)
            return nullptr;
        auto c = req->accept(opts);
        EXPECT_TRUE(read_accept(fd));
        return c;
    }

    /// A client connection and the listener's, through rdmx on both sides.
    struct pair {
        std::unique_ptr<connection> client, server;
    };
    pair connect_pair(const connection_options& opts = {}) { return connect_pair(opts, opts); }
    pair connect_pair(const connection_options& client_opts, const connection_options& server_opts)
    {
        auto acc = std::async(std::launch::async, [&] {
            auto req = listener_->get_request(std::chrono::seconds(10));
            if (!req)
                throw std::runtime_error("no request");
            return req->accept(server_opts);
        });
        pair p;
        p.client = client_dom_->connect(addr(), client_opts);
        p.server = acc.get();
        return p;
    }

    const int backlog_;
    backend b_ = backend::tcp;
    std::unique_ptr<domain> server_dom_, client_dom_;
    std::unique_ptr<listener> listener_;
    std::uint16_t port_ = 0;
};

} // namespace rdmx::test
