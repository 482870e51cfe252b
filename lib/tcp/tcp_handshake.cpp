// The client's handshake, on the engine thread: the socket's connect() completes (the next
// address a name resolved to while it fails), HELLO goes out, the ACCEPT or REJECT comes
// back (docs/wire-format.md section 2), all as readiness waits on the connection's
// descriptor, bounded by one timer. No thread blocks for it: start_connect's application
// sees `connecting`, then the event; a blocking connect() is the same flow and a wait
// (await_handshake). start_accept's server side sends its reply the same way.
#include <sys/socket.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include <boost/asio/post.hpp>

#include "errno_status.hpp"
#include "tcp/tcp_engine.hpp"
#include "tcp/tcp_log.hpp"

namespace rdmx::tcp
{
namespace
{

/// A connection's cause is always rdmx's code (lib/errno_status.hpp): refused, unreachable,
/// timed out; ECONNRESET, a listener that closed (or died) during the handshake, is
/// peer_lost, which the endpoint redials.
std::error_code connect_status(int err) noexcept
{
    return detail::errc_of_errno(err);
}

} // namespace

void connection_engine::start_client(std::span<const std::byte> hello, clock::time_point deadline,
                                     int connect_err, dial_plan rest)
{
    {
        engine_lock lk(mu_);
        dial_ = std::move(rest);
    }
    start_handshake(hs_phase::connect, hello, deadline, connect_err);
}

void connection_engine::start_server(std::span<const std::byte> reply, clock::time_point deadline)
{
    start_handshake(hs_phase::accept, reply, deadline, 0);
}

void connection_engine::start_handshake(hs_phase phase, std::span<const std::byte> out,
                                        clock::time_point deadline, int connect_err)
{
    // deregister() must reach this connection's frame on the wire, as start()'s (before,
    // connections started here were never tracked: a region deregistered under one of
    // their frames let the peer read other bytes for it).
    dom_.track(weak_from_this());
    engine_lock lk(mu_);
    std::copy(out.begin(), out.end(), hs_buf_.begin());
    hs_len_ = out.size();
    hs_done_ = 0;
    hs_phase_ = phase;
    state_.store(connection_state::connecting, std::memory_order_release);
    asio::post(dom_.io(), [self = shared_from_this(), deadline, connect_err] {
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        if (self->closed_ || self->state() != connection_state::connecting)
            return;
        self->handshake_timer_.expires_at(deadline);
        self->handshake_timer_.async_wait([self](const boost::system::error_code& ec) {
            if (ec == asio::error::operation_aborted)
                return;
            engine_lock lk(self->mu_);
            self->assert_on_engine();
            if (self->state() == connection_state::connecting)
                self->handshake_failed(errc::timed_out, "no answer within connection_options::timeout");
        });
        if (connect_err)
            self->connect_failed(connect_err);
        else
            self->handshake_step();
    });
}

void connection_engine::await_handshake(std::string_view what, std::string_view address,
                                        clock::time_point bound)
{
    auto text = [&](std::string_view why) {
        std::string t(what);
        if (!address.empty())
            t.append(" ").append(address);
        return t.append(": ").append(why);
    };
    {
        std::unique_lock lk(settle_mu_);
        settled_.wait_until(lk, bound, [&] { return state() != connection_state::connecting; });
    }
    std::error_code cause;
    std::string why;
    {
        engine_lock lk(mu_);
        if (hs_phase_ == hs_phase::none)
            return; // established (and perhaps ended since)
        if (hs_phase_ != hs_phase::failed)
            throw error(make_error_code(errc::timed_out), text("the handshake did not end"));
        why = hs_why_.data();
    }
    cause = last_error();
    std::vector<std::byte> pdata;
    if (cause == errc::rejected)
        pdata.assign(peer_private_data().begin(), peer_private_data().end());
    throw error(cause ? cause : make_error_code(errc::disconnected), text(why), std::move(pdata));
}

void connection_engine::connect_failed(int err) noexcept
{
    if (redial(err)) {
        handshake_wait(asio::posix::stream_descriptor::wait_write);
        return;
    }
    handshake_failed(connect_status(err), "connect(): %s", std::strerror(err));
}

bool connection_engine::redial(int& err) noexcept
{
    while (!dial_.addrs.empty()) {
        const detail::socket_address a = dial_.addrs.front();
        dial_.addrs.erase(dial_.addrs.begin());
        unique_fd fd(::socket(a.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!fd) {
            err = errno;
            continue;
        }
        try {
            set_socket_options(fd.get());
            set_congestion_control(fd.get(), dial_.congestion); // worked on the first socket
        } catch (const std::exception&) {
            err = errno ? errno : EINVAL;
            continue;
        }
        if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) < 0 &&
            errno != EINPROGRESS) {
            err = errno;
            continue;
        }
        // The reactor and the shared queues' epoll sets know the socket by number and by
        // open file: each lets the old one go before dup3 replaces it, and takes the new.
        const bool queues = on_shared_cq_ && !queues_unwatched_ && !shared_detached_;
        if (queues)
            for (tcp_completion_queue* q : shared_queues())
                if (q)
                    q->unwatch(fd_);
        [[maybe_unused]] int same = desc_.release(); // no wait is outstanding (a step runs)
        int rc = ::dup3(fd.get(), fd_, O_CLOEXEC);
        boost::system::error_code ec;
        desc_.assign(fd_, ec);
        if (rc < 0 || ec) {
            err = rc < 0 ? errno : ec.value();
            if (queues)
                queues_unwatched_ = true;
            return false;
        }
        if (queues)
            for (tcp_completion_queue* q : shared_queues())
                if (q && !q->watch(*this, fd_)) {
                    err = errno;
                    queues_unwatched_ = true; // the set may hold it in part: close_socket unwatches
                    return false;
                }
        return true;
    }
    return false;
}

