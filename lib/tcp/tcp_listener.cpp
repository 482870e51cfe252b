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
//
// listener::fd() is an epoll set (level-triggered) of everything get_request() would wait
// for: the listening socket (left out while accepting is paused), the sockets whose HELLO
// is still incomplete, an eventfd raised while a complete HELLO waits to be taken, and a
// timerfd for the end of an accept pause and the next handshake deadline. So a server
// waits on it with its other descriptors, and get_request(0ms) does the non-blocking work
// that made it readable (which may yield no request: a socket that closed, a HELLO still
// incomplete, a timer).
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <unordered_map>

#include "tcp/tcp_connection.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_log.hpp"
#include "tcp/tcp_ring.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"
#include "validate.hpp"

namespace rdmx::tcp
{
namespace
{

/// How long an accepted socket may take to deliver its HELLO.
constexpr auto hello_timeout = std::chrono::seconds(5);
/// A source at its share of handshake slots evicts only its own handshakes older than this:
/// one that holds its share and reopens each socket the moment it is evicted would
/// otherwise rotate a legitimate client of the same address out between its connect and
/// its HELLO, within milliseconds. With none that old, the newcomer takes a free slot past
/// the share (the table's own bound still holds).
constexpr auto evict_grace = std::chrono::milliseconds(250);
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
/// host usually has; a host with a whole prefix could otherwise take every slot), a
/// process on this host (a UNIX socket `fd`, shm://).
std::uint64_t source_of(const sockaddr_storage& sa, int fd) noexcept
{
    std::uint64_t key = 0;
    if (sa.ss_family == AF_UNIX) {
        // A peer on this host (shm://): its process, as the kernel names it.
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
            key = static_cast<std::uint64_t>(cred.pid);
    } else if (sa.ss_family == AF_INET)
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
        // start_accept's flow, waited for (as connect() is start_connect's): the engine
        // sends the reply, its timer bounds it by opts.timeout.
        std::byte buf[handshake::reply_size];
        auto conn = prepare(opts, private_data, initial_recvs, false, buf);
        auto& st = conn->engine();
        st.start_server(reply_, clock::now() + opts.timeout);
        st.await_handshake("accept", {}, clock::now() + opts.timeout + std::chrono::seconds(1));
        return conn;
    }

    std::unique_ptr<connection> start_accept(const connection_options& opts,
                                             std::span<const std::byte> private_data,
                                             std::span<const recv_request> initial_recvs) override
    {
        std::byte buf[handshake::reply_size];
        auto conn = prepare(opts, private_data, initial_recvs, true, buf);
        conn->engine().start_server(reply_, clock::now() + opts.timeout);
        return conn;
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
    /// accept's common part: the reply encoded into `buf` (reply_), the connection built
    /// with its rings and its initial receives, before the client hears of it. A failure
    /// leaves the request unanswered: the client is rejected.
    std::unique_ptr<tcp_connection> prepare(const connection_options& opts,
                                            std::span<const std::byte> private_data,
                                            std::span<const recv_request> initial_recvs, bool started,
                                            std::byte (&buf)[handshake::reply_size])
    {
        if (!fd_)
            throw_error(errc::invalid_argument, "accept: request already answered");
        connection_limits lim = detail::clamp_limits(opts, dom_->limits());
        // Room on the shared completion queues first: without it the client is rejected.
        detail::cq_reservation shared(opts, lim, dom_->backend(), started ? "start_accept" : "accept");
        // Rings for a client that can take them, on a UNIX socket (shm://, auto:// on this
        // host). If they cannot be made, the frames go through the socket as before.
        unique_fd memfd;
        std::unique_ptr<byte_ring_pair> rings;
        if ((hello_.flags & handshake_flag_ring) != 0 && byte_ring_pair::enabled() &&
            is_unix_socket(fd_.get())) {
            std::string why;
            rings = byte_ring_pair::create(memfd, why);
            if (!rings)
                log_limited("accept: no rings, the frames go through the socket: %s", why.c_str());
        }
        reply_ = encode_handshake(handshake_type::accept, lim.max_rd_atomic, private_data, buf, "accept",
                                  rings != nullptr);
        set_congestion_control(fd_.get(), opts.tcp.congestion);
        // limits() says what the connection got: its reads at the peer are bounded by what
        // the peer serves too (section 1 of docs/wire-format.md).
        lim.max_rd_atomic = std::max<std::uint32_t>(1, std::min(lim.max_rd_atomic, hello_.max_rd_atomic));
        auto conn = prepare_connection(*dom_, std::move(fd_), lim, opts, hello_.max_rd_atomic,
                                       std::vector<std::byte>(hello_.data().begin(), hello_.data().end()),
                                       std::move(shared), initial_recvs, started);
        conn->engine().set_peer_says_goodbye((hello_.flags & handshake_flag_goodbye) != 0);
        if (rings)
            conn->engine().use_rings(std::move(rings), std::move(memfd));
        return conn;
    }

    std::shared_ptr<tcp_domain> dom_; ///< the connection made here runs on its engine
    unique_fd fd_;
    std::span<const std::byte> reply_;
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
        detail::check_scheme(u, dom_->backend(), what);
        if (u.scheme == scheme::shm)
            bind_shm(u.host, u.port, what);
        else
            bind_tcp(u, what);
        if (::listen(fd_.get(), backlog_) < 0)
            throw error(std::error_code(errno, std::system_category()), what + ": listen");
        if (u.scheme == scheme::automatic && dom_->local_peers())
            open_local(what);
        max_pending_ = std::max(static_cast<std::size_t>(backlog_), min_pending);
        max_per_source_ = std::max<std::size_t>(4, max_pending_ / source_share);
        epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
        if (!epoll_)
            throw_errno(errno, "epoll_create1");
        ready_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        if (!ready_)
            throw_errno(errno, "eventfd");
        timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
        if (!timer_)
            throw_errno(errno, "timerfd_create");
        watch(fd_.get());
        if (local_fd_)
            watch(local_fd_.get());
        watch(ready_.get());
        watch(timer_.get());
    }

