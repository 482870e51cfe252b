// rdmx_ep_perf: tagged-message latency, message rate and bandwidth over rdmx endpoints
// (rdmx/endpoint.hpp), and the cost of a lazy connection, for bench/endpoints.sh to set
// beside fi_pingpong over ofi_rxm and ucx_perftest.
//
//   rdmx_ep_perf --server tcp://127.0.0.1:7700              (serves runs until killed)
//   rdmx_ep_perf tcp://127.0.0.1:7700 -t tag_lat -s 8 -n 10000
//   rdmx_ep_perf tcp://127.0.0.1:7700 -t tag_bw -s 1M -n 2000 -W 16
//   rdmx_ep_perf tcp://127.0.0.1:7700 -t first_msg -n 50   (a new endpoint per message)
//   rdmx_ep_perf --server --peers 1024 tcp://127.0.0.1:7700  (completion queue for 1024 peers)
//   rdmx_ep_perf tcp://127.0.0.1:7700 -t conn_rate -n 1024 -W 64
//   rdmx_ep_perf tcp://127.0.0.1:7700 -t flood -s 1K          (floods until killed)
//
// tag_lat: ping-pong of `size` bytes; one-way latency = round trip / 2 (as fi_pingpong).
//   --json adds empty_poll_us: the mean time of a poll() that found nothing.
// tag_bw: a window of W sends in flight; after n of them the client sends FIN, which the
//   server answers once all n arrived (messages from one peer arrive in order), so the
//   time runs from the first send to the answer. Sizes above the eager limit go by
//   rendezvous. Reports MB/s (1e6 B/s) and messages/s. Each send of the window has bytes
//   of its own, and each of the server's receives too (what an application moves); with
//   --one-buffer (both sides) every send is from and every receive into the same bytes,
//   as fi_rdm_tagged_bw and ucx_perftest do: they measure copies that stay in the cache.
// first_msg: each iteration opens a new client endpoint (a new incarnation), then times
//   insert() of the server and one 8 B ping-pong: the lazy connect included, the open not.
// conn_rate: opens n small client endpoints in one domain (not timed), then each inserts
//   the server and does one 8 B ping-pong, at most W of them connecting at once; reports
//   connections per second over the span from the first insert to the last pong, and the
//   median and p99 of each peer's time from its insert to its pong. The server needs
//   --peers n (its completion queue reserves every connection's send queue).
// self_lat: the tag_lat ping-pong between two endpoints of this process, each in a domain
//   of its own (as two processes), on one thread and without a server: whoever polls for
//   a message is the thread that sent the one before, so no cache line crosses CPUs, and
//   the time is the library's CPU work per message (a send and its receive, one-way =
//   round trip / 2), whatever the host's mode of moving lines between CPUs
//   (docs/performance.md). rdmx_ep_perf shm://self:7790 -t self_lat -s 8 -n 100000
// flood: sends `size`-byte messages with a tag the server never receives, as fast as the
//   endpoint takes them, never receiving, until killed (bench/flood_p99.sh times tag_lat
//   beside it: a flooder must not starve other peers).
// Every wait is bounded by --timeout-ms; -e sleeps on the endpoint's fd instead of polling.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <rdmx/rdmx.hpp>

