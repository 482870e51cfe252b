// Asio and C++20 coroutines for rdmx: wait for completions, connection requests and
// connection events through a boost::asio::io_context, as spead2 waits on its completion
// channel. Header-only, and the one public header of rdmx that includes Boost.Asio (it is
// not part of rdmx/rdmx.hpp): include it where the application uses Asio.
//
// Two forms:
// - Watches, Asio I/O objects with completion tokens (a callback, use_awaitable,
//   use_future, ...): completion_watch (a connection or a completion_queue),
//   listener_watch, event_watch, endpoint_watch. Each watches one rdmx file descriptor
//   through an io_context, keeps it registered between waits, and can be cancelled
//   (cancel(), which a timer makes a timeout).
// - Awaitables: co_await rdmx::asio::async_poll(conn, out), async_poll(cq, out),
//   async_poll(events, out), async_poll(endpoint, out), async_get_request(listener), each
//   also with a timeout. They poll first and only register the descriptor (for that one
//   wait) when there is nothing.
//
// Threading rule: ONE thread runs the io_context (io.run() on one thread), and that thread
// is the data-path thread of every connection and queue waited on through it: it posts,
// polls, arms and waits; no other thread touches them. Asio's reactor is edge-triggered,
// and Boost 1.74's async_wait cannot see readiness that came before it started: a watch
// checks the descriptor with poll(2) before waiting, which is exact only when no other
// thread runs the reactor between that check and the wait. Coroutines on that one thread
// may serve as many connections as they like (one watch per descriptor at a time).
//
// The descriptors stay rdmx's: a watch never closes one (it releases it from Asio when
// destroyed, which also ends a pending wait with operation_aborted). Destroy watches before
// the rdmx object they watch and before their io_context, as any Asio I/O object; a
// coroutine left suspended in a wait is destroyed with its io_context, and so is its watch.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

// Boost 1.74 looks for clang's coroutines only in <experimental/coroutine>, which libstdc++
// lacks; clang has the C++20 ones, which Asio then uses (BOOST_ASIO_HAS_STD_COROUTINE).
#if defined(__clang__) && defined(__cpp_impl_coroutine) && !defined(BOOST_ASIO_HAS_CO_AWAIT)
#define BOOST_ASIO_HAS_CO_AWAIT 1
#endif

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/system_error.hpp>

#include <rdmx/connection.hpp>
#include <rdmx/endpoint.hpp>
#include <rdmx/error.hpp>
#include <rdmx/queues.hpp>

namespace rdmx::asio
{

namespace net = boost::asio;

namespace detail
{

/// A boost::system category that reads as a std one (Boost 1.74's error_code cannot hold a
/// std::error_code), for rdmx's own codes.
class std_category final : public boost::system::error_category
{
public:
    explicit std_category(const std::error_category& cat) noexcept : cat_(cat) {}
    const char* name() const noexcept override { return cat_.name(); }
    std::string message(int ev) const override { return cat_.message(ev); }

private:
    const std::error_category& cat_;
};

/// What an rdmx call returned, as Asio's handlers take it.
inline boost::system::error_code to_boost(const std::error_code& ec) noexcept
{
    if (!ec)
        return {};
    if (ec.category() == std::system_category())
        return {ec.value(), boost::system::system_category()};
    if (ec.category() == std::generic_category())
        return {ec.value(), boost::system::generic_category()};
    if (ec.category() == rdmx::category()) {
        static const std_category rdmx_cat(rdmx::category());
        return {ec.value(), rdmx_cat};
    }
    return {EIO, boost::system::system_category()};
}

/// One rdmx descriptor registered with an io_context and never owned: released, not
/// closed, when the watch goes.
class fd_watch
{
public:
    using executor_type = net::any_io_executor;

    fd_watch(const executor_type& ex, int fd, const char* what) : sd_(ex)
    {
        if (fd < 0) // a connection whose completions all go to shared queues: watch those
            throw rdmx::error(rdmx::errc::invalid_argument,
                              std::string(what) + ": no file descriptor to wait on");
        sd_.assign(fd);
    }
    ~fd_watch()
    {
        if (sd_.is_open())
            sd_.release(); // ends a pending wait (operation_aborted) and deregisters; no close
    }
    fd_watch(const fd_watch&) = delete;
    fd_watch& operator=(const fd_watch&) = delete;

