// fault_peer: the other end of the fault-injection tests, run as its own process so that
// the tests can kill (SIGKILL) or stop (SIGSTOP) it, or cut the link under it.
//
//   fault_peer ADDRESS [RECEIVES]
//
// Listens on ADDRESS (port 0 picks one) and prints "READY <port>" on stdout. Accepts one
// connection, handing the descriptor of a 1 MiB region the client may write and read as
// the accept's private data, posts RECEIVES receives of 64 KiB (default 64) and re-posts
// each one as it completes, so the client can stream sends. It exits when the connection
// ends, or after 120 s whatever happens (the tests never leave it behind).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <rdmx/rdmx.hpp>

int main(int argc, char** argv)
{
    using namespace std::chrono_literals;
    if (argc < 2) {
        std::fprintf(stderr, "usage: fault_peer ADDRESS [RECEIVES]\n");
        return 2;
    }
    const std::size_t receives = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 64;
    constexpr std::size_t recv_size = 64 * 1024;
    try {
        auto dom = rdmx::domain::open(argv[1]);
        auto lst = dom->listen(argv[1]);
        std::vector<std::byte> region(1 << 20), inbox(receives * recv_size);
        auto mr = dom->register_memory(region.data(), region.size(),
                                       rdmx::access::remote_write | rdmx::access::remote_read);
        auto in_mr = dom->register_memory(inbox.data(), inbox.size(), rdmx::access::local_write);
        std::printf("READY %u\n", lst->port());
        std::fflush(stdout);

        auto deadline = std::chrono::steady_clock::now() + 120s;
        std::unique_ptr<rdmx::connection_request> req;
        while (!req && std::chrono::steady_clock::now() < deadline)
            req = lst->get_request(1s);
        if (!req)
            return 1;
        rdmx::connection_options opts;
        opts.recv_queue_depth = static_cast<std::uint32_t>(receives);
        auto desc = mr->remote().serialize();
        auto conn = req->accept(opts, desc);
        for (std::size_t i = 0; i < receives; ++i) {
            rdmx::sge s{in_mr.get(), i * recv_size, recv_size};
            if (conn->post_recv({&s, 1}, i))
                return 1;
        }
        rdmx::completion wc[32];
        while (std::chrono::steady_clock::now() < deadline &&
               conn->state() == rdmx::connection_state::established) {
            std::size_t n = conn->wait(wc, 100ms);
            for (std::size_t i = 0; i < n; ++i) {
                if (wc[i].status)
                    continue;
                rdmx::sge s{in_mr.get(), wc[i].wr_id * recv_size, recv_size};
                conn->post_recv({&s, 1}, wc[i].wr_id);
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fault_peer: %s\n", e.what());
        return 1;
    }
    return 0;
}
