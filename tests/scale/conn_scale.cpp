// conn_scale: N connections (1024 by default) to one single-threaded server, each used
// for --rounds pings and their pongs (every byte checked), and the memory they cost.
//
//   conn_scale tcp://127.0.0.1:0 -n 1024 --queues shared
//   conn_scale rdma://192.168.77.1:0 -n 1024 --queues own
//   conn_scale tcp://127.0.0.1:0 -n 1024 --queues shared --rounds 3 --together
//
// The process forks: the child is the server, the parent the client. The server serves
// every connection from one thread, either with queues of their own (--queues own: a
// completion queue and a receive queue per connection, --recvs receives of --recv-size
// posted on each) or shared (--queues shared: one completion queue and one shared receive
// queue with --recvs receives for them all). Each side reports its RSS growth over the
// connections divided by N; the client also reports how much the system's slab and
// vmalloc memory grew (the kernel's part: socket buffers, rxe's queues) divided by N,
// which is only meaningful on an otherwise idle machine such as the test guest.
// With --together the client posts a round's pings on every connection at once, so that
// the server's one thread finds N connections with data (in mixed sizes) and too few
// shared receives for them all (receiver-not-ready, retried): every connection must get
// each of its pongs, none starves. Without it the pings go one connection at a time.
// Exits non-zero if a connection cannot be set up or a byte is wrong.
#include <CLI/CLI.hpp>