    executor_type get_executor() noexcept { return sd_.get_executor(); }
    void cancel() noexcept
    {
        boost::system::error_code ignored;
        sd_.cancel(ignored);
    }

    /// Completes (never inline) once the descriptor is readable: at once if it already is.
    template <class Token> auto async_wait(Token&& token)
    {
        return net::async_compose<Token, void(boost::system::error_code)>(
            [this, started = false,
             result = boost::system::error_code()](auto& self, boost::system::error_code ec = {}) mutable {
                if (started) {
                    self.complete(result ? result : ec);
                    return;
                }
                started = true;
                pollfd p{sd_.native_handle(), POLLIN, 0};
                if (::poll(&p, 1, 0) != 0) {
                    // Readable already, so no edge may come (or the descriptor is bad).
                    if (p.revents & POLLNVAL)
                        result = net::error::bad_descriptor;
                    net::post(sd_.get_executor(), std::move(self));
                    return;
                }
                sd_.async_wait(net::posix::descriptor_base::wait_read, std::move(self));
            },
            token, sd_);
    }

private:
    net::posix::stream_descriptor sd_;
};

} // namespace detail

/// Waits for the completions of a connection (its completion_fd()) or of a completion_queue
/// (its fd()) through an io_context: the event-mode sequence of connection::wait() without
/// a blocked thread. A connection whose sides both report to shared completion queues has
/// no completion_fd(): watch the queues (the constructor throws errc::invalid_argument).
class completion_watch
{
public:
    using executor_type = net::any_io_executor;

    completion_watch(const executor_type& ex, rdmx::connection& conn)
        : conn_(&conn), fd_(ex, conn.completion_fd(), "connection::completion_fd")
    {
    }
    completion_watch(const executor_type& ex, rdmx::completion_queue& cq)
        : cq_(&cq), fd_(ex, cq.fd(), "completion_queue::fd")
    {
    }
    template <class Context,
              class = std::enable_if_t<std::is_convertible_v<Context&, net::execution_context&>>>
    completion_watch(Context& ctx, rdmx::connection& conn) : completion_watch(ctx.get_executor(), conn)
    {
    }
    template <class Context,
              class = std::enable_if_t<std::is_convertible_v<Context&, net::execution_context&>>>
    completion_watch(Context& ctx, rdmx::completion_queue& cq) : completion_watch(ctx.get_executor(), cq)
    {
    }

    executor_type get_executor() noexcept { return fd_.get_executor(); }

    /// Moves completions into `out`, waiting until there is at least one: polls; if
    /// nothing is there, arms (request_notify), polls again to close the race, waits for
    /// the descriptor, acknowledges (ack_notify) and polls. Handler: void(error_code,
    /// std::size_t n), n > 0 on success; operation_aborted after cancel() or when the watch
    /// is destroyed (completions that arrived stay for the next poll). Never completes
    /// inline. One wait at a time.
    template <class Token> auto async_poll(std::span<rdmx::completion> out, Token&& token)
    {
        return net::async_compose<Token, void(boost::system::error_code, std::size_t)>(poll_op{this, out},
                                                                                       token, fd_);
    }

    /// Ends a pending async_poll with operation_aborted.
    void cancel() noexcept { fd_.cancel(); }

private:
    std::size_t poll(std::span<rdmx::completion> out) noexcept
    {
        return conn_ ? conn_->poll(out) : cq_->poll(out);
    }
    std::error_code request_notify() noexcept
    {
        return conn_ ? conn_->request_notify() : cq_->request_notify();
    }
    std::error_code ack_notify() noexcept { return conn_ ? conn_->ack_notify() : cq_->ack_notify(); }

    struct poll_op {
        completion_watch* w;
        std::span<rdmx::completion> out;
        enum { start, waiting, posted } step = start;
        bool initiating = true;
        std::size_t n = 0;
        boost::system::error_code result{};