namespace
{

using clock_type = std::chrono::steady_clock;

constexpr std::uint64_t tag_ping = 1, tag_pong = 2, tag_data = 3, tag_fin = 4, tag_fin_ack = 5;
/// The server receives tags 0-255 only: a flood's messages stay unexpected.
constexpr std::uint64_t served_tags = 0xff, tag_flood = 0x100;

struct options {
    std::string address;
    bool server = false;
    std::string test = "tag_lat";
    std::string size = "8";
    std::uint64_t iters = 1000;
    std::uint64_t warmup = 100;
    std::uint32_t window = 16;
    std::uint32_t eager_limit = 8192;
    bool event = false;
    bool busy_poll = false;  ///< endpoint_options::busy_poll
    bool take_fd = false;    ///< ask for fd() at once, as an application that sleeps on it does
    bool one_buffer = false; ///< tag_bw: every send from, every receive into, the same bytes
    bool allocate = false;   ///< tag_bw: the sender's buffers from domain::allocate_memory
    bool json = false;
    int timeout_ms = 20000;
    std::uint32_t peers = 0;                ///< server: size the completion queue for this many peers
    std::uint32_t takeover_check_us = 1000; ///< connection_options::tcp.takeover_check
};

/// Connection-rate runs: the client's endpoints and the server's connections use send
/// queues this small, so that the server's completion queue for 1024 peers stays small.
constexpr std::uint32_t many_peers_send_queue = 8;

std::size_t parse_size(const std::string& s)
{
    std::size_t mult = 1;
    std::string num = s;
    if (!s.empty() && (s.back() == 'K' || s.back() == 'M')) {
        mult = s.back() == 'K' ? 1024 : 1024 * 1024;
        num.pop_back();
    }
    return std::stoull(num) * mult;
}

std::string own_address(const std::string& server)
{
    auto colon = server.rfind(':');
    if (colon == std::string::npos)
        throw std::runtime_error("address must be scheme://host:port: " + server);
    return server.substr(0, colon) + ":0";
}

void check(std::error_code ec, const char* what)
{
    if (ec)
        throw rdmx::error(ec, std::string("endpoint ") + what);
}

/// Calls of poll() (or wait()) that returned nothing, and the time they took: what a
/// busy poller pays per look, measured by the clock reads the deadline takes anyway.
struct empty_polls {
    std::uint64_t count = 0;
    clock_type::duration time{};
};
empty_polls empty_polls_seen;

/// Throws for an error completion.
void check(const rdmx::endpoint_completion& wc)
{
    if (wc.status)
        throw std::runtime_error(std::string(rdmx::to_string(wc.op)) + " failed: " + wc.status.message());
}

/// Polls (or sleeps, -e) until one completion arrives; throws on an error completion or at
/// the deadline.
rdmx::endpoint_completion next(rdmx::endpoint& ep, const options& o)
{
    auto t = clock_type::now();
    const auto deadline = t + std::chrono::milliseconds(o.timeout_ms);
    rdmx::endpoint_completion wc;
    for (;;) {
        std::size_t n = o.event ? ep.wait({&wc, 1}, std::chrono::milliseconds(100)) : ep.poll({&wc, 1});
        if (n) {
            check(wc);
            return wc;
        }
        const auto now = clock_type::now();
        ++empty_polls_seen.count;
        empty_polls_seen.time += now - t;
        t = now;
        if (now > deadline)
            throw std::runtime_error("no completion within " + std::to_string(o.timeout_ms) + " ms");
    }
}

/// endpoint::open, then fd() if -F: poll() keeps the queue armed for a sleeper from then on
/// (docs/endpoints.md, "Spinning without busy_poll"), which is what -F measures.
std::unique_ptr<rdmx::endpoint> open_endpoint(rdmx::domain& dom, const std::string& address,
                                              const rdmx::endpoint_options& eo, const options& o)
{
    auto ep = rdmx::endpoint::open(dom, address, eo);
    if (o.take_fd)
        (void)ep->fd();
    return ep;
}

rdmx::endpoint_options ep_options(const options& o, std::size_t size)
{
    rdmx::endpoint_options eo;
    eo.eager_limit = o.eager_limit;
    eo.connection.timeout = std::chrono::milliseconds(o.timeout_ms);
    eo.connection.send_queue_depth = std::max<std::uint32_t>(64, 2 * o.window + 8);
    eo.busy_poll = o.busy_poll;
    eo.connection.tcp.takeover_check = std::chrono::microseconds(o.takeover_check_us);
    if (o.peers > 0) {
        // docs/endpoints.md: the completion queue reserves each connection's send queue
        // and the shared receive queue's depth, twice per peer during a simultaneous
        // connect.
        eo.connection.send_queue_depth = many_peers_send_queue;
        eo.completion_queue_depth = eo.receive_buffers + 2 * o.peers * many_peers_send_queue + 256;
    }
    (void)size;
    return eo;
}

/// A client endpoint of a connection-rate run: a handful of buffers and queue entries, as
/// tests/endpoint_race_test.cpp's clients of one endpoint with more than 1024 peers.
rdmx::endpoint_options tiny_options(const options& o)
{
    rdmx::endpoint_options eo;
    eo.eager_limit = o.eager_limit;
    eo.connection.timeout = std::chrono::milliseconds(o.timeout_ms);
    eo.connection.send_queue_depth = many_peers_send_queue;
    eo.connect_deadline = std::chrono::milliseconds(o.timeout_ms);
    eo.receive_buffers = 4;
    eo.unexpected_limit = 4;
    eo.completion_queue_depth = 64;
    eo.max_queued_ops = 4;
    eo.max_posted_recvs = 4;
    return eo;
}

/// Each endpoint holds several fds (listener, event queue, completion queue, epoll set,
/// timerfd, eventfd) and each connection more: take what the hard limit allows.
void raise_fd_limit()
{
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/// The server: echoes tag_ping, counts tag_data, answers tag_fin with tag_fin_ack once
/// all the data it announced arrived. Buffers of the largest size in flight, W + 2 of them.
int run_server(const options& o)
{
    std::size_t size = parse_size(o.size);
    auto dom = rdmx::domain::open(o.address);
    auto ep = open_endpoint(*dom, o.address, ep_options(o, size), o);
    std::size_t nbuf = o.window + 4;
    std::vector<std::byte> mem(nbuf * size + 64);
    auto mr =
        dom->register_memory(mem.data(), mem.size(), rdmx::access::local_write | rdmx::access::remote_read);
    auto post = [&](std::size_t i) {
        rdmx::sge s{mr.get(), o.one_buffer ? 0 : i * size, size};
        check(ep->recv(rdmx::any_peer, 0, served_tags, {&s, 1}, i), "recv");
    };
    for (std::size_t i = 0; i < nbuf; ++i)
        post(i);
    std::printf("rdmx_ep_perf: listening on %s\n", ep->address().c_str());
    std::fflush(stdout);
    std::vector<std::uint64_t> received; // per peer index: data messages since the last FIN
    options forever = o;
    forever.timeout_ms = 1 << 30;
    for (;;) {
        rdmx::endpoint_completion wc = next(*ep, forever);
        if (wc.op != rdmx::endpoint_op::recv)
            continue; // our pongs and fin acks
        std::size_t i = wc.context;
        std::size_t peer = static_cast<std::uint64_t>(wc.peer) & 0xffffffff;
        if (received.size() <= peer)
            received.resize(peer + 1);
        if (wc.tag == tag_ping) {
            rdmx::sge s{mr.get(), i * size, wc.length};
            check(ep->send(wc.peer, tag_pong, {&s, 1}, 1ull << 40), "send (pong)");
        } else if (wc.tag == tag_data) {
            ++received[peer];
        } else if (wc.tag == tag_fin) {
            std::uint64_t want;
            std::memcpy(&want, mem.data() + i * size, sizeof want);
            if (want != received[peer])
                std::fprintf(stderr, "rdmx_ep_perf: FIN announced %llu messages, %llu arrived\n",
                             static_cast<unsigned long long>(want),
                             static_cast<unsigned long long>(received[peer]));
            received[peer] = 0;
            rdmx::sge s{mr.get(), nbuf * size, 8};
            check(ep->send(wc.peer, tag_fin_ack, {&s, 1}, 1ull << 40), "send (fin ack)");
        }
        post(i);
    }
}

struct row {
    std::string test;
    std::size_t size;
    double value;    ///< latency in us (one way), or MB/s
    double msg_rate; ///< bandwidth tests: messages per second
    double p99 = 0;
    double total_s = 0;       ///< conn_rate: first insert to last pong
    double empty_poll_us = 0; ///< tag_lat: mean time of a poll() that found nothing
};

/// One ping-pong on `ep` to `server` with buffer offset 0 (send) and `size` (receive).
double ping(rdmx::endpoint& ep, rdmx::peer server, rdmx::memory_region& mr, std::size_t size,
            const options& o)
{
    auto t0 = clock_type::now();
    rdmx::sge in{&mr, size, size}, out{&mr, 0, size};
    check(ep.recv(server, tag_pong, 0, {&in, 1}, 1), "recv (pong)");
    check(ep.send(server, tag_ping, {&out, 1}, 2), "send (ping)");
    for (int left = 2; left > 0; --left)
        next(ep, o);
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

row run_lat(const options& o, std::size_t size)
{
    auto dom = rdmx::domain::open(o.address);
    auto ep = open_endpoint(*dom, own_address(o.address), ep_options(o, size), o);
    std::vector<std::byte> mem(2 * size);
    auto mr =
        dom->register_memory(mem.data(), mem.size(), rdmx::access::local_write | rdmx::access::remote_read);
    rdmx::peer server = ep->insert(o.address);
    for (std::uint64_t k = 0; k < o.warmup; ++k)
        ping(*ep, server, *mr, size, o);
    std::vector<double> rtt(o.iters);
    empty_polls_seen = {};
    for (auto& v : rtt)
        v = ping(*ep, server, *mr, size, o);
    std::sort(rtt.begin(), rtt.end());
    row r{"tag_lat", size, rtt[rtt.size() / 2] / 2, 0, rtt[rtt.size() * 99 / 100] / 2};
    if (empty_polls_seen.count)
        r.empty_poll_us =
            std::chrono::duration<double, std::micro>(empty_polls_seen.time).count() / empty_polls_seen.count;
    return r;
}

row run_self_lat(const options& o, std::size_t size)
{
    auto dom_a = rdmx::domain::open(o.address);
    auto dom_b = rdmx::domain::open(o.address);
    const auto eo = ep_options(o, size);
    auto a = open_endpoint(*dom_a, o.address, eo, o);
    auto b = open_endpoint(*dom_b, own_address(o.address), eo, o);
    std::vector<std::byte> mem_a(2 * size), mem_b(2 * size);
    const auto rights = rdmx::access::local_write | rdmx::access::remote_read;
    auto mr_a = dom_a->register_memory(mem_a.data(), mem_a.size(), rights);
    auto mr_b = dom_b->register_memory(mem_b.data(), mem_b.size(), rights);
    rdmx::peer to_b = a->insert(b->address()), to_a = b->insert(a->address());
    rdmx::sge a_out{mr_a.get(), 0, size}, a_in{mr_a.get(), size, size};
    rdmx::sge b_out{mr_b.get(), 0, size}, b_in{mr_b.get(), size, size};
    // One thread serves both, as a service serves its peers: each wait polls the endpoint
    // it waits on, then the other (whose calls send what a post held for the next one, and
    // take its connection's events). As tag_lat's two sides: a waits for the pong and its
    // ping's completion, b for the ping; b's pong completes when a's ACK comes.
    bool a_recv = false, a_send = false, b_recv = false, b_send = false; // b_send: not waited for
    auto take = [](rdmx::endpoint& ep, bool& recv, bool& send) {
        rdmx::endpoint_completion wc[4];
        const std::size_t n = ep.poll(wc);
        for (std::size_t i = 0; i < n; ++i) {
            check(wc[i]);
            (wc[i].op == rdmx::endpoint_op::recv ? recv : send) = true;
        }
    };
    auto drive = [&](bool a_first, auto done) {
        const auto deadline = clock_type::now() + std::chrono::milliseconds(o.timeout_ms);
        while (!done()) {
            if (a_first) {
                take(*a, a_recv, a_send);
                take(*b, b_recv, b_send);
            } else {
                take(*b, b_recv, b_send);
                take(*a, a_recv, a_send);
            }
            if (!done() && clock_type::now() > deadline)
                throw std::runtime_error("no completion within " + std::to_string(o.timeout_ms) + " ms");
        }
    };
    auto round_trip = [&] {
        auto t0 = clock_type::now();
        a_recv = a_send = b_recv = false;
        check(b->recv(to_a, tag_ping, 0, {&b_in, 1}, 1), "recv (ping)");
        check(a->recv(to_b, tag_pong, 0, {&a_in, 1}, 1), "recv (pong)");
        check(a->send(to_b, tag_ping, {&a_out, 1}, 2), "send (ping)");
        drive(false, [&] { return b_recv; });
        check(b->send(to_a, tag_pong, {&b_out, 1}, 3), "send (pong)");
        drive(true, [&] { return a_recv && a_send; });
        return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
    };
    for (std::uint64_t k = 0; k < o.warmup; ++k)
        round_trip();
    std::vector<double> rtt(o.iters);
    for (auto& v : rtt)
        v = round_trip();
    std::sort(rtt.begin(), rtt.end());
    return {"self_lat", size, rtt[rtt.size() / 2] / 2, 0, rtt[rtt.size() * 99 / 100] / 2};
}

/// Sends tag_flood messages until killed: as many as the endpoint takes (it queues what
/// the server's credit does not cover, and says would_block when its queue is full).
int run_flood(const options& o, std::size_t size)
{
    auto dom = rdmx::domain::open(o.address);
    auto ep = rdmx::endpoint::open(*dom, own_address(o.address), ep_options(o, size));
    std::vector<std::byte> mem(size);
    auto mr =
        dom->register_memory(mem.data(), mem.size(), rdmx::access::local_write | rdmx::access::remote_read);
    rdmx::peer server = ep->insert(o.address);
    rdmx::endpoint_completion out[64];
    std::uint64_t issued = 0, completed = 0;
    auto report = clock_type::now() + std::chrono::seconds(1);
    for (;;) {
        rdmx::sge s{mr.get(), 0, size};
        std::error_code ec = ep->send(server, tag_flood, {&s, 1}, 0);
        if (ec && ec != rdmx::errc::would_block)
            throw rdmx::error(ec, "endpoint send (flood)");
        issued += !ec;
        std::size_t n = ec ? ep->wait(out, std::chrono::milliseconds(10)) : ep->poll(out);
        for (std::size_t i = 0; i < n; ++i) {
            if (out[i].status)
                throw rdmx::error(out[i].status, "endpoint send (flood) completion");
            ++completed;
        }
        if (clock_type::now() >= report) {
            // Where the flood stands: how many sends the server's credit let complete.
            std::printf("flood: %llu sends issued, %llu completed\n", static_cast<unsigned long long>(issued),
                        static_cast<unsigned long long>(completed));
            std::fflush(stdout);
            report += std::chrono::seconds(1);
        }
    }
}

row run_first_msg(const options& o)
{
    auto dom = rdmx::domain::open(o.address);
    std::vector<double> t;
    for (std::uint64_t k = 0; k < o.iters; ++k) {
        auto ep = rdmx::endpoint::open(*dom, own_address(o.address), ep_options(o, 8));
        std::vector<std::byte> mem(16);
        auto mr = dom->register_memory(mem.data(), mem.size(), rdmx::access::local_write);
        auto t0 = clock_type::now(); // from insert(): the lazy connect and one round trip
        rdmx::peer server = ep->insert(o.address);
        ping(*ep, server, *mr, 8, o);
        t.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return {"first_msg", 8, t[t.size() / 2], 0, t[t.size() * 99 / 100]};
}

row run_conn_rate(const options& o)
{
    raise_fd_limit();
    auto dom = rdmx::domain::open(o.address);
    std::size_t n = o.iters;
    std::vector<std::unique_ptr<rdmx::endpoint>> eps;
    eps.reserve(n);
    for (std::size_t k = 0; k < n; ++k) {
        try {
            eps.push_back(rdmx::endpoint::open(*dom, own_address(o.address), tiny_options(o)));
        } catch (const std::exception& e) {
            rlimit rl{};
            ::getrlimit(RLIMIT_NOFILE, &rl);
            throw std::runtime_error("opening client endpoint " + std::to_string(k) + " of " +
                                     std::to_string(n) + " (RLIMIT_NOFILE " + std::to_string(rl.rlim_cur) +
                                     "): " + e.what());
        }
    }
    // Per endpoint 16 bytes of one region: the ping at 16k, the pong at 16k + 8.
    std::vector<std::byte> mem(16 * n);
    auto mr = dom->register_memory(mem.data(), mem.size(), rdmx::access::local_write);
    enum class state : std::uint8_t { waiting, connecting, done };
    std::vector<state> st(n, state::waiting);
    std::vector<int> left(n, 2); // completions still due: the send's and the pong's
    std::vector<clock_type::time_point> started(n);
    std::vector<double> t(n);
    std::vector<std::size_t> active; // endpoints connecting, at most W
    std::size_t next_ep = 0, finished = 0, sweep = 0;
    auto t0 = clock_type::now();
    while (finished < n) {
        while (active.size() < o.window && next_ep < n) {
            std::size_t k = next_ep++;
            started[k] = clock_type::now();
            rdmx::peer server = eps[k]->insert(o.address);
            rdmx::sge in{mr.get(), 16 * k + 8, 8}, out{mr.get(), 16 * k, 8};
            check(eps[k]->recv(server, tag_pong, 0, {&in, 1}, 1), "recv (pong)");
            check(eps[k]->send(server, tag_ping, {&out, 1}, 2), "send (ping)");
            st[k] = state::connecting;
            active.push_back(k);
        }
        auto now = clock_type::now();
        for (std::size_t a = 0; a < active.size();) {
            std::size_t k = active[a];
            rdmx::endpoint_completion wc;
            while (left[k] > 0 && eps[k]->poll({&wc, 1}) == 1) {
                if (wc.status)
                    throw std::runtime_error("peer " + std::to_string(k) + ": " +
                                             std::string(rdmx::to_string(wc.op)) +
                                             " failed: " + wc.status.message());
                --left[k];
            }
            if (left[k] == 0) {
                t[k] = std::chrono::duration<double, std::micro>(clock_type::now() - started[k]).count();
                st[k] = state::done;
                ++finished;
                active[a] = active.back();
                active.pop_back();
                continue;
            }
            if (now - started[k] > std::chrono::milliseconds(o.timeout_ms))
                throw std::runtime_error("peer " + std::to_string(k) + ": no pong within " +
                                         std::to_string(o.timeout_ms) + " ms");
            ++a;
        }
        // The connected ones are polled too, one per pass in turn, so that whatever their
        // connections bring (nothing, normally) is taken without costing each pass n polls.
        if (finished > 0) {
            std::size_t k = sweep++ % next_ep;
            rdmx::endpoint_completion wc;
            if (st[k] == state::done && eps[k]->poll({&wc, 1}) == 1 && wc.status)
                throw std::runtime_error("peer " + std::to_string(k) +
                                         " after its pong: " + wc.status.message());
        }
    }
    double total = std::chrono::duration<double>(clock_type::now() - t0).count();
    std::sort(t.begin(), t.end());
    row r{"conn_rate", 8, t[t.size() / 2], static_cast<double>(n) / total, t[t.size() * 99 / 100]};
    r.total_s = total;
    return r;
}

row run_bw(const options& o, std::size_t size)
{
    auto dom = rdmx::domain::open(o.address);
    auto ep = open_endpoint(*dom, own_address(o.address), ep_options(o, size), o);
    std::vector<std::byte> mem;
    std::unique_ptr<rdmx::memory_region> mr;
    const auto rights = rdmx::access::local_write | rdmx::access::remote_read;
    if (o.allocate) {
        // From domain::allocate_memory: over shm:// the receiver's rendezvous reads are
        // copies it makes itself from its mapping of this memory.
        mr = dom->allocate_memory(o.window * size + 16, rights);
    } else {
        mem.resize(o.window * size + 16);
        mr = dom->register_memory(mem.data(), mem.size(), rights);
    }
    for (std::size_t i = 0; i < mr->size(); ++i)
        mr->data()[i] = static_cast<std::byte>(i * 13);
    rdmx::peer server = ep->insert(o.address);
    auto burst = [&](std::uint64_t n) {
        std::uint64_t sent = 0, done = 0;
        while (done < n) {
            while (sent < n && sent - done < o.window) {
                rdmx::sge s{mr.get(), o.one_buffer ? 0 : (sent % o.window) * size, size};
                auto ec = ep->send(server, tag_data, {&s, 1}, sent);
                if (ec == rdmx::errc::would_block)
                    break;
                check(ec, "send (data)");
                ++sent;
            }
            next(*ep, o);
            ++done;
        }
        std::memcpy(mr->data() + o.window * size, &n, sizeof n);
        rdmx::sge fin{mr.get(), o.window * size, 8}, ack{mr.get(), o.window * size + 8, 8};
        check(ep->recv(server, tag_fin_ack, 0, {&ack, 1}, 1ull << 41), "recv (fin ack)");
        check(ep->send(server, tag_fin, {&fin, 1}, 1ull << 42), "send (fin)");
        for (int left = 2; left > 0; --left)
            next(*ep, o);
    };
    burst(std::max<std::uint64_t>(o.warmup, 1));
    auto t0 = clock_type::now();
    burst(o.iters);
    double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    return {"tag_bw", size, static_cast<double>(o.iters * size) / s / 1e6, static_cast<double>(o.iters) / s};
}

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"rdmx_ep_perf: tagged messages over rdmx endpoints"};
    options o;
    app.add_option(
           "address", o.address,
           "the server's tcp://HOST:PORT, shm://NAME:PORT or rdma://HOST:PORT (self_lat: where the first "
           "of its two endpoints listens; port 0 picks one)")
        ->required();
    app.add_flag("--server", o.server, "serve runs until killed");
    app.add_option("-t,--test", o.test, "tag_lat | tag_bw | first_msg | conn_rate | flood | self_lat")
        ->check(CLI::IsMember({"tag_lat", "tag_bw", "first_msg", "conn_rate", "flood", "self_lat"}));
    app.add_option("-s,--size", o.size, "message size (suffixes K, M)");
    app.add_option("-n,--iters", o.iters, "measured iterations")->check(CLI::Range(1ull, 1ull << 40));
    app.add_option("-w,--warmup", o.warmup, "iterations before measuring");
    app.add_option("-W,--window", o.window, "tag_bw: sends in flight; conn_rate: peers connecting at once")
        ->check(CLI::Range(1, 1024));
    app.add_option("--peers", o.peers, "server: size the completion queue for this many peers")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--eager-limit", o.eager_limit, "endpoint_options::eager_limit (both sides)");
    app.add_flag("-e,--event", o.event, "sleep on the endpoint's fd instead of busy polling");
    app.add_flag("-B,--busy-poll", o.busy_poll, "endpoint_options::busy_poll: no notification kept armed");
    app.add_flag("-F,--take-fd", o.take_fd,
                 "ask for the endpoint's fd() at once (as an application that sleeps on it): poll() keeps "
                 "the queue armed");
    app.add_flag("--allocate", o.allocate,
                 "tag_bw: the sender's buffers from domain::allocate_memory (shm://: the receiver "
                 "copies the rendezvous data itself)");
    app.add_flag("-1,--one-buffer", o.one_buffer,
                 "tag_bw (give it to both sides): every send from, every receive into, the same bytes, as "
                 "fi_rdm_tagged_bw and ucx_perftest do");
    app.add_option(
           "--takeover-check-us", o.takeover_check_us,
           "tcp://, shm://: connection_options::tcp.takeover_check, how often a stood-down engine wakes "
           "to see whether the poller still calls (this side)")
        ->check(CLI::Range(100u, 1000000u));
    app.add_flag("--json", o.json, "one JSON line");
    app.add_option("--timeout-ms", o.timeout_ms, "bound on every wait");
    CLI11_PARSE(app, argc, argv);
    bool window_given = app.count("-W") > 0;
    try {
        if (o.server) {
            if (o.peers > 0)
                raise_fd_limit();
            return run_server(o);
        }
        std::size_t size = parse_size(o.size);
        if (o.test == "conn_rate" && !window_given)
            o.window = 64;
        if (o.test == "flood")
            return run_flood(o, size);
        row r = o.test == "tag_lat"     ? run_lat(o, size)
                : o.test == "self_lat"  ? run_self_lat(o, size)
                : o.test == "tag_bw"    ? run_bw(o, size)
                : o.test == "conn_rate" ? run_conn_rate(o)
                                        : run_first_msg(o);
        if (o.json && r.test == "conn_rate")
            std::printf("{\"test\": \"conn_rate\", \"peers\": %llu, \"inflight\": %u, \"total_s\": %.4f, "
                        "\"conn_s\": %.1f, \"lat_us\": %.3f, \"p99_us\": %.3f}\n",
                        static_cast<unsigned long long>(o.iters), o.window, r.total_s, r.msg_rate, r.value,
                        r.p99);
        else if (o.json)
            std::printf("{\"test\": \"%s\", \"size\": %zu, \"%s\": %.3f, \"msg_s\": %.0f, \"p99_us\": %.3f, "
                        "\"empty_poll_us\": %.3f}\n",
                        r.test.c_str(), r.size, r.test == "tag_bw" ? "mb_s" : "lat_us", r.value, r.msg_rate,
                        r.p99, r.empty_poll_us);
        else if (r.test == "conn_rate")
            std::printf("conn_rate  %llu peers, %u at once: %.3f s, %.0f connections/s; to first pong "
                        "%.1f us (median), %.1f us (p99)\n",
                        static_cast<unsigned long long>(o.iters), o.window, r.total_s, r.msg_rate, r.value,
                        r.p99);
        else
            std::printf("%-10s %8zu B  %s %.3f%s\n", r.test.c_str(), r.size,
                        r.test == "tag_bw" ? "MB/s" : "us (median)", r.value,
                        r.test == "tag_bw"
                            ? (" " + std::to_string(static_cast<long>(r.msg_rate)) + " msg/s").c_str()
                            : "");
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rdmx_ep_perf: %s\n", e.what());
        return 1;
    }
}
