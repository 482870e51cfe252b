// fault_peer: the other end of the fault-injection tests, run as its own process so that
// the tests can kill (SIGKILL) or stop (SIGSTOP) it, or cut the link under it.
//
//   fault_peer ADDRESS [RECEIVES]
//
// Listens on ADDRESS (port 0 picks one) and prints "READY <port>" on stdout. Accepts one
// connection, handing the descriptor of a 1 MiB region the client may write and read as
// the accept's private data, posts RECEIVES receives of 64 KiB (default 64), sends
// "CTL:OK" to say so, and re-posts each receive as it completes, so the client can stream
// sends. It exits when the connection
// ends, or after 120 s whatever happens (the tests never leave it behind).
//
// When it runs on another host (another guest), the test cannot signal it, so it obeys
// control messages that arrive in the stream like any send: "CTL:KILL" (SIGKILL itself),
// "CTL:STOP" (SIGSTOP itself), "CTL:NETEM ON" / "CTL:NETEM OFF" (loss and reordering on
// its link $RDMX_FAULT_PEER_LINK, answered with a send "CTL:OK").
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
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
        char reply[8] = "CTL:OK";
        auto reply_mr = dom->register_memory(reply, sizeof reply, rdmx::access::none);
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
        {
            // Tell the test its requests may come: before this, a send could find no
            // receive posted and use up the test's few RNR retries on a slow guest.
            rdmx::sge r{reply_mr.get(), 0, 6};
            if (conn->post_send({&r, 1}, 1ull << 62, rdmx::send_flags::none))
                return 1;
        }
        rdmx::completion wc[32];
        while (std::chrono::steady_clock::now() < deadline &&
               conn->state() == rdmx::connection_state::established) {
            std::size_t n = conn->wait(wc, 100ms);
            for (std::size_t i = 0; i < n; ++i) {
                if (wc[i].status || wc[i].opcode != rdmx::opcode::recv)
                    continue;
                const char* msg = reinterpret_cast<const char*>(inbox.data() + wc[i].wr_id * recv_size);
                std::string ctl(msg, std::min<std::size_t>(wc[i].byte_len, 16));
                if (ctl.starts_with("CTL:KILL"))
                    ::kill(::getpid(), SIGKILL);
                if (ctl.starts_with("CTL:STOP"))
                    ::raise(SIGSTOP);
                if (ctl.starts_with("CTL:NETEM")) {
                    const char* link = std::getenv("RDMX_FAULT_PEER_LINK");
                    std::string cmd =
                        std::string("tc qdisc ") + (ctl.starts_with("CTL:NETEM ON") ? "replace" : "del") +
                        " dev " + (link ? link : "eth1") + " root" +
                        (ctl.starts_with("CTL:NETEM ON") ? " netem delay 1ms loss 3% reorder 10% 50%" : "");
                    int rc = std::system(cmd.c_str());
                    std::fprintf(stderr, "fault_peer: %s -> %d\n", cmd.c_str(), rc);
                    rdmx::sge r{reply_mr.get(), 0, 6};
                    conn->post_send({&r, 1}, 1ull << 62, rdmx::send_flags::none);
                }
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
