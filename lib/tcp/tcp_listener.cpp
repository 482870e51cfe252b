// Listening side of the TCP backend. Runs on the caller's thread inside get_request():
// as with rdma_cm, a connect waits until the application takes the request, and a client
// that connects but never says HELLO costs one socket for a bounded time, never a thread.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tcp/tcp_connection.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{
namespace
{

/// How long an accepted socket may take to deliver its HELLO.
constexpr auto hello_timeout = std::chrono::seconds(5);

class tcp_request final : public connection_request
{
public:
    tcp_request(tcp_domain& dom, unique_fd fd, const handshake& hello)
        : dom_(dom), fd_(std::move(fd)), hello_(hello)
    {
    }
    // Destroyed without accept/reject: the socket closes, the client's connect fails with
    // errc::rejected (as rdma_cm rejects a request the application destroyed).

    std::span<const std::byte> private_data() const noexcept override { return hello_.data(); }

    std::unique_ptr<connection> accept(const connection_options& opts,
                                       std::span<const std::byte> private_data) override
    {
        if (!fd_)
            throw_error(errc::invalid_argument, "accept: request already answered");
        if (private_data.size() > max_accept_private_data)
            throw_error(errc::invalid_argument, "accept: private data over 196 bytes");
        connection_limits lim = clamp_limits(opts);
        // A failure leaves the request unanswered: the client is rejected.
        set_congestion_control(fd_.get(), opts.tcp_congestion);
        handshake reply;
        reply.type = handshake_type::accept;
        reply.max_rd_atomic = lim.max_rd_atomic;
        reply.private_data_len = static_cast<std::uint8_t>(private_data.size());
        std::copy(private_data.begin(), private_data.end(), reply.private_data.begin());
        std::byte buf[handshake::reply_size];
        reply.encode(buf);
        // Build the rings before answering, so that an allocation failure rejects (by
        // closing) rather than leaving the client with a connection nobody serves.
        int fd = fd_.get();
        auto st = std::make_shared<conn_state>(dom_, std::move(fd_), lim, opts, hello_.max_rd_atomic);
        auto conn = std::make_unique<tcp_connection>(
            st, std::vector<std::byte>(hello_.data().begin(), hello_.data().end()));
        send_exact(fd, buf, clock::now() + opts.timeout, "accept (reply)");
        st->start();
        return conn;
    }

    void reject(std::span<const std::byte> private_data) override
    {
        if (!fd_)
            throw_error(errc::invalid_argument, "reject: request already answered");
        if (private_data.size() > max_reject_private_data)
            throw_error(errc::invalid_argument, "reject: private data over 148 bytes");
        handshake reply;
        reply.type = handshake_type::reject;
        reply.private_data_len = static_cast<std::uint8_t>(private_data.size());
        std::copy(private_data.begin(), private_data.end(), reply.private_data.begin());
        std::byte buf[handshake::reply_size];
        reply.encode(buf);
        unique_fd fd = std::move(fd_);
        send_exact(fd.get(), buf, clock::now() + std::chrono::seconds(2), "reject (reply)");
    }

private:
    tcp_domain& dom_;
    unique_fd fd_;
    handshake hello_;
};

class tcp_listener final : public listener
{
public:
    tcp_listener(tcp_domain& dom, std::string_view address, int backlog)
        : dom_(dom), backlog_(backlog > 0 ? backlog : 1)
    {
        uri u = uri::parse(address);
        std::string what = "listen " + std::string(address);
        if (u.scheme == scheme::rdma)
            throw_error(errc::invalid_argument, what + ": the TCP domain cannot listen on rdma://");
        // Bind exactly the address given (the first one it resolves to).
        auto addrs = resolve(u, true, what);
        const socket_address& a = addrs.front();
        fd_.reset(::socket(a.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!fd_)
            throw_errno(errno, "socket");
        int one = 1;
        ::setsockopt(fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        // [::] means IPv6 only here; 0.0.0.0 is a separate listener.
        if (a.addr.ss_family == AF_INET6)
            ::setsockopt(fd_.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) < 0)
            throw error(std::error_code(errno, std::system_category()), what + ": bind");
        if (::listen(fd_.get(), backlog_) < 0)
            throw error(std::error_code(errno, std::system_category()), what + ": listen");
        sockaddr_storage bound{};
        socklen_t len = sizeof bound;
        if (::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&bound), &len) < 0)
            throw_errno(errno, "getsockname");
        port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    }

