// Driving the handshake on the engine thread: the connector (tcp_connector.hpp) does each
// step on the socket; here its readiness waits on the connection's descriptor, the next
// address a name resolved to while connect() fails, one timer for the whole, and the start
// of the data path. No thread blocks for it: start_connect's application sees
// `connecting`, then the event; a blocking connect() is the same flow and a wait
// (await_handshake). start_accept's server side sends its reply the same way.
#include <sys/socket.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <boost/asio/post.hpp>

#include "errno_status.hpp"
#include "tcp/tcp_engine.hpp"

namespace rdmx::tcp
{

void connection_engine::start_client(std::span<const std::byte> hello, clock::time_point deadline,
                                     int connect_err, dial_plan rest)
{
    {
        engine_lock lk(mu_);
        hs_.dial() = std::move(rest);
    }
    start_handshake(connector::phase::connect, hello, deadline, connect_err);
}

void connection_engine::start_server(std::span<const std::byte> reply, clock::time_point deadline)
{
    start_handshake(connector::phase::accept, reply, deadline, 0);
}

void connection_engine::start_handshake(connector::phase p, std::span<const std::byte> out,
                                        clock::time_point deadline, int connect_err)
{
    // deregister() must reach this connection's frame on the wire, as start()'s (before,
    // connections started here were never tracked: a region deregistered under one of
    // their frames let the peer read other bytes for it).
    dom_.track(weak_from_this());
    engine_lock lk(mu_);
    hs_.begin(p, out);
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
            if (self->state() == connection_state::connecting) {
                self->hs_.fail(errc::timed_out, "no answer within connection_options::timeout");
                self->handshake_failed();
            }
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
        if (!hs_.owns_socket())
            return; // established (and perhaps ended since)
        if (hs_.current() != connector::phase::failed)
            throw error(make_error_code(errc::timed_out), text("the handshake did not end"));
        why = hs_.why();
    }
    cause = last_error();
    std::vector<std::byte> pdata;
    if (cause == errc::rejected)
        pdata.assign(peer_private_data().begin(), peer_private_data().end());
    throw error(cause ? cause : make_error_code(errc::disconnected), text(why), std::move(pdata));
}

void connection_engine::connect_failed(int err) noexcept
{
    if (is_unix_socket(fd_))
        hs_.dial().local_error = err; // an auto:// client's try of the UNIX socket
    if (redial(err)) {
        handshake_wait(asio::posix::stream_descriptor::wait_write);
        return;
    }
    hs_.fail(detail::errc_of_errno(err), "connect(): %s", std::strerror(err));
    handshake_failed();
}

bool connection_engine::redial(int& err) noexcept
{
    connector::dial_plan& dial = hs_.dial();
    while (!dial.addrs.empty()) {
        const detail::socket_address a = dial.addrs.front();
        dial.addrs.erase(dial.addrs.begin());
        unique_fd fd(::socket(a.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!fd) {
            err = errno;
            continue;
        }
        try {
            set_socket_options(fd.get());
            set_congestion_control(fd.get(), dial.congestion); // worked on the first socket
        } catch (const std::exception&) {
            err = errno ? errno : EINVAL;
            continue;
        }
        if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) < 0 &&
            errno != EINPROGRESS) {
            err = errno;
            if (a.addr.ss_family == AF_UNIX)
                dial.local_error = err;
            continue;
        }
        // The reactor and the domain's progress set know the socket by number and by open
        // file: each lets the old one go before dup3 replaces it, and takes the new.
        const bool queues = membership_.reaches() && !detached_;
        if (queues)
            for (domain_progress* p : progresses())
                if (p)
                    p->unwatch(fd_);
        [[maybe_unused]] int same = desc_.release(); // no wait is outstanding (a step runs)
        int rc = ::dup3(fd.get(), fd_, O_CLOEXEC);
        boost::system::error_code ec;
        desc_.assign(fd_, ec);
        if (rc < 0 || ec) {
            err = rc < 0 ? errno : ec.value();
            if (queues)
                membership_.refused();
            return false;
        }
        if (queues)
            for (domain_progress* p : progresses())
                if (p && !p->watch(*this, fd_)) {
                    err = errno; // the sets may hold it in part: close_socket unwatches (membership_ says so)
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
    switch (hs_.step(fd_)) {
    case connector::next::wait_read: handshake_wait(asio::posix::stream_descriptor::wait_read); return;
    case connector::next::wait_write: handshake_wait(asio::posix::stream_descriptor::wait_write); return;
    case connector::next::connect_failed: connect_failed(hs_.connect_error()); return;
    case connector::next::failed:
        if (const auto& r = hs_.reply()) // a REJECT: its private data is the application's
            peer_pdata_.assign(r->data().begin(), r->data().end());
        handshake_failed();
        return;
    case connector::next::established:
        if (const auto& r = hs_.reply()) { // the client: what the listener's ACCEPT says
            peer_pdata_.assign(r->data().begin(), r->data().end());
            max_rd_out_ = std::max<std::uint32_t>(1, std::min(lim_.max_rd_atomic, r->max_rd_atomic));
            lim_.max_rd_atomic = max_rd_out_; // limits(): what the connection got (before `established`)
            goodbye_ = (r->flags & handshake_flag_goodbye) != 0 ? goodbye::promised : goodbye::not_promised;
        }
        begin_established();
        return;
    }
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

void connection_engine::handshake_failed() noexcept
{
    rx_state_ = rx_state::done;
    tx_.shut();
    handshake_timer_.cancel();
    fail(connection_state::error, hs_.cause());
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
    settle_transport(); // before anyone sees `established` (backend())
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