#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace
{

constexpr std::size_t ping_size = 64; ///< the pong's size, and the most a ping carries
constexpr std::size_t ping_min = 8;   ///< the least a ping carries (its round and a pattern)

/// The size of connection i's ping of round r: mixed, ping_min..ping_size.
std::size_t ping_bytes(std::size_t i, std::size_t r)
{
    return ping_min + (i * 37 + r * 11) % (ping_size - ping_min + 1);
}

/// A field of a /proc file in kB ("VmRSS:", "Slab:").
long proc_kb(const char* file, const char* field)
{
    std::ifstream in(file);
    std::string line;
    const std::size_t n = std::strlen(field);
    while (std::getline(in, line))
        if (line.compare(0, n, field) == 0)
            return std::atol(line.c_str() + n);
    return 0;
}
long rss_kb()
{
    return proc_kb("/proc/self/status", "VmRSS:");
}

/// What byte j of connection i's ping of round r carries.
std::byte pattern(std::size_t i, std::size_t j, std::size_t r)
{
    return static_cast<std::byte>((i * 131 + j * 7 + r * 29) & 0xff);
}

void write_all(int fd, const void* p, std::size_t n)
{
    if (::write(fd, p, n) != static_cast<ssize_t>(n))
        throw std::runtime_error("pipe write");
}
void read_all(int fd, void* p, std::size_t n)
{
    if (::read(fd, p, n) != static_cast<ssize_t>(n))
        throw std::runtime_error("pipe read (the other side died?)");
}

struct options {
    std::string address;
    std::size_t n = 1024;
    bool shared = true;
    std::uint32_t recvs = 16;      ///< per connection (own queues)
    std::uint32_t srq_recvs = 256; ///< in the shared receive queue
    std::size_t recv_size = 1024;
    std::chrono::milliseconds timeout{60000};
    std::size_t rounds = 1;
    bool together = false; ///< a round's pings on every connection at once
};

/// The server: one thread, event-driven accept, then answers one ping per connection.
/// Tells the parent its port, then its RSS before and after; exits when `done_fd` closes.
int run_server(const options& o, int to_client, int done_fd)
{
    auto dom = rdmx::domain::open(o.address);
    auto events = rdmx::event_queue::create();
    std::shared_ptr<rdmx::completion_queue> cq;
    std::shared_ptr<rdmx::shared_receive_queue> srq;
    const std::uint32_t send_depth = 2;
    // Own queues: o.recvs receives per connection; shared: o.srq_recvs for all of them.
    std::size_t buffers = o.shared ? o.srq_recvs : o.recvs * o.n;
    std::vector<std::byte> pong(ping_size);
    auto pong_mr = dom->register_memory(pong.data(), pong.size(), rdmx::access::none);
    auto lst = dom->listen(o.address, 1024);
    std::uint16_t port = lst->port();
    long rss0 = rss_kb();
    write_all(to_client, &port, sizeof port);

    std::vector<std::byte> recv_bufs(buffers * o.recv_size);
    auto recv_mr = dom->register_memory(recv_bufs.data(), recv_bufs.size(), rdmx::access::local_write);
    if (o.shared) {
        cq = dom->create_completion_queue(
            {.depth = static_cast<std::uint32_t>(o.n * (send_depth + 1) + o.srq_recvs)}); // + 1: the goodbye
        rdmx::shared_receive_queue_options so;
        so.depth = o.srq_recvs;
        so.max_sge = 1;
        srq = dom->create_shared_receive_queue(so);
        for (std::uint32_t k = 0; k < o.srq_recvs; ++k) {
            rdmx::sge s{recv_mr.get(), k * o.recv_size, o.recv_size};
            if (auto ec = srq->post_recv({&s, 1}, k))
                throw rdmx::error(ec, "srq post_recv");
        }
    }

    std::vector<std::unique_ptr<rdmx::connection>> conns;
    conns.reserve(o.n);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    for (int fd : {lst->fd(), events->fd()}) {
        epoll_event ev{.events = EPOLLIN, .data = {.fd = fd}};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    std::size_t established = 0;
    auto deadline = clock_type::now() + o.timeout;
    while (established < o.n) {
        if (clock_type::now() > deadline)
            throw std::runtime_error("server: only " + std::to_string(established) +
                                     " connections established");
        std::array<epoll_event, 2> ready;
        epoll_wait(ep, ready.data(), ready.size(), 1000);
        while (auto req = lst->get_request(0ms)) {
            std::size_t i = conns.size();
            rdmx::connection_options opts;
            opts.send_queue_depth = send_depth;
            opts.max_send_sge = 1;
            opts.max_recv_sge = 1;
            opts.events = events;
            opts.context = i;
            opts.timeout = o.timeout;
            std::vector<rdmx::sge> sges;
            std::vector<rdmx::recv_request> initial;
            if (o.shared) {
                opts.send_cq = cq;
                opts.recv_cq = cq;
                opts.srq = srq;
            } else {
                opts.recv_queue_depth = o.recvs;
                sges.resize(o.recvs);
                for (std::uint32_t k = 0; k < o.recvs; ++k) {
                    sges[k] = {recv_mr.get(), (i * o.recvs + k) * o.recv_size, o.recv_size};
                    initial.push_back({.wr_id = i * o.recvs + k, .local = {&sges[k], 1}});
                }
            }
            conns.push_back(req->start_accept(opts, {}, initial));
        }
        std::array<rdmx::event, 64> evs;
        while (std::size_t k = events->poll(evs))
            for (const auto& ev : std::span(evs).first(k)) {
                if (ev.type == rdmx::event_type::established)
                    ++established;
                else if (ev.type == rdmx::event_type::error || ev.type == rdmx::event_type::disconnected)
                    throw std::runtime_error(std::string("server: connection ") + std::to_string(ev.context) +
                                             ": " + rdmx::to_string(ev.type) + ": " + ev.cause.message());
            }
    }
    close(ep);

    // Pings: answer each with its pong; done when every pong's send completed.
    std::size_t answered = 0, sent = 0;
    std::vector<std::size_t> round(o.n, 0); // of each connection's next ping
    std::array<rdmx::completion, 64> wcs;
    auto handle = [&](const rdmx::completion& wc, std::size_t i) { // i: its connection
        if (wc.status)
            throw std::runtime_error("server: completion error: " + wc.status.message());
        if (wc.opcode != rdmx::opcode::recv) {
            ++sent;
            return;
        }
        const std::byte* p = recv_bufs.data() + wc.wr_id * o.recv_size;
        const std::size_t r = round[i]++;
        if (r >= o.rounds || wc.byte_len != ping_bytes(i, r))
            throw std::runtime_error("server: ping " + std::to_string(i) + " of round " + std::to_string(r) +
                                     " has the wrong size or comes once too often");
        for (std::size_t j = 0; j < ping_bytes(i, r); ++j)
            if (p[j] != pattern(i, j, r))
                throw std::runtime_error("server: ping " + std::to_string(i) + " is wrong");
        {
            rdmx::sge s{recv_mr.get(), wc.wr_id * o.recv_size, o.recv_size};
            if (auto ec =
                    o.shared ? srq->post_recv({&s, 1}, wc.wr_id) : conns[i]->post_recv({&s, 1}, wc.wr_id))
                throw rdmx::error(ec, "post_recv (again)");
        }
        // The pong names the connection and round it answers (one buffer for all: inline
        // sends copy it at post, so it can be rewritten at once).
        rdmx::sge s{pong_mr.get(), 0, ping_size};
        std::memcpy(pong.data(), &i, sizeof i);
        std::memcpy(pong.data() + sizeof i, &r, sizeof r);
        if (auto ec =
                conns[i]->post_send({&s, 1}, 0, rdmx::send_flags::signaled | rdmx::send_flags::inline_data))
            throw rdmx::error(ec, "post_send");
        ++answered;
    };
    deadline = clock_type::now() + o.timeout;
    while (sent < o.n * o.rounds) {
        if (clock_type::now() > deadline)
            throw std::runtime_error("server: " + std::to_string(answered) + " pings answered in time");
        if (o.shared) {
            std::size_t k = cq->wait(wcs, 1000ms);
            for (const auto& wc : std::span(wcs).first(k))
                handle(wc, wc.context);
        } else {
            for (std::size_t i = 0; i < conns.size(); ++i) { // N per-connection queues: poll them all
                std::size_t k = conns[i]->poll(wcs);
                for (auto& wc : std::span(wcs).first(k))
                    handle(wc, i);
            }
        }
    }
    long rss1 = rss_kb();
    std::array<long, 2> rss{rss0, rss1};
    write_all(to_client, rss.data(), sizeof rss);
    char c;
    (void)::read(done_fd, &c, 1); // the client is done measuring
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"N connections to one single-threaded server: does it work, and what does each cost"};
    options o;
    std::string queues = "shared";
    int timeout_s = 120;
    app.add_option("address", o.address, "tcp://127.0.0.1:0 or rdma://IP:0")->required();
    app.add_option("-n,--connections", o.n, "connections")->capture_default_str();
    app.add_option("--queues", queues, "own: per-connection CQ and receive queue; shared: one CQ and one SRQ")
        ->check(CLI::IsMember({"own", "shared"}))
        ->capture_default_str();
    app.add_option("--recvs", o.recvs, "receives posted per connection (own queues)")->capture_default_str();
    app.add_option("--srq-recvs", o.srq_recvs, "receives in the shared receive queue (shared queues)")
        ->capture_default_str();
    app.add_option("--recv-size", o.recv_size, "bytes per receive buffer")->capture_default_str();
    app.add_option("--timeout-s", timeout_s, "bound on each phase")->capture_default_str();
    app.add_option("--rounds", o.rounds, "pings per connection")->capture_default_str();
    app.add_flag("--together", o.together, "a round's pings on every connection at once");
    CLI11_PARSE(app, argc, argv);
    o.shared = queues == "shared";
    o.timeout = std::chrono::seconds(timeout_s);

    // Two fds per connection and side at least (socket or QP, completion channel).
    rlimit nofile{};
    getrlimit(RLIMIT_NOFILE, &nofile);
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);

    int to_client[2], done[2];
    if (pipe(to_client) != 0 || pipe(done) != 0)
        return 1;
    long slab0 = proc_kb("/proc/meminfo", "Slab:");
    long vmalloc0 = proc_kb("/proc/meminfo", "VmallocUsed:");
    pid_t pid = fork();
    if (pid == 0) {
        close(to_client[0]);
        close(done[1]);
        try {
            _exit(run_server(o, to_client[1], done[0]));
        } catch (const std::exception& e) {
            std::fprintf(stderr, "conn_scale server: %s\n", e.what());
            _exit(1);
        }
    }
    close(to_client[1]);
    close(done[0]);
    int rc = 0;
    try {
        std::uint16_t port = 0;
        read_all(to_client[0], &port, sizeof port);
        std::string addr = o.address.substr(0, o.address.rfind(':') + 1) + std::to_string(port);
        auto dom = rdmx::domain::open(addr);
        std::vector<std::byte> bufs(2 * ping_size * o.n);
        auto mr = dom->register_memory(bufs.data(), bufs.size(), rdmx::access::local_write);
        long rss0 = rss_kb();
        auto t0 = clock_type::now();
        std::vector<std::unique_ptr<rdmx::connection>> conns;
        conns.reserve(o.n);
        rdmx::connection_options opts;
        opts.send_queue_depth = 2;
        opts.recv_queue_depth = 2;
        opts.max_send_sge = 1;
        opts.max_recv_sge = 1;
        opts.timeout = o.timeout;
        for (std::size_t i = 0; i < o.n; ++i)
            conns.push_back(dom->connect(addr, opts));
        auto t1 = clock_type::now();
        auto ping = [&](std::size_t i, std::size_t r) {
            std::byte* p = bufs.data() + 2 * ping_size * i;
            for (std::size_t j = 0; j < ping_bytes(i, r); ++j)
                p[j] = pattern(i, j, r);
            rdmx::sge in{mr.get(), 2 * ping_size * i + ping_size, ping_size};
            rdmx::sge out{mr.get(), 2 * ping_size * i, ping_bytes(i, r)};
            if (auto ec = conns[i]->post_recv({&in, 1}, 1))
                throw rdmx::error(ec, "post_recv");
            if (auto ec = conns[i]->post_send({&out, 1}, 2))
                throw rdmx::error(ec, "post_send");
        };
        auto pong = [&](std::size_t i, std::size_t r) {
            int got = 0;
            while (got < 2) {
                rdmx::completion wc;
                if (conns[i]->wait({&wc, 1}, o.timeout) == 0)
                    throw std::runtime_error("connection " + std::to_string(i) + ": no pong in time (round " +
                                             std::to_string(r) + ")");
                if (wc.status)
                    throw std::runtime_error("connection " + std::to_string(i) + ": " + wc.status.message());
                ++got;
            }
            std::size_t echoed[2] = {};
            std::memcpy(echoed, bufs.data() + 2 * ping_size * i + ping_size, sizeof echoed);
            if (echoed[0] != i || echoed[1] != r)
                throw std::runtime_error("connection " + std::to_string(i) + " round " + std::to_string(r) +
                                         ": pong of connection " + std::to_string(echoed[0]) + " round " +
                                         std::to_string(echoed[1]));
        };
        for (std::size_t r = 0; r < o.rounds; ++r) {
            if (o.together) {
                for (std::size_t i = 0; i < o.n; ++i)
                    ping(i, r);
                for (std::size_t i = 0; i < o.n; ++i)
                    pong(i, r);
            } else {
                for (std::size_t i = 0; i < o.n; ++i) {
                    ping(i, r);
                    pong(i, r);
                }
            }
        }
        auto t2 = clock_type::now();
        long rss1 = rss_kb();
        std::array<long, 2> srv{};
        read_all(to_client[0], srv.data(), sizeof srv);
        long slab1 = proc_kb("/proc/meminfo", "Slab:");
        long vmalloc1 = proc_kb("/proc/meminfo", "VmallocUsed:");
        auto per = [&](long kb) { return static_cast<double>(kb) / static_cast<double>(o.n); };
        std::printf("conn_scale: %s %s n=%zu rounds=%zu%s recvs=%u x %zu B: server %.1f KiB/conn, client "
                    "%.1f KiB/conn, "
                    "kernel slab %.1f KiB/conn, vmalloc %.1f KiB/conn; connect %.2f s, ping all %.2f s\n",
                    rdmx::to_string(dom->backend()), queues.c_str(), o.n, o.rounds,
                    o.together ? " together" : "", o.shared ? o.srq_recvs : o.recvs, o.recv_size,
                    per(srv[1] - srv[0]), per(rss1 - rss0), per(slab1 - slab0), per(vmalloc1 - vmalloc0),
                    std::chrono::duration<double>(t1 - t0).count(),
                    std::chrono::duration<double>(t2 - t1).count());
        std::fflush(stdout);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "conn_scale client: %s\n", e.what());
        rc = 1;
    }
    close(done[1]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        rc = 1;
    return rc;
}
