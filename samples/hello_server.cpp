// rdmx_server: the server half of the sample pair.
//
//   1. Accepts a connection and answers the client's greeting.
//   2. The bulk pattern DAOS uses through Mercury: the client sends the descriptor of a
//      buffer it registered; the server RDMA-writes its data straight into that buffer and
//      then sends a completion message with a checksum. The client never copies a byte.
//
// Works over rdma:// (verbs through rdma_cm), tcp:// (fallback) and auto://.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

#include "sample_common.hpp"

using namespace std::chrono_literals;

namespace
{

constexpr std::size_t msg_size = 256; // every control message fits in one receive

void serve(rdmx::domain& dom, rdmx::connection_request& req, std::chrono::milliseconds timeout)
{
    std::string hello(reinterpret_cast<const char*>(req.private_data().data()), req.private_data().size());
    std::printf("server: connection request (private data: \"%s\")\n", hello.c_str());
    rdmx::connection_options opts;
    opts.timeout = timeout;
    const std::string welcome = "rdmx-server ready";
    auto conn = req.accept(opts, {reinterpret_cast<const std::byte*>(welcome.data()), welcome.size()});

    std::vector<std::byte> inbox(msg_size), outbox(msg_size);
    auto in_mr = dom.register_memory(inbox.data(), inbox.size(), rdmx::access::local_write);
    auto out_mr = dom.register_memory(outbox.data(), outbox.size(), rdmx::access::none);
    rdmx::sge in{in_mr.get(), 0, msg_size};
    sample::completion_waiter completions(*conn, timeout);

    // 1. Greeting.
    if (auto ec = conn->post_recv({&in, 1}, 1))
        throw rdmx::error(ec, "post_recv");
    auto wc = completions.wait(1, "receive greeting");
    std::printf("server: received \"%.*s\"\n", static_cast<int>(wc.byte_len),
                reinterpret_cast<const char*>(inbox.data()));
    if (auto ec = conn->post_recv({&in, 1}, 2)) // for the bulk request, before answering
        throw rdmx::error(ec, "post_recv");
    const char reply[] = "Hello client, this is the server";
    std::memcpy(outbox.data(), reply, sizeof reply - 1);
    rdmx::sge out{out_mr.get(), 0, sizeof reply - 1};
    if (auto ec = conn->post_send({&out, 1}, 3))
        throw rdmx::error(ec, "post_send");
    completions.wait(3, "send reply");

    // 2. Bulk: "BULK" + the 32-byte descriptor of the client's buffer.
    wc = completions.wait(2, "receive bulk request");
    if (wc.byte_len != 4 + rdmx::remote_buffer::wire_size || std::memcmp(inbox.data(), "BULK", 4) != 0)
        throw std::runtime_error("bulk request: malformed message");
    auto rb = rdmx::remote_buffer::parse(std::span(inbox).subspan(4, rdmx::remote_buffer::wire_size));
    if (!rb)
        throw std::runtime_error("bulk request: invalid descriptor");
    std::printf("server: bulk request for %llu bytes\n", static_cast<unsigned long long>(rb->length));
    std::vector<std::byte> data(rb->length);
    for (std::size_t i = 0; i < data.size(); ++i)
        data[i] = sample::bulk_pattern(i);
    auto data_mr = dom.register_memory(data.data(), data.size(), rdmx::access::none);
    rdmx::sge d{data_mr.get(), 0, data.size()};
    // Unsignaled write followed by a signalled send: RC ordering guarantees the data has
    // landed before the client sees the completion message.
    if (auto ec = conn->post_write({&d, 1}, *rb, 4, rdmx::send_flags::none))
        throw rdmx::error(ec, "post_write");
    int n = std::snprintf(reinterpret_cast<char*>(outbox.data()), msg_size, "DONE %zu %016llx", data.size(),
                          static_cast<unsigned long long>(sample::checksum(data.data(), data.size())));
    out.length = static_cast<std::size_t>(n);
    if (auto ec = conn->post_send({&out, 1}, 5))
        throw rdmx::error(ec, "post_send");
    completions.wait(5, "RDMA write + completion message");
    std::printf("server: wrote %zu bytes into the client's buffer and sent the completion\n", data.size());

    // 3. Wait for the client to hang up (its disconnect flushes our posted receive).
    if (auto ec = conn->post_recv({&in, 1}, 6))
        throw rdmx::error(ec, "post_recv");
    rdmx::completion last;
    conn->wait({&last, 1}, timeout);
    conn->disconnect();
}

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"rdmx sample server: greeting, then the bulk RDMA-write pattern"};
    std::string address = "auto://0.0.0.0:7471";
    int count = 0;
    int timeout_ms = 10000;
    app.add_option("address", address,
                   "listen address: rdma://IP:PORT, tcp://IP:PORT, shm://NAME:PORT or auto://IP:PORT")
        ->capture_default_str();
    app.add_option("-n,--count", count, "serve this many clients, then exit (0: forever)")
        ->capture_default_str();
    app.add_option("-t,--timeout-ms", timeout_ms, "bound on every wait")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    try {
        auto dom = rdmx::domain::open(address);
        auto lst = dom->listen(address);
        std::printf("server: listening on %s (backend %s, device %s, port %u)\n", address.c_str(),
                    rdmx::to_string(dom->backend()), dom->limits().device_name.c_str(), lst->port());
        std::fflush(stdout);
        for (int served = 0; count == 0 || served < count;) {
            auto req = lst->get_request(std::chrono::seconds(1));
            if (!req)
                continue;
            try {
                serve(*dom, *req, std::chrono::milliseconds(timeout_ms));
                std::printf("server: client done\n");
            } catch (const std::exception& e) {
                std::fprintf(stderr, "server: client failed: %s\n", e.what());
                if (count != 0)
                    return 1;
            }
            ++served;
            std::fflush(stdout);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rdmx_server: %s\n", e.what());
        return 1;
    }
    return 0;
}