    /// Binds exactly the address given (the first one it resolves to); port_ is the port
    /// bound.
    void bind_tcp(const uri& u, const std::string& what)
    {
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
        sockaddr_storage bound{};
        socklen_t len = sizeof bound;
        if (::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&bound), &len) < 0)
            throw_errno(errno, "getsockname");
        port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
        bound_ = bound;
    }

    /// auto:// on a domain that auto:// chose: a UNIX socket beside the TCP one, named
    /// after the TCP address bound (detail::auto_local_address), for clients on this host
    /// (docs/shm.md, "auto://"). Without it (the name is taken in this network namespace,
    /// or no socket could be had) the listener serves them by TCP, and says so.
    void open_local(const std::string& what)
    {
        const socket_address a = detail::auto_local_address(bound_);
        unique_fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!fd || ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) < 0 ||
            ::listen(fd.get(), backlog_) < 0) {
            log_limited("%s: no UNIX socket beside it for peers on this host (%s): they connect by TCP",
                        what.c_str(), std::strerror(errno));
            return;
        }
        local_fd_ = std::move(fd);
    }

    /// The UNIX socket of shm://name:port (shm_socket_address). Port 0 takes the first
    /// free one of the dynamic range (49152-65535) from a random start, as TCP's port 0
    /// does: a name another listener holds is EADDRINUSE.
    void bind_shm(const std::string& name, std::uint16_t port, const std::string& what)
    {
        fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!fd_)
            throw_errno(errno, "socket");
        constexpr unsigned first = 49152, count = 65536 - first;
        const unsigned start = port ? 0 : std::random_device{}() % count;
        for (unsigned i = 0; i < (port ? 1 : count); ++i) {
            const auto p = port ? port : static_cast<std::uint16_t>(first + (start + i) % count);
            const socket_address a = detail::shm_socket_address(name, p);
            if (::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) == 0) {
                port_ = p;
                return;
            }
            if (errno != EADDRINUSE || port)
                throw error(std::error_code(errno, std::system_category()), what + ": bind");
        }
        throw error(std::error_code(EADDRINUSE, std::system_category()), what + ": bind: every port taken");
    }

    int fd() const noexcept override { return epoll_.get(); }
    std::uint16_t port() const noexcept override { return port_; }
    rdmx::backend backend() const noexcept override { return dom_->backend(); }

    std::unique_ptr<connection_request> get_request(std::chrono::milliseconds timeout) override
    {
        auto deadline = clock::now() + timeout;
        epoll_event evs[64];
        // The round that starts at or after the deadline waits not at all and is the last: a
        // zero timeout takes a request that is already there and never blocks.
        for (bool last = false;;) {
            if (auto req = take_hello()) {
                publish();
                return req;
            }
            if (last) {
                publish();
                return nullptr;
            }
            auto now = clock::now();
            std::erase_if(pending_, [&](const pending& p) { return p.deadline <= now || !p.fd; });
            last = now >= deadline;
            // While accepting is paused the listening socket is out of the epoll set: it
            // stays readable, and waiting on it would spin.
            if (paused_ && now >= accept_resume_) {
                paused_ = false;
                watch(fd_.get());
                if (local_fd_)
                    watch(local_fd_.get());
            }
            publish();
            int n =
                ::epoll_wait(epoll_.get(), evs, 64, last ? 0 : poll_timeout(std::min(deadline, next_wake())));
            if (n < 0 && errno != EINTR)
                throw_errno(errno, "epoll_wait");
            bool accept = false;
            for (int i = 0; i < n; ++i) {
                int fd = evs[i].data.fd;
                if (fd == fd_.get() || fd == local_fd_.get())
                    accept = true;
                else if (fd == timer_.get()) {
                    std::uint64_t ticks;
                    [[maybe_unused]] auto rc = ::read(fd, &ticks, sizeof ticks);
                } else if (fd != ready_.get()) {
                    for (auto& p : pending_)
                        if (p.fd.get() == fd)
                            read_hello(p);
                }
            }
            if (accept && !paused_)
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
        bool watched = false;       ///< in the epoll set (until its HELLO is complete)
        bool complete() const noexcept { return got >= handshake::hello_size; }
    };

    /// Reads what has arrived of p's HELLO; closes p if its peer went away. A complete
    /// HELLO leaves the epoll set (the `ready_` eventfd stands for it from now on).
    void read_hello(pending& p) noexcept
    {
        if (!p.fd || p.complete())
            return;
        ssize_t n = ::recv(p.fd.get(), p.buf.data() + p.got, handshake::hello_size - p.got, MSG_DONTWAIT);
        if (n > 0)
            p.got += static_cast<std::size_t>(n);
        else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            p.fd.reset(); // gone before saying HELLO (closing it also leaves the epoll set)
        if (p.fd && p.complete() && p.watched) {
            ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, p.fd.get(), nullptr);
            p.watched = false;
        }
    }

    /// Adds `fd` to the epoll set, level-triggered, readable.
    void watch(int fd)
    {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) < 0)
            throw_errno(errno, "epoll_ctl(listener)");
    }

    /// The earliest moment get_request has work without a descriptor becoming readable: the
    /// end of an accept pause, the first handshake deadline.
    clock::time_point next_wake() const noexcept
    {
        auto wake = clock::time_point::max();
        if (paused_)
            wake = accept_resume_;
        for (const auto& p : pending_)
            if (!p.complete())
                wake = std::min(wake, p.deadline);
        return wake;
    }

    /// Brings fd() up to date for a caller that waits on it instead of in get_request: the
    /// eventfd says whether a complete HELLO is waiting, the timer fires at next_wake().
    void publish() noexcept
    {
        bool any = std::any_of(pending_.begin(), pending_.end(),
                               [](const pending& p) { return p.fd && p.complete(); });
        if (any != ready_raised_) {
            std::uint64_t v = 1;
            [[maybe_unused]] auto rc =
                any ? ::write(ready_.get(), &v, sizeof v) : ::read(ready_.get(), &v, sizeof v);
            ready_raised_ = any;
        }
        itimerspec its{};
        auto wake = next_wake();
        if (wake != clock::time_point::max()) {
            // Relative, rounded up to a millisecond; at least 1 ns (0 would disarm).
            auto left = std::max<clock::duration>(wake - clock::now(), std::chrono::nanoseconds(1));
            auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
            its.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
            its.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
        }
        ::timerfd_settime(timer_.get(), 0, &its, nullptr);
    }

    void accept_all()
    {
        accept_from(fd_.get());
        if (local_fd_ && !paused_)
            accept_from(local_fd_.get());
    }

    /// Takes the connections waiting on the listening socket `lfd` (the TCP one, or the
    /// UNIX one beside it).
    void accept_from(int lfd)
    {
        for (;;) {
            // Every slot taken by a complete HELLO: the rest wait in the kernel's queue until
            // the application takes requests (get_request returns one at once).
            if (pending_.size() >= max_pending_ &&
                std::all_of(pending_.begin(), pending_.end(), [](const pending& p) { return p.complete(); }))
                return;
            sockaddr_storage sa{};
            socklen_t len = sizeof sa;
            int c = ::accept4(lfd, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_CLOEXEC);
            if (c < 0) {
                int err = errno;
                if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM)
                    pause_accepts(err);
                else if (err == EINTR || err == ECONNABORTED || err == EPROTO)
                    continue; // a connection that died while queued: the next one
                return;       // EAGAIN: all taken
            }
            accept_pause_ = {};
            pending p{unique_fd(c), {}, 0, clock::now() + hello_timeout, source_of(sa, c), false};
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
            if (!p.complete()) {
                epoll_event ev{};
                ev.events = EPOLLIN;
                ev.data.fd = p.fd.get();
                if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, p.fd.get(), &ev) < 0)
                    continue; // no memory for the watch: closed, as if no slot were free
                p.watched = true;
            }
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
            refuse_other_version({p.buf.data(), handshake::hello_size}, fd.get());
            --i; // malformed: closed
        }
        return nullptr;
    }

    /// A HELLO of another protocol version is answered with a REJECT in that version's
    /// form (the layout of section 1 has not changed: only the version byte and what the
    /// flags and opcodes mean), so that its client fails with `rejected` and a reason it
    /// can print, instead of an unexplained close. Anything else malformed gets no reply.
    static void refuse_other_version(std::span<const std::byte> hello, int fd) noexcept
    {
        auto v = handshake::peer_version(hello);
        if (!v || *v == protocol_version || *v == 0)
            return;
        handshake r;
        r.type = handshake_type::reject;
        r.version = *v;
        char text[96];
        int n = std::snprintf(text, sizeof text, "rdmx tcp: wire protocol version %u required, HELLO was %u",
                              unsigned{protocol_version}, unsigned{*v});
        r.private_data_len = static_cast<std::uint8_t>(std::clamp(n, 0, static_cast<int>(sizeof text) - 1));
        std::memcpy(r.private_data.data(), text, r.private_data_len);
        std::byte buf[handshake::reply_size];
        r.encode(buf);
        // A fresh socket's buffer takes 212 bytes at once; if not, the client sees the close.
        [[maybe_unused]] auto sent = ::send(fd, buf, r.wire_size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        log_limited("listener: refused a HELLO of wire protocol version %u (this side speaks %u)",
                    unsigned{*v}, unsigned{protocol_version});
    }

    /// Evicts handshakes without a HELLO so that `p` fits: the oldest of its own source
    /// that is older than evict_grace when that source holds its share already (none such:
    /// it may go past its share while the table has room), else (table full) the oldest of
    /// the source that holds the most. False if no slot could be freed.
    bool make_room(const pending& p)
    {
        for (;;) {
            std::unordered_map<std::uint64_t, std::size_t> idle;
            for (const auto& q : pending_)
                if (!q.complete())
                    ++idle[q.source];
            const bool own = !p.complete() && idle[p.source] >= max_per_source_;
            std::size_t victim = pending_.size();
            if (own) {
                // A deadline later than this: accepted less than evict_grace ago.
                const auto young = clock::now() + hello_timeout - evict_grace;
                for (std::size_t i = 0; i < pending_.size() && victim == pending_.size(); ++i) {
                    const pending& q = pending_[i];
                    if (!q.complete() && q.source == p.source && q.deadline <= young)
                        victim = i; // pending_ is in order of arrival: the oldest
                }
            }
            if (victim == pending_.size()) {
                if (pending_.size() < max_pending_)
                    return true;
                for (std::size_t i = 0; i < pending_.size(); ++i) {
                    const pending& q = pending_[i];
                    if (q.complete())
                        continue;
                    // The first of the heaviest source wins.
                    if (victim == pending_.size() || idle[q.source] > idle[pending_[victim].source])
                        victim = i;
                }
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
        if (!paused_) {
            ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd_.get(), nullptr);
            if (local_fd_)
                ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, local_fd_.get(), nullptr);
            paused_ = true;
        }
        accept_pauses.fetch_add(1, std::memory_order_relaxed);
        log_limited("listener on port %u: accept4: %s; accepting again in %lld ms", unsigned{port_},
                    std::strerror(err),
                    static_cast<long long>(
                        std::chrono::duration_cast<std::chrono::milliseconds>(accept_pause_).count()));
    }

    std::shared_ptr<tcp_domain> dom_; ///< for the requests it hands out
    int backlog_;
    unique_fd fd_;
    /// auto://: the UNIX socket beside fd_ for clients on this host (open_local); else none
    unique_fd local_fd_;
    sockaddr_storage bound_{}; ///< fd_'s address (TCP), for local_fd_'s name
    std::uint16_t port_ = 0;
    std::size_t max_pending_ = min_pending;
    std::size_t max_per_source_ = min_pending / source_share;
    std::vector<pending> pending_;
    clock::duration accept_pause_{}; ///< the latest pause; zero after a successful accept
    clock::time_point accept_resume_{};
    bool paused_ = false; ///< the listening socket is out of the epoll set until accept_resume_
    unique_fd epoll_;     ///< fd(): the listening socket, the HELLOs pending, ready_, timer_
    unique_fd ready_;     ///< eventfd, readable while a complete HELLO waits in pending_
    unique_fd timer_;     ///< timerfd, fires at next_wake()
    bool ready_raised_ = false;
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
