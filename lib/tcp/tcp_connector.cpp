// The handshake's state machine (tcp_connector.hpp): no engine, no asio, one socket.
#include "tcp/tcp_connector.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "errno_status.hpp"
#include "tcp/tcp_log.hpp"

namespace rdmx::tcp
{

void connector::begin(phase p, std::span<const std::byte> out) noexcept
{
    const std::size_t n = std::min(out.size(), buf_.size());
    std::copy_n(out.begin(), n, buf_.begin());
    len_ = n;
    done_ = 0;
    connect_err_ = 0;
    cause_ = {};
    why_[0] = '\0';
    reply_.reset();
    came_.reset();
    rings_.reset();
    // A client's HELLO says whether it takes rings (flags, byte 7).
    offered_rings_ =
        p == phase::connect && n > 7 && (std::to_integer<unsigned>(out[7]) & handshake_flag_ring) != 0;
    phase_ = p;
}

void connector::fail(std::error_code cause, const char* why, ...) noexcept
{
    std::va_list ap;
    va_start(ap, why);
    std::vsnprintf(why_.data(), why_.size(), why, ap);
    va_end(ap);
    cause_ = cause;
    phase_ = phase::failed;
}

connector::next connector::failed(std::error_code cause, const char* why) noexcept
{
    fail(cause, "%s", why);
    return next::failed;
}

connector::next connector::step(int fd) noexcept
{
    // A connection's cause is always rdmx's code (lib/errno_status.hpp): refused,
    // unreachable, timed out; ECONNRESET, a listener that closed (or died) during the
    // handshake, is peer_lost, which the endpoint redials.
    switch (phase_) {
    case phase::connect: {
        int err = 0;
        socklen_t len = sizeof err;
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err) {
            connect_err_ = err;
            return next::connect_failed;
        }
        // Connected? A socket still connecting is not writable yet, and has no peer.
        sockaddr_storage peer{};
        socklen_t plen = sizeof peer;
        if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) < 0)
            return next::wait_write;
        phase_ = phase::hello;
        [[fallthrough]];
    }
    case phase::hello:
        if (int err = send_rest(fd)) {
            if (err == EAGAIN)
                return next::wait_write;
            if (err > 0) {
                fail(detail::errc_of_errno(err), "sending HELLO: %s", std::strerror(err));
                return next::failed;
            }
            return failed(errc::disconnected, "sending HELLO: the listener closed the connection");
        }
        phase_ = phase::reply;
        done_ = 0;
        [[fallthrough]];
    case phase::reply: return read_reply(fd);
    case phase::accept:
        if (int err = send_rest(fd)) {
            if (err == EAGAIN)
                return next::wait_write;
            return failed(errc::disconnected, "the client left before the reply");
        }
        phase_ = phase::idle;
        return next::established;
    case phase::failed: return next::failed;
    case phase::idle: break;
    }
    return next::established;
}

connector::next connector::read_reply(int fd) noexcept
{
    // Exactly the reply: a frame the listener's engine sends after it stays for the engine.
    while (done_ < handshake::reply_size) {
        // The rings' memfd, if the listener grants them, comes with the first byte; one per
        // handshake (a second is closed).
        ssize_t n = recv_with_fd(fd, std::span(buf_.data() + done_, handshake::reply_size - done_), came_,
                                 MSG_DONTWAIT);
        if (n > 0) {
            done_ += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return next::wait_read;
        // Closed without a reply: the listener dropped the request.
        return failed(errc::rejected, "the listener closed the connection");
    }
    const std::span<const std::byte> in{buf_.data(), handshake::reply_size};
    reply_ = handshake::decode(in, false);
    if (!reply_) {
        if (auto v = handshake::peer_version(in); v && *v != protocol_version) {
            fail(errc::protocol_error, "the listener speaks wire protocol version %u, this side %u",
                 unsigned{*v}, unsigned{protocol_version});
            log_limited("connect: %s", why());
            return next::failed;
        }
        return failed(errc::protocol_error, "malformed handshake reply");
    }
    if (reply_->type == handshake_type::reject)
        return failed(errc::rejected, "rejected by the listener");
    if ((reply_->flags & handshake_flag_ring) != 0) {
        // Granted only on a UNIX socket, to a HELLO that offered them.
        if (!offered_rings_)
            return failed(errc::protocol_error, "the ACCEPT grants rings the HELLO did not offer");
        if (!came_)
            return failed(errc::protocol_error, "the ACCEPT grants rings but no memfd came with it");
        std::string why;
        rings_ = byte_ring_pair::adopt(came_.get(), why);
        came_.reset(); // the mapping stays
        if (!rings_) {
            fail(errc::protocol_error, "rings: %s", why.c_str());
            log_limited("connect: %s", why_.data());
            return next::failed;
        }
    }
    came_.reset(); // a memfd the ACCEPT did not announce is not used
    phase_ = phase::idle;
    return next::established;
}

int connector::send_rest(int fd) noexcept
{
    while (done_ < len_) {
        // The rings' memfd, with the reply's first byte.
        ssize_t n = send_with_fd(fd, std::span<const std::byte>(buf_.data() + done_, len_ - done_),
                                 pass_.get(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            pass_.reset(); // the client holds it now (the mapping here stays)
            done_ += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return EAGAIN;
        return n < 0 ? errno : -1;
    }
    return 0;
}

} // namespace rdmx::tcp
