// Listening side of the TCP backend. Runs on the caller's thread inside get_request():
// as with rdma_cm, a connect waits until the application takes the request, and a client
// that connects but never says HELLO costs one socket for a bounded time, never a thread.
//
// Handshake slots: idle sockets must not lock legitimate clients out. A full table evicts
// the oldest handshake still without its HELLO instead of refusing the newcomer; one source
// holds at most a share of the table, so a flood from one address only evicts its own
// sockets; and a socket is read once more before it is evicted, so that a client whose
// HELLO has arrived keeps its slot. A client that sends HELLO right after connecting is
// thus only evicted if the slots of its source turn over completely before its HELLO
// arrives.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "tcp/tcp_connection.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_log.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"
#include "validate.hpp"

namespace rdmx::tcp
{
namespace
{

/// How long an accepted socket may take to deliver its HELLO.
constexpr auto hello_timeout = std::chrono::seconds(5);
/// Handshakes in progress at once: the listen backlog, but at least this many.
constexpr std::size_t min_pending = 128;
/// The share of those that one source address may hold without its HELLO: 1 / this.
constexpr std::size_t source_share = 8;
/// After accept4 ran out of descriptors or memory: pause accepting (the connection waits
/// in the kernel's queue), from the first to the last pause, doubling.
constexpr auto accept_pause_min = std::chrono::milliseconds(50);
constexpr auto accept_pause_max = std::chrono::milliseconds(1000);

std::atomic<std::uint64_t> accept_pauses{0};

/// What the per-source bound counts as one source: an IPv4 address, an IPv6 /64 (what one
/// host usually has; a host with a whole prefix could otherwise take every slot).
std::uint64_t source_of(const sockaddr_storage& sa) noexcept
{
    std::uint64_t key = 0;
    if (sa.ss_family == AF_INET)
        key = reinterpret_cast<const sockaddr_in&>(sa).sin_addr.s_addr;
    else if (sa.ss_family == AF_INET6)
        std::memcpy(&key, reinterpret_cast<const sockaddr_in6&>(sa).sin6_addr.s6_addr, sizeof key);
    return key;
}

class tcp_request final : public connection_request
{
public:
    tcp_request(std::shared_ptr<tcp_domain> dom, unique_fd fd, const handshake& hello)
        : dom_(std::move(dom)), fd_(std::move(fd)), hello_(hello)
    {
    }
    // Destroyed without accept/reject: the socket closes, the client's connect fails with
    // errc::rejected (as rdma_cm rejects a request the application destroyed).

    std::span<const std::byte> private_data() const noexcept override { return hello_.data(); }

    std::unique_ptr<connection> accept(const connection_options& opts,
                                       std::span<const std::byte> private_data,
                                       std::span<const recv_request> initial_recvs) override
    {
        if (!initial_recvs.empty())
            throw_error(errc::not_supported, "accept: initial_recvs not built yet");
        if (!fd_)
            throw_error(errc::invalid_argument, "accept: request already answered");
        connection_limits lim = detail::clamp_limits(opts, dom_->limits());
        // Room on the shared completion queues first: without it the client is rejected.
        detail::cq_reservation shared(opts, lim, backend::tcp, "accept");
        std::byte buf[handshake::reply_size];
        auto reply = encode_handshake(handshake_type::accept, lim.max_rd_atomic, private_data, buf, "accept");
        // A failure leaves the request unanswered: the client is rejected.
        set_congestion_control(fd_.get(), opts.tcp.congestion);
        // Build the rings before answering, so that an allocation failure rejects (by
        // closing) rather than leaving the client with a connection nobody serves.
        int fd = fd_.get();
        auto st = std::make_shared<connection_engine>(*dom_, std::move(fd_), lim, opts, hello_.max_rd_atomic,
                                                      std::move(shared));
        auto conn = std::make_unique<tcp_connection>(
            dom_, st, std::vector<std::byte>(hello_.data().begin(), hello_.data().end()));
        send_exact(fd, reply, clock::now() + opts.timeout, "accept (reply)");
        st->start();
        return conn;
    }

    std::unique_ptr<connection> start_accept(const connection_options&, std::span<const std::byte>,
                                             std::span<const recv_request>) override
    {
        throw_error(errc::not_supported, "start_accept: not built yet"); // TODO(issue 17)
    }

    void reject(std::span<const std::byte> private_data) override
    {
        if (!fd_)
            throw_error(errc::invalid_argument, "reject: request already answered");
        std::byte buf[handshake::reply_size];
        auto reply = encode_handshake(handshake_type::reject, 0, private_data, buf, "reject");
        unique_fd fd = std::move(fd_);
        send_exact(fd.get(), reply, clock::now() + std::chrono::seconds(2), "reject (reply)");
    }

private:
    std::shared_ptr<tcp_domain> dom_; ///< the connection made here runs on its engine
    unique_fd fd_;
    handshake hello_;
};

class tcp_listener final : public listener
{
public:
    tcp_listener(std::shared_ptr<tcp_domain> dom, std::string_view address, int backlog)
        : dom_(std::move(dom)), backlog_(backlog > 0 ? backlog : 1)
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
        max_pending_ = std::max(static_cast<std::size_t>(backlog_), min_pending);
        max_per_source_ = std::max<std::size_t>(4, max_pending_ / source_share);
    }

