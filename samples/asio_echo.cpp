// rdmx_asio_echo: an echo server that serves many clients from one thread with C++20
// coroutines on Boost.Asio (rdmx/asio.hpp), and clients that check every byte it returns.
//
//   rdmx_asio_echo server tcp://0.0.0.0:7471
//   rdmx_asio_echo client tcp://127.0.0.1:7471 --clients 8 --messages 1000
//
// The server's one thread runs the io_context: an accept loop and one coroutine per
// connection, each sleeping in co_await until its connection has completions. The thread is
// the data-path thread of every connection it serves (the rule of rdmx/asio.hpp).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <rdmx/asio.hpp>
#include <rdmx/rdmx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

namespace net = boost::asio;

namespace
{

constexpr std::size_t msg_size = 4096; // the largest message
constexpr std::uint64_t recv_id = 1, send_id = 2;

/// One connection's memory: a receive buffer and a send buffer.
struct buffers {
    std::vector<std::byte> bytes = std::vector<std::byte>(2 * msg_size);
    std::unique_ptr<rdmx::memory_region> mr;
    explicit buffers(rdmx::domain& dom)
        : mr(dom.register_memory(bytes.data(), bytes.size(), rdmx::access::local_write))
    {
    }
    rdmx::sge in() const { return {mr.get(), 0, msg_size}; }
    rdmx::sge out(std::size_t len) const { return {mr.get(), msg_size, len}; }
};

/// Serves one client until its connection ends: each message goes back as it came.
/// (The buffers come first: the connection, destroyed first, goes before its memory.)
net::awaitable<void> session(std::shared_ptr<buffers> buf, std::shared_ptr<rdmx::connection> conn)
{
    rdmx::completion cs[8];
    for (;;) {
        std::size_t n = co_await rdmx::asio::async_poll(*conn, cs);
        for (const rdmx::completion& c : std::span(cs, n)) {
            if (c.status) // errc::flushed once the client has gone, or why the connection failed
                co_return;
            if (c.opcode != rdmx::opcode::recv)
                continue;
            std::memcpy(buf->bytes.data() + msg_size, buf->bytes.data(), c.byte_len);
            rdmx::sge in = buf->in(), out = buf->out(c.byte_len);
            // The next receive before the answer: the client may send as soon as it has it.
            if (conn->post_recv({&in, 1}, recv_id) || conn->post_send({&out, 1}, send_id))
                co_return;
        }
    }
}

net::awaitable<void> accept_loop(rdmx::domain& dom, rdmx::listener& lst)
{
    auto ex = co_await net::this_coro::executor;
    for (;;) {
        auto req = co_await rdmx::asio::async_get_request(lst);
        auto buf = std::make_shared<buffers>(dom);
        rdmx::sge in = buf->in();
        rdmx::recv_request first{.wr_id = recv_id, .local = {&in, 1}};
        try {
            // Without waiting: the receive is posted before the client may send, and the
            // session's first completion comes once the connection is up (or a flushed
            // receive if it never comes up).
            std::shared_ptr<rdmx::connection> conn = req->start_accept({}, {}, {&first, 1});
            net::co_spawn(ex, session(std::move(buf), std::move(conn)), net::detached);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "server: accept failed: %s\n", e.what());
        }
    }
}

/// One client: `messages` messages of varying sizes, each answer checked byte by byte.
net::awaitable<void> client(rdmx::domain& dom, const std::string& address, int id, int messages,
                            int& failures)
{
    try {
        buffers buf(dom);
        auto conn = dom.connect(address); // blocks this thread briefly: the clients start one by one
        rdmx::completion cs[4];
        for (int m = 0; m < messages; ++m) {
            std::size_t len = 1 + static_cast<std::size_t>(m * 997 + id * 131) % msg_size;
            for (std::size_t i = 0; i < len; ++i)
                buf.bytes[msg_size + i] = static_cast<std::byte>(i * 7 + m + id);
            rdmx::sge in = buf.in(), out = buf.out(len);
            if (auto ec = conn->post_recv({&in, 1}, recv_id))
                throw rdmx::error(ec, "post_recv");
            if (auto ec = conn->post_send({&out, 1}, send_id))
                throw rdmx::error(ec, "post_send");
            for (bool sent = false, answered = false; !sent || !answered;) {
                std::size_t n = co_await rdmx::asio::async_poll(*conn, cs, std::chrono::seconds(10));
                if (n == 0)
                    throw std::runtime_error("no answer within 10 s");
                for (const rdmx::completion& c : std::span(cs, n)) {
                    if (c.status)
                        throw rdmx::error(c.status, "completion");
                    sent |= c.wr_id == send_id;
                    answered |= c.wr_id == recv_id;
                    if (c.wr_id == recv_id &&
                        (c.byte_len != len ||
                         std::memcmp(buf.bytes.data(), buf.bytes.data() + msg_size, len) != 0))
                        throw std::runtime_error("message " + std::to_string(m) + " came back changed");
                }
            }
        }
        std::printf("client %d: %d messages echoed intact\n", id, messages);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "client %d: %s\n", id, e.what());
        ++failures;
    }
}

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"rdmx echo over Boost.Asio coroutines: a one-thread server and its clients"};
    app.require_subcommand(1);
    std::string address = "auto://0.0.0.0:7471";
    int clients = 4, messages = 100;
    auto* server_cmd = app.add_subcommand("server", "serve clients from one thread until killed");
    server_cmd
        ->add_option("address", address,
                     "listen address: rdma://IP:PORT, tcp://IP:PORT, shm://NAME:PORT or auto://IP:PORT")
        ->capture_default_str();
    auto* client_cmd = app.add_subcommand("client", "run clients as coroutines on one thread");
    client_cmd->add_option("address", address, "server address")->required();
    client_cmd->add_option("-c,--clients", clients, "concurrent clients")->capture_default_str();
    client_cmd->add_option("-n,--messages", messages, "messages per client")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    try {
        auto dom = rdmx::domain::open(address);
        net::io_context io; // run by this thread alone
        int failures = 0;
        std::unique_ptr<rdmx::listener> lst;
        if (*server_cmd) {
            lst = dom->listen(address);
            std::printf("server: listening on %s (backend %s, port %u)\n", address.c_str(),
                        rdmx::to_string(dom->backend()), lst->port());
            std::fflush(stdout);
            net::co_spawn(io, accept_loop(*dom, *lst), net::detached);
        } else {
            for (int i = 0; i < clients; ++i)
                net::co_spawn(io, client(*dom, address, i, messages, failures), net::detached);
        }
        io.run();
        return failures == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rdmx_asio_echo: %s\n", e.what());
        return 1;
    }
}
