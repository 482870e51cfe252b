// An endpoint service in the shape users write one (issue 26): one io_context thread, a
// coroutine that waits on the endpoint through endpoint_watch and nothing else polling it,
// receives posted outside that loop (from handlers posted to the io_context), peer events
// retiring dead clients; clients in processes of their own (tests/endpoint_peer rpc) that
// check every byte of every echo, two of them SIGKILLed mid-run, a flooder sending tags the
// service never asks for, and the server itself closed and opened again at the same address
// while the clients run. On tcp, rxe and siw. No re-arming or kicking of the watch by hand.
#include <gtest/gtest.h>

#include <rdmx/asio.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/child_process.hpp"
#include "common/endpoint_util.hpp"

namespace rdmx::test
{
namespace
{

namespace net = boost::asio;

constexpr std::uint64_t request_bit = 1ull << 63;
constexpr std::size_t slot_size = 320 * 1024; // the largest request (300 kB) fits
constexpr std::size_t request_slots = 12, sink_slots = 4, sink_size = 2048;

/// One incarnation of the echo service on an endpoint at a fixed address.
class echo_service
{
public:
    echo_service(net::io_context& io, domain& d, const std::string& address, const endpoint_options& o)
        : io_(io), ep_(endpoint::open(d, address, o)),
          mem_(request_slots * slot_size + sink_slots * sink_size),
          mr_(d.register_memory(mem_.data(), mem_.size(), access::local_write | access::remote_read)),
          watch_(io, *ep_)
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

    int served = 0, sunk = 0, peers_down = 0, peers_restarted = 0, reply_failures = 0;
    std::string error;

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
            if (c.status) { // truncated, say: the slot goes back
                later([this, s] { post_request(s); });
                return;
            }
            {
                // The echo: the request's bytes back to its source, with its tag.
                sge back{mr_.get(), s * slot_size, c.length};
                if (ep_->send(c.peer, c.tag, {&back, 1}, ctx(kind::reply, s))) {
                    ++reply_failures; // a peer removed meanwhile: the client asks again
                    later([this, s] { post_request(s); });
                }
            }
            return;
        case endpoint_op::send:
            if (c.status)
                ++reply_failures; // the client died or the connection ended: it asks again
            else
                ++served;
            // The slot's buffer is free again: its receive goes back, outside the loop.
            later([this, s] { post_request(s); });
            return;
        default: note(std::string("unexpected completion ") + to_string(c.op)); return;
        }
    }