    int fd() const noexcept override { return -1; } // TODO(issue 17)
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
            // While accepting is paused, poll skips the listening socket (a negative fd):
            // it stays readable, and polling it would spin.
            bool paused = now < accept_resume_;
            if (paused)
                wake = std::min(wake, accept_resume_);
            pfds.push_back({paused ? -1 : fd_.get(), POLLIN, 0});
            for (auto& p : pending_) {
                pfds.push_back({p.fd.get(), POLLIN, 0});
                wake = std::min(wake, p.deadline);
            }
            int rc = ::poll(pfds.data(), pfds.size(), last ? 0 : poll_timeout(wake));
            if (rc < 0 && errno != EINTR)
                throw_errno(errno, "poll");
            if (rc <= 0)
                continue;
            for (std::size_t i = 0; i < pending_.size(); ++i)
                if (pfds[i + 1].revents != 0)
                    read_hello(pending_[i]);
            if (pfds[0].revents != 0)
                accept_all();
        }
    }

private:
    struct pending {
        unique_fd fd;
        std::array<std::byte, handshake::hello_size> buf{};
        std::size_t got = 0;
        clock::time_point deadline; ///< also the order of arrival: all get the same timeout
        std::uint64_t source = 0;   ///< source_of() its peer
        bool complete() const noexcept { return got >= handshake::hello_size; }
    };

    /// Reads what has arrived of p's HELLO; closes p if its peer went away.
    static void read_hello(pending& p) noexcept
    {
        if (!p.fd || p.complete())
            return;
        ssize_t n = ::recv(p.fd.get(), p.buf.data() + p.got, handshake::hello_size - p.got, MSG_DONTWAIT);
        if (n > 0)
            p.got += static_cast<std::size_t>(n);
        else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            p.fd.reset(); // gone before saying HELLO
    }

    void accept_all()
    {
        for (;;) {
            // Every slot taken by a complete HELLO: the rest wait in the kernel's queue until
            // the application takes requests (get_request returns one at once).
            if (pending_.size() >= max_pending_ &&
                std::all_of(pending_.begin(), pending_.end(), [](const pending& p) { return p.complete(); }))
                return;
            sockaddr_storage sa{};
            socklen_t len = sizeof sa;
            int c = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&sa), &len, SOCK_CLOEXEC);
            if (c < 0) {
                int err = errno;
                if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM)
                    pause_accepts(err);
                else if (err == EINTR || err == ECONNABORTED || err == EPROTO)
                    continue; // a connection that died while queued: the next one
                return;       // EAGAIN: all taken
            }
            accept_pause_ = {};
            pending p{unique_fd(c), {}, 0, clock::now() + hello_timeout, source_of(sa)};
            try {
                set_socket_options(p.fd.get());
            } catch (const error&) {
                continue;
            }
            read_hello(p); // a client sends HELLO right after connecting: often there already
            if (!p.fd)
                continue;
            if (!make_room(p) && !p.complete())
                continue; // no slot: closed (only when every other slot was just completed)
            pending_.push_back(std::move(p));
        }
    }

    /// A HELLO that is complete: validated and handed out (a malformed one is closed).
    std::unique_ptr<connection_request> take_hello()
    {
        for (std::size_t i = 0; i < pending_.size(); ++i) {
            auto& p = pending_[i];
            if (!p.fd || !p.complete())
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

    /// Evicts handshakes without a HELLO so that `p` fits: the oldest of its own source
    /// when that holds its share already, else (table full) the oldest of the source that
    /// holds the most. False if no slot could be freed.
    bool make_room(const pending& p)
    {
        for (;;) {
            std::unordered_map<std::uint64_t, std::size_t> idle;
            for (const auto& q : pending_)
                if (!q.complete())
                    ++idle[q.source];
            bool own = !p.complete() && idle[p.source] >= max_per_source_;
            if (!own && pending_.size() < max_pending_)
                return true;
            std::size_t victim = pending_.size();
            for (std::size_t i = 0; i < pending_.size(); ++i) {
                const pending& q = pending_[i];
                if (q.complete() || (own && q.source != p.source))
                    continue;
                // pending_ is in order of arrival: the first of the heaviest source wins.
                if (victim == pending_.size() || idle[q.source] > idle[pending_[victim].source])
                    victim = i;
            }
            if (victim == pending_.size())
                return false;
            // A last look: a HELLO that arrived meanwhile keeps its slot.
            read_hello(pending_[victim]);
            if (pending_[victim].fd && pending_[victim].complete())
                continue;
            pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(victim));
        }
    }

    /// accept4 found no descriptor or memory: the listening socket stays readable, so
    /// polling it again at once would spin. Pause (the client waits in the kernel's queue,
    /// within its timeout), report it, and try again later.
    void pause_accepts(int err)
    {
        accept_pause_ = accept_pause_ == clock::duration{}
                            ? clock::duration(accept_pause_min)
                            : std::min<clock::duration>(2 * accept_pause_, accept_pause_max);
        accept_resume_ = clock::now() + accept_pause_;
        accept_pauses.fetch_add(1, std::memory_order_relaxed);
        log_limited("listener on port %u: accept4: %s; accepting again in %lld ms", unsigned{port_},
                    std::strerror(err),
                    static_cast<long long>(
                        std::chrono::duration_cast<std::chrono::milliseconds>(accept_pause_).count()));
    }

    std::shared_ptr<tcp_domain> dom_; ///< for the requests it hands out
    int backlog_;
    unique_fd fd_;
    std::uint16_t port_ = 0;
    std::size_t max_pending_ = min_pending;
    std::size_t max_per_source_ = min_pending / source_share;
    std::vector<pending> pending_;
    clock::duration accept_pause_{}; ///< the latest pause; zero after a successful accept
    clock::time_point accept_resume_{};
};

} // namespace

std::uint64_t listener_accept_pauses() noexcept
{
    return accept_pauses.load(std::memory_order_relaxed);
}

std::unique_ptr<listener> make_listener(std::shared_ptr<tcp_domain> dom, std::string_view address,
                                        int backlog)
{
    return std::make_unique<tcp_listener>(std::move(dom), address, backlog);
}

} // namespace rdmx::tcp
