// An endpoint service in the shape users write one (issue 26): one io_context thread, a
// coroutine that waits on the endpoint through endpoint_watch and nothing else polling it,
// receives posted outside that loop (from handlers posted to the io_context), peer events
// retiring dead clients; clients in processes of their own (tests/endpoint_peer rpc) that
// check every byte of every echo, two of them SIGKILLed mid-run, a flooder sending tags the
// service never asks for, and the server itself closed and opened again at the same address
// while the clients run. On tcp, rxe and siw. No re-arming or kicking of the watch by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "common/child_process.hpp"
#include "common/endpoint_util.hpp"
#include "common/guest_state.hpp"
#include "samples/asio_ep_service.hpp" // the service under test is the sample's

namespace rdmx::test
{
namespace
{

namespace net = boost::asio;
using ep_service::echo_service;

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
    // 16 client processes on every provider, as the object store ran: 13 that must
    // finish, 2 killed mid-run, 1 flooder. Fewer requests each under emulation.
    const bool verbs = b_ == backend::verbs;
    const int clients = 13, requests = verbs ? 30 : 100;
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
    // The flooder, on every provider: credits hold it to its share of the receive buffers,
    // so it neither ends other clients' connections (iWARP) nor holds their messages back.
    auto flooder = std::make_unique<child_process>(
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
    // The siw flake of docs/endpoints.md ("Dials refused for good after a restart"): a
    // client that makes no progress for this long gets the kernel's view printed, once.
    int last_total = -1;
    auto last_progress = std::chrono::steady_clock::now();
    bool stall_printed = false;
    while (!all_done() && std::chrono::steady_clock::now() < deadline) {
        run(2ms); // short slices: the kills and the restart must land while clients run
        int total = 0;
        for (int i = 0; i < clients; ++i) {
            bool d = finished[static_cast<std::size_t>(i)];
            read_progress(*good[static_cast<std::size_t>(i)], progress[static_cast<std::size_t>(i)], &d);
            finished[static_cast<std::size_t>(i)] = d;
            total += progress[static_cast<std::size_t>(i)];
        }
        if (total != last_total) {
            last_total = total;
            last_progress = std::chrono::steady_clock::now();
        } else if (!stall_printed && std::chrono::steady_clock::now() - last_progress > 30s) {
            stall_printed = true;
            std::printf("[ service  ] %s: no client progressed for 30 s; %s\n", to_string(b_),
                        svc->describe().c_str());
            print_guest_state("clients stalled");
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
    if (!all_done())
        std::printf("[ service  ] %s: clients unfinished; %s\n", to_string(b_), svc->describe().c_str());
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