        template <class Self> void operator()(Self& self, boost::system::error_code ec = {})
        {
            if (step == posted) {
                self.complete(result, n);
                return;
            }
            if (step == waiting) {
                if (ec) {
                    self.complete(ec, 0);
                    return;
                }
                if (auto e = w->ack_notify()) {
                    self.complete(detail::to_boost(e), 0);
                    return;
                }
            }
            // Woken, or starting: poll, and if nothing is there, arm and wait.
            if (!(n = w->poll(out))) {
                if (auto e = w->request_notify())
                    result = detail::to_boost(e);
                else if (!(n = w->poll(out))) { // a completion that came before arming raises no event
                    step = waiting;
                    initiating = false;
                    w->fd_.async_wait(std::move(self));
                    return;
                }
            }
            if (initiating) { // a handler is never called from inside async_poll
                step = posted;
                net::post(w->fd_.get_executor(), std::move(self));
                return;
            }
            self.complete(result, n);
        }
    };

    rdmx::connection* conn_ = nullptr;
    rdmx::completion_queue* cq_ = nullptr;
    detail::fd_watch fd_;
};

/// Waits for connection requests of a listener (its fd()) through an io_context.
class listener_watch
{
public:
    using executor_type = net::any_io_executor;

    listener_watch(const executor_type& ex, rdmx::listener& l) : l_(l), fd_(ex, l.fd(), "listener::fd") {}
    template <class Context,
              class = std::enable_if_t<std::is_convertible_v<Context&, net::execution_context&>>>
    listener_watch(Context& ctx, rdmx::listener& l) : listener_watch(ctx.get_executor(), l)
    {
    }

    executor_type get_executor() noexcept { return fd_.get_executor(); }

    /// Takes the next connection request (get_request(0ms)), waiting until there is one.
    /// Handler: void(error_code, std::unique_ptr<connection_request>), never null on
    /// success; operation_aborted after cancel(); an rdmx::error of get_request as its code.
    /// Never completes inline. One wait at a time.
    template <class Token> auto async_get_request(Token&& token)
    {
        return net::async_compose<Token,
                                  void(boost::system::error_code, std::unique_ptr<rdmx::connection_request>)>(
            request_op{this}, token, fd_);
    }

    void cancel() noexcept { fd_.cancel(); }

private:
    struct request_op {
        listener_watch* w;
        bool initiating = true;
        bool posted = false;
        std::unique_ptr<rdmx::connection_request> req{};
        boost::system::error_code result{};

        template <class Self> void operator()(Self& self, boost::system::error_code ec = {})
        {
            if (!posted) {
                if (!initiating && ec) {
                    self.complete(ec, nullptr);
                    return;
                }
                try {
                    req = w->l_.get_request(std::chrono::milliseconds(0));
                } catch (const std::system_error& e) {
                    result = detail::to_boost(e.code());
                }
                if (!req && !result) {
                    initiating = false;
                    w->fd_.async_wait(std::move(self));
                    return;
                }
                if (initiating) {
                    posted = true;
                    net::post(w->fd_.get_executor(), std::move(self));
                    return;
                }
            }
            self.complete(result, std::move(req));
        }
    };

