// rdmx_ep_perf: tagged-message latency, message rate and bandwidth over rdmx endpoints
// (rdmx/endpoint.hpp), and the cost of a lazy connection, for bench/endpoints.sh to set
// beside fi_pingpong over ofi_rxm and ucx_perftest.
//
//   rdmx_ep_perf --server tcp://127.0.0.1:7700              (serves runs until killed)
//   rdmx_ep_perf tcp://127.0.0.1:7700 -t tag_lat -s 8 -n 10000
//   rdmx_ep_perf tcp://127.0.0.1:7700 -t tag_bw -s 1M -n 2000 -W 16
//   rdmx_ep_perf tcp://127.0.0.1:7700 -t first_msg -n 50   (a new endpoint per message)
//
// tag_lat: ping-pong of `size` bytes; one-way latency = round trip / 2 (as fi_pingpong).
// tag_bw: a window of W sends in flight; after n of them the client sends FIN, which the
//   server answers once all n arrived (messages from one peer arrive in order), so the
//   time runs from the first send to the answer. Sizes above the eager limit go by
//   rendezvous. Reports MB/s (1e6 B/s) and messages/s.
// first_msg: each iteration opens a new client endpoint (a new incarnation), then times
//   insert() of the server and one 8 B ping-pong: the lazy connect included, the open not.
// Every wait is bounded by --timeout-ms; -e sleeps on the endpoint's fd instead of polling.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

namespace
{

using clock_type = std::chrono::steady_clock;

constexpr std::uint64_t tag_ping = 1, tag_pong = 2, tag_data = 3, tag_fin = 4, tag_fin_ack = 5;

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
    bool json = false;
    int timeout_ms = 20000;
};

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

/// Polls (or sleeps, -e) until one completion arrives; throws on an error completion or at
/// the deadline.
rdmx::endpoint_completion next(rdmx::endpoint& ep, const options& o)
{
    auto deadline = clock_type::now() + std::chrono::milliseconds(o.timeout_ms);
    rdmx::endpoint_completion wc;
    for (;;) {
        std::size_t n = o.event ? ep.wait({&wc, 1}, std::chrono::milliseconds(100)) : ep.poll({&wc, 1});
        if (n) {
            if (wc.status)
                throw std::runtime_error(std::string(rdmx::to_string(wc.op)) +
                                         " failed: " + wc.status.message());
            return wc;
        }
        if (clock_type::now() > deadline)
            throw std::runtime_error("no completion within " + std::to_string(o.timeout_ms) + " ms");
    }
}

rdmx::endpoint_options ep_options(const options& o, std::size_t size)
{
    rdmx::endpoint_options eo;
    eo.eager_limit = o.eager_limit;
    eo.connection.timeout = std::chrono::milliseconds(o.timeout_ms);
    eo.connection.send_queue_depth = std::max<std::uint32_t>(64, 2 * o.window + 8);
    (void)size;
    return eo;
}

/// The server: echoes tag_ping, counts tag_data, answers tag_fin with tag_fin_ack once
/// all the data it announced arrived. Buffers of the largest size in flight, W + 2 of them.
int run_server(const options& o)
{
    std::size_t size = parse_size(o.size);
    auto dom = rdmx::domain::open(o.address);
    auto ep = rdmx::endpoint::open(*dom, o.address, ep_options(o, size));
    std::size_t nbuf = o.window + 4;
    std::vector<std::byte> mem(nbuf * size + 64);
    auto mr =
        dom->register_memory(mem.data(), mem.size(), rdmx::access::local_write | rdmx::access::remote_read);
    auto post = [&](std::size_t i) {
        rdmx::sge s{mr.get(), i * size, size};
        check(ep->recv(rdmx::any_peer, 0, ~std::uint64_t{0}, {&s, 1}, i), "recv");
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
    auto ep = rdmx::endpoint::open(*dom, own_address(o.address), ep_options(o, size));
    std::vector<std::byte> mem(2 * size);
    auto mr =
        dom->register_memory(mem.data(), mem.size(), rdmx::access::local_write | rdmx::access::remote_read);
    rdmx::peer server = ep->insert(o.address);
    for (std::uint64_t k = 0; k < o.warmup; ++k)
        ping(*ep, server, *mr, size, o);
    std::vector<double> rtt(o.iters);
    for (auto& v : rtt)
        v = ping(*ep, server, *mr, size, o);
    std::sort(rtt.begin(), rtt.end());
    return {"tag_lat", size, rtt[rtt.size() / 2] / 2, 0, rtt[rtt.size() * 99 / 100] / 2};
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

row run_bw(const options& o, std::size_t size)
{
    auto dom = rdmx::domain::open(o.address);
    auto ep = rdmx::endpoint::open(*dom, own_address(o.address), ep_options(o, size));
    std::vector<std::byte> mem(o.window * size + 16);
    for (std::size_t i = 0; i < mem.size(); ++i)
        mem[i] = static_cast<std::byte>(i * 13);
    auto mr =
        dom->register_memory(mem.data(), mem.size(), rdmx::access::local_write | rdmx::access::remote_read);
    rdmx::peer server = ep->insert(o.address);
    auto burst = [&](std::uint64_t n) {
        std::uint64_t sent = 0, done = 0;
        while (done < n) {
            while (sent < n && sent - done < o.window) {
                rdmx::sge s{mr.get(), (sent % o.window) * size, size};
                auto ec = ep->send(server, tag_data, {&s, 1}, sent);
                if (ec == rdmx::errc::would_block)
                    break;
                check(ec, "send (data)");
                ++sent;
            }
            next(*ep, o);
            ++done;
        }
        std::memcpy(mem.data() + o.window * size, &n, sizeof n);
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
    app.add_option("address", o.address, "the server's tcp://HOST:PORT or rdma://HOST:PORT")->required();
    app.add_flag("--server", o.server, "serve runs until killed");
    app.add_option("-t,--test", o.test, "tag_lat | tag_bw | first_msg")
        ->check(CLI::IsMember({"tag_lat", "tag_bw", "first_msg"}));
    app.add_option("-s,--size", o.size, "message size (suffixes K, M)");
    app.add_option("-n,--iters", o.iters, "measured iterations")->check(CLI::Range(1ull, 1ull << 40));
    app.add_option("-w,--warmup", o.warmup, "iterations before measuring");
    app.add_option("-W,--window", o.window, "tag_bw: sends in flight")->check(CLI::Range(1, 1024));
    app.add_option("--eager-limit", o.eager_limit, "endpoint_options::eager_limit (both sides)");
    app.add_flag("-e,--event", o.event, "sleep on the endpoint's fd instead of busy polling");
    app.add_flag("--json", o.json, "one JSON line");
    app.add_option("--timeout-ms", o.timeout_ms, "bound on every wait");
    CLI11_PARSE(app, argc, argv);
    try {
        if (o.server)
            return run_server(o);
        std::size_t size = parse_size(o.size);
        row r = o.test == "tag_lat"  ? run_lat(o, size)
                : o.test == "tag_bw" ? run_bw(o, size)
                                     : run_first_msg(o);
        if (o.json)
            std::printf(
                "{\"test\": \"%s\", \"size\": %zu, \"%s\": %.3f, \"msg_s\": %.0f, \"p99_us\": %.3f}\n",
                r.test.c_str(), r.size, r.test == "tag_bw" ? "mb_s" : "lat_us", r.value, r.msg_rate, r.p99);
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