    net::io_context& io_;
    std::unique_ptr<endpoint> ep_;
    std::vector<std::byte> mem_;
    std::unique_ptr<memory_region> mr_;
    rdmx::asio::endpoint_watch watch_;
    bool stopping_ = false, ended_ = false;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

class asio_endpoint_service : public ep_fixture
{
protected:
    std::uint16_t free_port()
    {
        auto e = open_ep();
        auto text = e.ep->address();
        return static_cast<std::uint16_t>(std::stoi(text.substr(text.rfind(':') + 1)));
    }
};

TEST_P(asio_endpoint_service, one_thread_serves_clients_that_die_a_flooder_and_its_own_restart)
{
    // Fewer processes under emulation (each client is an rdma_cm process in the guest).
    const bool verbs = b_ == backend::verbs;
    const int clients = verbs ? 6 : 12, requests = verbs ? 30 : 100;
    const std::uint16_t port = free_port();
    const std::string addr = address(b_, port);
    auto o = small_options();
    o.peer_events = true;
    net::io_context io;
    // Runs the service's one thread (this one) for a while; an io_context that ran out of
    // work (between two incarnations) must be restarted to run again.
    auto run = [&](std::chrono::milliseconds t) {
        io.restart();
        io.run_for(t);
    };
    auto svc = std::make_unique<echo_service>(io, *dom_, addr, o);
    const std::string program = sibling_program("endpoint_peer");

    std::vector<std::unique_ptr<child_process>> good, victims;
    for (int i = 0; i < clients; ++i)
        good.push_back(std::make_unique<child_process>(
            program, std::vector<std::string>{address(b_, 0), "rpc", addr, std::to_string(i + 1),
                                              std::to_string(requests)}));
    for (int i = 0; i < 2; ++i)
        victims.push_back(std::make_unique<child_process>(
            program,
            std::vector<std::string>{address(b_, 0), "rpc", addr, std::to_string(100 + i), "100000"}));
    // The flooder: on iWARP a receiver out of buffers ends connections (no receiver-not-
    // ready), and without per-peer credits (not built: docs/endpoints.md, "Completion
    // semantics") a flood there costs the other clients their connections over and over.
    const bool flood = !dom_->limits().iwarp;
    if (!flood)
        std::printf(
            "[ service  ] iWARP: no flooder (per-peer credits are not built; a flood ends other peers' "
            "connections there)\n");
    std::unique_ptr<child_process> flooder;
    if (flood)
        flooder = std::make_unique<child_process>(
            program, std::vector<std::string>{address(b_, 0), "flood", addr, "3000"});

    std::vector<int> progress(clients, 0), victim_progress(2, 0);
    std::vector<bool> finished(clients, false);
    auto read_progress = [](child_process& c, int& count, bool* done) {
        for (char ch : c.read_available()) {
            if (ch == '.')
                ++count;
            else if (ch == 'D' && done)
                *done = true;
        }
    };
    bool killed = false, restarted = false;
    int downs_before_restart = 0;
    const auto deadline = std::chrono::steady_clock::now() + 240s;
    auto all_done = [&] { return std::all_of(finished.begin(), finished.end(), [](bool f) { return f; }); };
    while (!all_done() && std::chrono::steady_clock::now() < deadline) {
        run(2ms); // short slices: the kills and the restart must land while clients run
        int total = 0;
        for (int i = 0; i < clients; ++i) {
            bool d = finished[static_cast<std::size_t>(i)];
            read_progress(*good[static_cast<std::size_t>(i)], progress[static_cast<std::size_t>(i)], &d);
            finished[static_cast<std::size_t>(i)] = d;
            total += progress[static_cast<std::size_t>(i)];
        }
        for (int v = 0; v < 2; ++v)
            read_progress(*victims[static_cast<std::size_t>(v)], victim_progress[static_cast<std::size_t>(v)],
                          nullptr);
        // Mid-run: the two victims are killed once each has had some requests served.
        if (!killed && victim_progress[0] >= 3 && victim_progress[1] >= 3) {
            for (auto& v : victims)
                v->kill();
            killed = true;
        }
        // Then, once the service has retired both (peer_down), the server goes away and
        // comes back at the same address, clients running.
        if (killed && !restarted && svc->peers_down >= 2 && total >= clients * requests / 3) {
            svc->stop();
            while (!svc->stopped())
                run(5ms);
            downs_before_restart = svc->peers_down;
            EXPECT_TRUE(svc->error.empty()) << svc->error;
            std::printf(
                "[ service  ] %s: first incarnation served %d, sank %d, %d peers down, %d reply failures\n",
                to_string(b_), svc->served, svc->sunk, svc->peers_down, svc->reply_failures);
            svc.reset();
            svc = std::make_unique<echo_service>(io, *dom_, addr, o);
            restarted = true;
        }
    }
    for (int i = 0; i < clients; ++i)
        EXPECT_TRUE(finished[static_cast<std::size_t>(i)])
            << "client " << i + 1 << ": " << progress[static_cast<std::size_t>(i)] << " of " << requests;
    EXPECT_TRUE(killed) << "the victims never got going";
    EXPECT_TRUE(restarted) << "the server was never restarted";
    EXPECT_GE(downs_before_restart, 2) << "the killed clients were not reported as peer_down";
    EXPECT_TRUE(svc->error.empty()) << svc->error;
    std::printf("[ service  ] %s: second incarnation served %d, sank %d, %d peers down, %d reply failures\n",
                to_string(b_), svc->served, svc->sunk, svc->peers_down, svc->reply_failures);
    EXPECT_GT(svc->served, 0) << "the restarted server served nothing";
    for (auto& c : good)
        EXPECT_EQ(c->wait(), 0) << "a client failed (its stderr says why)";
    if (flooder)
        flooder->kill();
    svc->stop();
    while (!svc->stopped())
        run(5ms);
}

INSTANTIATE_TEST_SUITE_P(backends, asio_endpoint_service, testing::ValuesIn(selected_backends()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(asio_endpoint_service);

} // namespace
} // namespace rdmx::test