    rdmx::listener& l_;
    detail::fd_watch fd_;
};

namespace detail
{
inline const char* fd_name(const rdmx::event_queue*) noexcept
{
    return "event_queue::fd";
}
inline const char* fd_name(const rdmx::endpoint*) noexcept
{
    return "endpoint::fd";
}
} // namespace detail

/// Waits for a source whose fd() is level-triggered and whose poll() does the work
/// (an event_queue: its events; an endpoint: its completions, after its progress) through
/// an io_context. Used as event_watch and endpoint_watch.
template <class Source, class Item> class level_watch
{
public:
    using executor_type = net::any_io_executor;

    level_watch(const executor_type& ex, Source& s) : s_(s), fd_(ex, s.fd(), detail::fd_name(&s)) {}
    template <class Context,
              class = std::enable_if_t<std::is_convertible_v<Context&, net::execution_context&>>>
    level_watch(Context& ctx, Source& s) : level_watch(ctx.get_executor(), s)
    {
    }

    executor_type get_executor() noexcept { return fd_.get_executor(); }

    /// Moves items into `out`, waiting until there is at least one: polls; if nothing is
    /// there, waits for the descriptor and polls again (a wake-up with nothing to return,
    /// which an endpoint may have, waits again). Handler: void(error_code, std::size_t n),
    /// n > 0 on success; operation_aborted after cancel(). Never completes inline. One
    /// wait at a time.
    template <class Token> auto async_poll(std::span<Item> out, Token&& token)
    {
        return net::async_compose<Token, void(boost::system::error_code, std::size_t)>(poll_op{this, out},
                                                                                       token, fd_);
    }

    void cancel() noexcept { fd_.cancel(); }

private:
    struct poll_op {
        level_watch* w;
        std::span<Item> out;
        bool initiating = true;
        bool posted = false;
        std::size_t n = 0;

        template <class Self> void operator()(Self& self, boost::system::error_code ec = {})
        {
            if (!posted) {
                if (!initiating && ec) {
                    self.complete(ec, 0);
                    return;
                }
                if (!(n = w->s_.poll(out))) {
                    initiating = false;
                    w->fd_.async_wait(std::move(self));
                    return;
                }
                if (initiating) {
                    posted = true;
                    net::post(w->fd_.get_executor(), std::move(self));
                    return;
                }
            }
            self.complete(boost::system::error_code(), n);
        }
    };

    Source& s_;
    detail::fd_watch fd_;
};

/// Waits for the events of an event_queue (its fd()) through an io_context.
using event_watch = level_watch<rdmx::event_queue, rdmx::event>;
/// Waits for an endpoint's completions (its fd()) through an io_context; each wake-up runs
/// the endpoint's progress (endpoint::poll), so nothing else needs to poll it.
using endpoint_watch = level_watch<rdmx::endpoint, rdmx::endpoint_completion>;

// --- Awaitables -------------------------------------------------------------------------
// For coroutines on the io_context's one thread (co_spawn(io, ..., detached)). Each polls
// first and returns at once when there is something; otherwise it watches the descriptor
// for this one wait. Failures throw boost::system::system_error, as use_awaitable does.
// The forms with a timeout return 0 (or nullptr) when it expires.

namespace detail
{

/// `wait(watch, ec)` with `ec` set to operation_aborted when `timeout` expires first.
template <class Result, class Watch, class Wait>
net::awaitable<Result> with_timeout(std::shared_ptr<Watch> w, std::chrono::steady_clock::duration timeout,
                                    Wait wait)
{
    // The timer's handler holds the watch weakly: after a wait that ended first it has
    // nothing to touch, whenever it runs.
    net::steady_timer timer(w->get_executor(), timeout);
    timer.async_wait([weak = std::weak_ptr<Watch>(w)](const boost::system::error_code& ec) {
        if (!ec)
            if (auto live = weak.lock())
                live->cancel();
    });
    boost::system::error_code ec;
    auto got = co_await wait(*w, ec);
    timer.cancel();
    if (ec && ec != net::error::operation_aborted)
        throw boost::system::system_error(ec);
    co_return got;
}

template <class Queue> net::awaitable<std::size_t> poll_completions(Queue& q, std::span<rdmx::completion> out)
{
    if (auto n = q.poll(out))
        co_return n;
    completion_watch w(co_await net::this_coro::executor, q);
    co_return co_await w.async_poll(out, net::use_awaitable);
}

template <class Queue>
net::awaitable<std::size_t> poll_completions(Queue& q, std::span<rdmx::completion> out,
                                             std::chrono::steady_clock::duration timeout)
{
    if (auto n = q.poll(out))
        co_return n;
    auto w = std::make_shared<completion_watch>(co_await net::this_coro::executor, q);
    co_return co_await with_timeout<std::size_t>(
        w, timeout, [out](completion_watch& cw, boost::system::error_code& ec) {
            return cw.async_poll(out, net::redirect_error(net::use_awaitable, ec));
        });
}

} // namespace detail

/// Completions of `conn` into `out`: at least one.
inline net::awaitable<std::size_t> async_poll(rdmx::connection& conn, std::span<rdmx::completion> out)
{
    return detail::poll_completions(conn, out);
}
/// Completions of `conn` into `out`, waiting up to `timeout`; 0 when it expired.
inline net::awaitable<std::size_t> async_poll(rdmx::connection& conn, std::span<rdmx::completion> out,
                                              std::chrono::steady_clock::duration timeout)
{
    return detail::poll_completions(conn, out, timeout);
}
/// Completions of the connections of `cq` into `out`: at least one.
inline net::awaitable<std::size_t> async_poll(rdmx::completion_queue& cq, std::span<rdmx::completion> out)
{
    return detail::poll_completions(cq, out);
}
/// As above, waiting up to `timeout`; 0 when it expired.
inline net::awaitable<std::size_t> async_poll(rdmx::completion_queue& cq, std::span<rdmx::completion> out,
                                              std::chrono::steady_clock::duration timeout)
{
    return detail::poll_completions(cq, out, timeout);
}

namespace detail
{
template <class Source, class Item> net::awaitable<std::size_t> poll_level(Source& s, std::span<Item> out)
{
    if (auto n = s.poll(out))
        co_return n;
    level_watch<Source, Item> w(co_await net::this_coro::executor, s);
    co_return co_await w.async_poll(out, net::use_awaitable);
}

template <class Source, class Item>
net::awaitable<std::size_t> poll_level(Source& s, std::span<Item> out,
                                       std::chrono::steady_clock::duration timeout)
{
    if (auto n = s.poll(out))
        co_return n;
    using watch = level_watch<Source, Item>;
    auto w = std::make_shared<watch>(co_await net::this_coro::executor, s);
    co_return co_await with_timeout<std::size_t>(w, timeout, [out](watch& lw, boost::system::error_code& ec) {
        return lw.async_poll(out, net::redirect_error(net::use_awaitable, ec));
    });
}
} // namespace detail

/// Events of `q` into `out`: at least one.
inline net::awaitable<std::size_t> async_poll(rdmx::event_queue& q, std::span<rdmx::event> out)
{
    return detail::poll_level(q, out);
}
/// As above, waiting up to `timeout`; 0 when it expired.
inline net::awaitable<std::size_t> async_poll(rdmx::event_queue& q, std::span<rdmx::event> out,
                                              std::chrono::steady_clock::duration timeout)
{
    return detail::poll_level(q, out, timeout);
}

/// Completions of endpoint `ep` into `out` (its progress runs meanwhile): at least one.
inline net::awaitable<std::size_t> async_poll(rdmx::endpoint& ep, std::span<rdmx::endpoint_completion> out)
{
    return detail::poll_level(ep, out);
}
/// As above, waiting up to `timeout`; 0 when it expired.
inline net::awaitable<std::size_t> async_poll(rdmx::endpoint& ep, std::span<rdmx::endpoint_completion> out,
                                              std::chrono::steady_clock::duration timeout)
{
    return detail::poll_level(ep, out, timeout);
}

/// The next connection request of `l` (never null).
inline net::awaitable<std::unique_ptr<rdmx::connection_request>> async_get_request(rdmx::listener& l)
{
    if (auto req = l.get_request(std::chrono::milliseconds(0)))
        co_return req;
    listener_watch w(co_await net::this_coro::executor, l);
    co_return co_await w.async_get_request(net::use_awaitable);
}
/// As above, waiting up to `timeout`; nullptr when it expired.
inline net::awaitable<std::unique_ptr<rdmx::connection_request>>
async_get_request(rdmx::listener& l, std::chrono::steady_clock::duration timeout)
{
    if (auto req = l.get_request(std::chrono::milliseconds(0)))
        co_return req;
    auto w = std::make_shared<listener_watch>(co_await net::this_coro::executor, l);
    co_return co_await detail::with_timeout<std::unique_ptr<rdmx::connection_request>>(
        w, timeout, [](listener_watch& lw, boost::system::error_code& ec) {
            return lw.async_get_request(net::redirect_error(net::use_awaitable, ec));
        });
}

} // namespace rdmx::asio
