// rdmx_ep_service: an endpoint echo service on one Boost.Asio thread (asio_ep_service.hpp), until
// SIGINT or SIGTERM; then it prints what it did.
//
//   rdmx_ep_service tcp://0.0.0.0:7480
//   rdmx_ep_service rdma://10.0.0.1:7480
//
// Clients send tagged messages (bit 63 of the tag set) and get each back, byte for byte,
// with the same tag; tests/endpoint_peer's `rpc` mode is one such client.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>

#include <boost/asio/signal_set.hpp>

#include "asio_ep_service.hpp"

int main(int argc, char** argv)
{
    CLI::App app{"rdmx endpoint echo service: one thread, Boost.Asio coroutines"};
    std::string address;
    app.add_option("address", address,
                   "where to listen: tcp://HOST:PORT, rdma://HOST:PORT, shm://NAME:PORT, auto://HOST:PORT")
        ->required();
    CLI11_PARSE(app, argc, argv);
    try {
        auto dom = rdmx::domain::open(address);
        rdmx::endpoint_options o;
        o.peer_events = true; // retire clients that died
        boost::asio::io_context io;
        ep_service::echo_service svc(io, *dom, address, o);
        std::printf("rdmx_ep_service: listening on %s\n", svc.address().c_str());
        std::fflush(stdout);
        boost::asio::signal_set signals(io, SIGINT, SIGTERM);
        signals.async_wait([&](const boost::system::error_code&, int) { svc.stop(); });
        io.run(); // until the service's loop ended and nothing is left to do
        if (!svc.error.empty()) {
            std::fprintf(stderr, "rdmx_ep_service: %s\n", svc.error.c_str());
            return 1;
        }
        std::printf("rdmx_ep_service: done: %d served, %d sunk, %d peers down, %d peers restarted, %d reply "
                    "failures\n",
                    svc.served, svc.sunk, svc.peers_down, svc.peers_restarted, svc.reply_failures);
        return 0;
    } catch (const rdmx::error& e) {
        std::fprintf(stderr, "rdmx_ep_service: %s\n", e.what());
        return 1;
    }
}
