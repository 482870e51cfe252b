// The client's handshake of start_connect, on the engine thread: the socket's connect()
// completes, HELLO goes out, the ACCEPT or REJECT comes back (docs/wire-format.md section
// 2), all as readiness waits on the connection's descriptor, bounded by one timer. No
// thread blocks for it; the application sees `connecting`, then the event.
#include <sys/socket.h>

#include <cerrno>

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
                                     int connect_err)
{
    start_handshake(hs_phase::connect, hello, deadline,
                    connect_err ? connect_status(connect_err) : std::error_code{});
}

void connection_engine::start_server(std::span<const std::byte> reply, clock::time_point deadline)
{
    start_handshake(hs_phase::accept, reply, deadline, {});
}

void connection_engine::start_handshake(hs_phase phase, std::span<const std::byte> out,
                                        clock::time_point deadline, std::error_code err)
{
    engine_lock lk(mu_);
    std::copy(out.begin(), out.end(), hs_buf_.begin());
    hs_len_ = out.size();
    hs_done_ = 0;
    hs_phase_ = phase;
    state_.store(connection_state::connecting, std::memory_order_release);
    asio::post(dom_.io(), [self = shared_from_this(), deadline, err] {
        engine_lock lk(self->mu_);
        self->assert_on_engine();
        if (self->closed_ || self->state() != connection_state::connecting)
            return;
        if (err) {
            self->handshake_failed(err);
            return;
        }
        self->handshake_timer_.expires_at(deadline);
        self->handshake_timer_.async_wait([self](const boost::system::error_code& ec) {
            if (ec == asio::error::operation_aborted)
                return;
            engine_lock lk(self->mu_);
            self->assert_on_engine();
            if (self->state() == connection_state::connecting)
                self->handshake_failed(errc::timed_out);
        });
        self->handshake_step();
    });
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
            handshake_failed(connect_status(err));
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
            else
                handshake_failed(err > 0 ? connect_status(err) : make_error_code(errc::disconnected));
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
            // Closed without a reply: the listener dropped the request (as connect()).
            handshake_failed(errc::rejected);
            return;
        }
        auto reply = handshake::decode({hs_buf_.data(), handshake::reply_size}, false);
        if (!reply) {
            if (auto v = handshake::peer_version({hs_buf_.data(), handshake::reply_size});
                v && *v != protocol_version)
                log_limited("connect: the listener speaks wire protocol version %u, this side %u",
                            unsigned{*v}, unsigned{protocol_version});
            handshake_failed(errc::protocol_error);
            return;
        }
        auto d = reply->data();
        peer_pdata_.assign(d.begin(), d.end());
        if (reply->type == handshake_type::reject) {
            handshake_failed(errc::rejected);
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
                handshake_failed(errc::disconnected); // the client left before the reply
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

void connection_engine::handshake_failed(std::error_code cause) noexcept
{
    hs_phase_ = hs_phase::failed;
    rx_done_ = true;
    tx_done_ = true;
    handshake_timer_.cancel();
    fail(connection_state::error, cause);
    close_socket();
}

void connection_engine::begin_established() noexcept
{
    handshake_timer_.cancel();
    hs_phase_ = hs_phase::none;
    state_.store(connection_state::established, std::memory_order_release);
    events_.report(connection_state::established, {}, false);
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