    std::uint16_t port() const noexcept override { return port_; }
    rdmx::backend backend() const noexcept override { return backend::tcp; }

    std::unique_ptr<connection_request> get_request(std::chrono::milliseconds timeout) override
    {
        auto deadline = clock::now() + timeout;
        std::vector<pollfd> pfds;
        // The round that starts at or after the deadline polls without waiting and is the
        // last: a zero timeout takes a request that is already there and never blocks.
        for (bool last = false;;) {
            if (auto req = take_hello())
                return req;
            if (last)
                return nullptr;
            auto now = clock::now();
            std::erase_if(pending_, [&](const pending& p) { return p.deadline <= now || !p.fd; });
            last = now >= deadline;
            auto wake = deadline;
            pfds.clear();
            pfds.push_back({fd_.get(), POLLIN, 0});
            for (auto& p : pending_) {
                pfds.push_back({p.fd.get(), POLLIN, 0});
                wake = std::min(wake, p.deadline);
            }
            int rc = ::poll(pfds.data(), pfds.size(), last ? 0 : poll_timeout(wake));
            if (rc < 0 && errno != EINTR)
                throw_errno(errno, "poll");
            if (rc <= 0)
                continue;
            for (std::size_t i = 0; i < pending_.size(); ++i) {
                if (pfds[i + 1].revents != 0)
                    read_hello(pending_[i]);
            }
            if (pfds[0].revents != 0)
                accept_all();
        }
    }

private:
    struct pending {
        unique_fd fd;
        std::array<std::byte, handshake::hello_size> buf{};
        std::size_t got = 0;
        clock::time_point deadline;
    };

    void accept_all()
    {
        for (;;) {
            int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0)
                return; // EAGAIN, or a connection that died while queued
            unique_fd fd(c);
            if (pending_.size() >= static_cast<std::size_t>(backlog_))
                continue; // too many half-open handshakes: close this one
            try {
                set_socket_options(fd.get());
            } catch (const error&) {
                continue;
            }
            pending_.push_back({std::move(fd), {}, 0, clock::now() + hello_timeout});
            // A client sends its HELLO right after connecting: it is usually there already,
            // and reading it now lets a zero-timeout get_request() hand the request out.
            read_hello(pending_.back());
        }
    }

    /// Reads what is there of a pending HELLO, without waiting; closes a socket that failed.
    static void read_hello(pending& p) noexcept
    {
        if (!p.fd || p.got >= handshake::hello_size)
            return;
        ssize_t n = ::recv(p.fd.get(), p.buf.data() + p.got, handshake::hello_size - p.got, MSG_DONTWAIT);
        if (n > 0)
            p.got += static_cast<std::size_t>(n);
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
            p.fd.reset(); // gone before saying HELLO
    }

    /// A HELLO that is complete: validated and handed out (a malformed one is closed).
    std::unique_ptr<connection_request> take_hello()
    {
        for (std::size_t i = 0; i < pending_.size(); ++i) {
            auto& p = pending_[i];
            if (!p.fd || p.got < handshake::hello_size)
                continue;
            auto hello = handshake::decode({p.buf.data(), handshake::hello_size}, true);
            unique_fd fd = std::move(p.fd);
            pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
            if (hello)
                return std::make_unique<tcp_request>(dom_, std::move(fd), *hello);
            --i; // malformed: closed
        }
        return nullptr;
    }

    tcp_domain& dom_;
    int backlog_;
    unique_fd fd_;
    std::uint16_t port_ = 0;
    std::vector<pending> pending_;
};

} // namespace

std::unique_ptr<listener> make_listener(tcp_domain& dom, std::string_view address, int backlog)
{
    return std::make_unique<tcp_listener>(dom, address, backlog);
}

} // namespace rdmx::tcp
