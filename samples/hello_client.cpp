// rdmx_client: the client half of the sample pair (see hello_server.cpp for the flow).
//
//   rdmx_client tcp://127.0.0.1:7471
//   rdmx_client rdma://192.168.77.1:7471 --size 4194304
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

#include "sample_common.hpp"

namespace
{

constexpr std::size_t msg_size = 256;

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"rdmx sample client: greeting, then the bulk RDMA-write pattern"};
    std::string address;
    std::size_t size = 1 << 20;
    int timeout_ms = 10000;
    app.add_option("address", address,
                   "server address: rdma://IP:PORT, tcp://IP:PORT, shm://NAME:PORT or auto://IP:PORT")
        ->required();
    app.add_option("-s,--size", size, "bytes the server writes into our buffer")
        ->capture_default_str()
        ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
    app.add_option("-t,--timeout-ms", timeout_ms, "bound on connecting and on every wait")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    const std::chrono::milliseconds timeout(timeout_ms);

    try {
        auto dom = rdmx::domain::open(address);
        std::printf("client: backend %s (device %s)\n", rdmx::to_string(dom->backend()),
                    dom->limits().device_name.c_str());
        rdmx::connection_options opts;
        opts.timeout = timeout;
        const std::string pdata = "rdmx-client hello";
        std::unique_ptr<rdmx::connection> conn;
        try {
            conn =
                dom->connect(address, opts, {reinterpret_cast<const std::byte*>(pdata.data()), pdata.size()});
        } catch (const rdmx::error& e) {
            std::fprintf(stderr, "rdmx_client: cannot connect to %s: %s\n", address.c_str(), e.what());
            return 1;
        }
        // The connection's backend: shm where auto:// found the listener on this host.
        std::printf("client: connected to %s over %s (server said \"%.*s\")\n", address.c_str(),
                    rdmx::to_string(conn->backend()), static_cast<int>(conn->peer_private_data().size()),
                    reinterpret_cast<const char*>(conn->peer_private_data().data()));

        std::vector<std::byte> inbox(msg_size), outbox(msg_size);
        auto in_mr = dom->register_memory(inbox.data(), inbox.size(), rdmx::access::local_write);
        auto out_mr = dom->register_memory(outbox.data(), outbox.size(), rdmx::access::none);
        rdmx::sge in{in_mr.get(), 0, msg_size};
        sample::completion_waiter completions(*conn, timeout);

        // 1. Greeting: post the receive for the reply first (no receive, no delivery).
        if (auto ec = conn->post_recv({&in, 1}, 1))
            throw rdmx::error(ec, "post_recv");
        const char hello[] = "Hello server, this is the client";
        std::memcpy(outbox.data(), hello, sizeof hello - 1);
        rdmx::sge out{out_mr.get(), 0, sizeof hello - 1};
        if (auto ec = conn->post_send({&out, 1}, 2))
            throw rdmx::error(ec, "post_send");
        completions.wait(2, "send greeting");
        auto wc = completions.wait(1, "receive reply");
        std::printf("client: server replied \"%.*s\"\n", static_cast<int>(wc.byte_len),
                    reinterpret_cast<const char*>(inbox.data()));

        // 2. Bulk: register a sink the server may write, send its descriptor, wait for DONE.
        std::vector<std::byte> sink(size);
        auto sink_mr = dom->register_memory(sink.data(), sink.size(), rdmx::access::remote_write);
        if (auto ec = conn->post_recv({&in, 1}, 3))
            throw rdmx::error(ec, "post_recv");
        std::memcpy(outbox.data(), "BULK", 4);
        auto desc = sink_mr->remote().serialize();
        std::memcpy(outbox.data() + 4, desc.data(), desc.size());
        out.length = 4 + desc.size();
        if (auto ec = conn->post_send({&out, 1}, 4))
            throw rdmx::error(ec, "post_send");
        completions.wait(4, "send bulk request");
        wc = completions.wait(3, "receive bulk completion");
        std::string done(reinterpret_cast<const char*>(inbox.data()), wc.byte_len);
        std::size_t got_size = 0;
        unsigned long long got_sum = 0;
        if (std::sscanf(done.c_str(), "DONE %zu %llx", &got_size, &got_sum) != 2 || got_size != size)
            throw std::runtime_error("bulk completion: unexpected message \"" + done + "\"");
        // Verify every byte against the pattern the server promised and its checksum.
        for (std::size_t i = 0; i < size; ++i)
            if (sink[i] != sample::bulk_pattern(i))
                throw std::runtime_error("bulk data: byte " + std::to_string(i) + " is wrong");
        if (sample::checksum(sink.data(), size) != got_sum)
            throw std::runtime_error("bulk data: checksum mismatch");
        std::printf("client: bulk transfer verified: %zu bytes written by the server, checksum %016llx\n",
                    size, got_sum);
        conn->disconnect();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rdmx_client: %s\n", e.what());
        return 1;
    }
    return 0;
}