void connection_engine::handshake_step() noexcept
{
    if (closed_ || state() != connection_state::connecting)
        return;
    auto wait = [this](asio::posix::stream_descriptor::wait_type w)
                    RDMX_REQUIRES(mu_, engine_thread_) { handshake_wait(w); };
    switch (hs_phase_) {
    case hs_phase::connect: {
        int err = 0;
        socklen_t len = sizeof err;
        if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err) {
            connect_failed(err);
            return;
        }
        // Connected? A socket still connecting is not writable yet, and has no peer.
        sockaddr_storage peer{};
        socklen_t plen = sizeof peer;
        if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &plen) < 0) {
            wait(asio::posix::stream_descriptor::wait_write);
            return;
        }
        hs_phase_ = hs_phase::hello;
        [[fallthrough]];
    }
    case hs_phase::hello:
        if (int err = handshake_send_rest()) {
            if (err == EAGAIN)
                wait(asio::posix::stream_descriptor::wait_write);
            else if (err > 0)
                handshake_failed(connect_status(err), "sending HELLO: %s", std::strerror(err));
            else
                handshake_failed(errc::disconnected, "sending HELLO: the listener closed the connection");
            return;
        }
        hs_phase_ = hs_phase::reply;
        hs_done_ = 0;
        [[fallthrough]];
    case hs_phase::reply: {
        // Exactly the reply: a frame the listener's engine sends after it stays for ours.
        while (hs_done_ < handshake::reply_size) {
            ssize_t n =
                ::recv(fd_, hs_buf_.data() + hs_done_, handshake::reply_size - hs_done_, MSG_DONTWAIT);
            if (n > 0) {
                hs_done_ += static_cast<std::size_t>(n);
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                wait(asio::posix::stream_descriptor::wait_read);
                return;
            }
            // Closed without a reply: the listener dropped the request.
            handshake_failed(errc::rejected, "the listener closed the connection");
            return;
        }
        auto reply = handshake::decode({hs_buf_.data(), handshake::reply_size}, false);
        if (!reply) {
            if (auto v = handshake::peer_version({hs_buf_.data(), handshake::reply_size});
                v && *v != protocol_version) {
                log_limited("connect: the listener speaks wire protocol version %u, this side %u",
                            unsigned{*v}, unsigned{protocol_version});
                handshake_failed(errc::protocol_error,
                                 "the listener speaks wire protocol version %u, this side %u", unsigned{*v},
                                 unsigned{protocol_version});
            } else {
                handshake_failed(errc::protocol_error, "malformed handshake reply");
            }
            return;
        }
        auto d = reply->data();
        peer_pdata_.assign(d.begin(), d.end());
        if (reply->type == handshake_type::reject) {
            handshake_failed(errc::rejected, "rejected by the listener");
            return;
        }
        max_rd_out_ = std::max<std::uint32_t>(1, std::min(lim_.max_rd_atomic, reply->max_rd_atomic));
        lim_.max_rd_atomic = max_rd_out_; // limits(): what the connection got (before `established`)
        peer_goodbye_ = (reply->flags & handshake_flag_goodbye) != 0;
        begin_established();
        return;
    }
    case hs_phase::accept:
        if (int err = handshake_send_rest()) {
            if (err == EAGAIN)
                wait(asio::posix::stream_descriptor::wait_write);
            else
                handshake_failed(errc::disconnected, "the client left before the reply");
            return;
        }
        begin_established();
        return;
    case hs_phase::none:
    case hs_phase::failed: return;
    }
}

int connection_engine::handshake_send_rest() noexcept
{
    while (hs_done_ < hs_len_) {
        ssize_t n = ::send(fd_, hs_buf_.data() + hs_done_, hs_len_ - hs_done_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            hs_done_ += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EWOULDBLOCK)
            return EAGAIN;
        return n < 0 ? errno : -1;
    }
    return 0;
}

void connection_engine::handshake_wait(asio::posix::stream_descriptor::wait_type w) noexcept
{
    desc_.async_wait(w, [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted)
            return;
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        self->handshake_step();
    });
}

void connection_engine::handshake_failed(std::error_code cause, const char* why, ...) noexcept
{
    std::va_list ap;
    va_start(ap, why);
    std::vsnprintf(hs_why_.data(), hs_why_.size(), why, ap);
    va_end(ap);
    hs_phase_ = hs_phase::failed;
    rx_done_ = true;
    tx_done_ = true;
    handshake_timer_.cancel();
    fail(connection_state::error, cause);
    close_socket();
    wake_settled();
}

void connection_engine::wake_settled() noexcept
{
    {
        std::lock_guard lk(settle_mu_); // a waiter between its test and its sleep sees the state
    }
    settled_.notify_all();
}

void connection_engine::begin_established() noexcept
{
    handshake_timer_.cancel();
    hs_phase_ = hs_phase::none;
    state_.store(connection_state::established, std::memory_order_release);
    events_.report(connection_state::established, {}, false);
    wake_settled();
    // As start(), on this thread already.
    rx_run();
    arm_progress_check();
    standdown_timer_.expires_after(std::chrono::hours(1));
    standdown_timer_.async_wait([](const boost::system::error_code&) {});
    tx_check_timer_.expires_after(std::chrono::hours(1));
    tx_check_timer_.async_wait([](const boost::system::error_code&) {});
    standdown_timer_.cancel();
    tx_check_timer_.cancel();
    pump(); // what was posted meanwhile: nothing (post refused it), but acks are owed none either
}

} // namespace rdmx::tcp
