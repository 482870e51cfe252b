// The endpoint echo service of rdmx_ep_service (asio_ep_service.cpp), in the shape services are
// written: one io_context thread; one coroutine that waits on the endpoint through
// rdmx::asio::endpoint_watch, and nothing else polls it; receives posted from handlers
// outside that loop; peer events (endpoint_options::peer_events) retiring clients that died.
// Every tag with bit 63 set is a request, echoed to its source with its tag; every other
// tag is taken into a small sink and dropped (what a flooder or a confused client sends).
// tests/asio_endpoint_service_test.cpp runs it against clients that die, a flooder and its
// own restart, on tcp, rxe and siw.
#pragma once

#include <rdmx/asio.hpp>
#include <rdmx/rdmx.hpp>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace ep_service
{

namespace net = boost::asio;
using rdmx::access;
using rdmx::any_peer;
using rdmx::domain;
using rdmx::endpoint;
using rdmx::endpoint_completion;
using rdmx::endpoint_op;
using rdmx::endpoint_options;
using rdmx::memory_region;
using rdmx::sge;

constexpr std::uint64_t request_bit = 1ull << 63;
constexpr std::size_t slot_size = 320 * 1024; // the largest request (300 kB) fits
constexpr std::size_t request_slots = 12, sink_slots = 4, sink_size = 2048;

/// One incarnation of the echo service, on an endpoint at `address` (its port may be 0).
class echo_service
{
public:
    echo_service(net::io_context& io, domain& d, const std::string& address, const endpoint_options& o)
        : io_(io), mem_(request_slots * slot_size + sink_slots * sink_size),
          mr_(d.register_memory(mem_.data(), mem_.size(), access::local_write | access::remote_read)),
          ep_(endpoint::open(d, address, o)), watch_(io, *ep_)
    {
        // A few receives now; the rest from a handler, as an application that fills its
        // receives from elsewhere than its progress loop.
        for (std::size_t s = 0; s < 2; ++s)
            post_request(s);
        later([this] {
            for (std::size_t s = 2; s < request_slots; ++s)
                post_request(s);
            for (std::size_t s = 0; s < sink_slots; ++s)
                post_sink(s);
        });
        net::co_spawn(io_, serve(), net::detached);
    }
    ~echo_service() { *alive_ = false; } // handlers still queued do nothing
    /// Stops the loop; the endpoint goes once it has (its coroutine ended).
    void stop()
    {
        stopping_ = true;
        watch_.cancel();
    }
    bool stopped() const { return ended_; }
    /// The endpoint's address, as peers reach it (the port chosen, if 0 was asked).
    std::string address() const { return ep_->address(); }

    int served = 0, sunk = 0, peers_down = 0, peers_restarted = 0, reply_failures = 0;
    std::string error;

    /// What its request slots are doing and what its endpoint holds: for a test that
    /// failed, to say where requests stopped.
    std::string describe() const
    {
        std::size_t posted = 0, replying = 0, idle = 0;
        for (auto st : slot_state_)
            (st == slot::posted ? posted : st == slot::replying ? replying : idle) += 1;
        const auto s = ep_->statistics();
        return "slots: " + std::to_string(posted) + " receiving, " + std::to_string(replying) +
               " replying, " + std::to_string(idle) + " between; endpoint: " + std::to_string(s.peers) +
               " peers, " + std::to_string(s.connected) + " connected, " + std::to_string(s.connecting) +
               " connecting, " + std::to_string(s.unexpected) + " messages held";
    }

private:
    // Contexts: a request slot's receive or reply, a sink slot's receive.
    enum class kind : std::uint64_t { request = 1, reply = 2, sink = 3 };
    static std::uint64_t ctx(kind k, std::size_t s) { return static_cast<std::uint64_t>(k) << 56 | s; }

    void post_request(std::size_t s)
    {
        sge r{mr_.get(), s * slot_size, slot_size};
        // Every tag with bit 63 set: the requests.
        if (auto ec = ep_->recv(any_peer, request_bit, ~request_bit, {&r, 1}, ctx(kind::request, s)))
            note("recv: " + ec.message());
        else
            slot_state_[s] = slot::posted;
    }
    void post_sink(std::size_t s)
    {
        sge r{mr_.get(), request_slots * slot_size + s * sink_size, sink_size};
        // Every tag with bit 63 clear: what a flooder sends, taken and dropped.
        if (auto ec = ep_->recv(any_peer, 0, ~request_bit, {&r, 1}, ctx(kind::sink, s)))
            note("sink recv: " + ec.message());
    }
    /// Runs `f` from the io_context later, outside the loop that polls (if still alive).
    template <class F> void later(F f)
    {
        net::post(io_, [alive = alive_, f = std::move(f)] {
            if (*alive)
                f();
        });
    }
    void note(const std::string& what)
    {
        if (error.empty())
            error = what;
    }

    net::awaitable<void> serve()
    {
        endpoint_completion out[32];
        while (!stopping_) {
            std::size_t n = 0;
            try {
                n = co_await watch_.async_poll(out, net::use_awaitable);
            } catch (const boost::system::system_error&) {
                break; // canceled: stop()
            }
            for (std::size_t i = 0; i < n; ++i)
                on_completion(out[i]);
        }
        ended_ = true;
    }

    void on_completion(const endpoint_completion& c)
    {
        const auto k = static_cast<kind>(c.context >> 56);
        const std::size_t s = c.context & 0xffffffff;
        switch (c.op) {
        case endpoint_op::peer_down:
            // A client that died: retire it (its handle goes stale; a new incarnation at its
            // address gets a new one when it makes contact).
            ++peers_down;
            ep_->remove(c.peer);
            return;
        case endpoint_op::peer_restarted: ++peers_restarted; return;
        case endpoint_op::recv:
            if (k == kind::sink) {
                ++sunk;
                later([this, s] { post_sink(s); });
                return;
            }
            slot_state_[s] = slot::between;
            if (c.status) { // truncated, say: the slot goes back
                later([this, s] { post_request(s); });
                return;
            }
            {
                // The echo: the request's bytes back to its source, with its tag.
                sge back{mr_.get(), s * slot_size, c.length};
                slot_state_[s] = slot::replying;
                if (ep_->send(c.peer, c.tag, {&back, 1}, ctx(kind::reply, s))) {
                    ++reply_failures; // a peer removed meanwhile: the client asks again
                    slot_state_[s] = slot::between;
                    later([this, s] { post_request(s); });
                }
            }
            return;
        case endpoint_op::send:
            if (c.status)
                ++reply_failures; // the client died or the connection ended: it asks again
            else
                ++served;
            slot_state_[s] = slot::between;
            // The slot's buffer is free again: its receive goes back, outside the loop.
            later([this, s] { post_request(s); });
            return;
        default: note(std::string("unexpected completion ") + to_string(c.op)); return;
        }
    }

    net::io_context& io_;
    // The memory before the endpoint, so that it goes after it: a stopped service may have a
    // reply out whose receiver is still reading it, and a provider may go on serving a read
    // it started after the region's deregistration (siw does), so the bytes must stay as
    // they are until the endpoint's connections are gone. (Freed first, malloc's own list
    // pointers once landed in byte 0 of an echo in flight.)
    std::vector<std::byte> mem_;
    std::unique_ptr<memory_region> mr_;
    std::unique_ptr<endpoint> ep_;
    rdmx::asio::endpoint_watch watch_;
    enum class slot : std::uint8_t { between, posted, replying };
    std::array<slot, request_slots> slot_state_{};
    bool stopping_ = false, ended_ = false;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

} // namespace ep_service
