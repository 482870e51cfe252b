// TCP engine behaviour beyond the backend conformance suite: IPv6, revocation, go-back-N,
// hostile peers, backpressure, both engines streaming at each other, and rough numbers.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include "backends.hpp"
#include "common/test_data.hpp"
#include "common/test_util.hpp"
#include "cq_reservation.hpp"
#include "resolve.hpp"
#include "tcp/raw_peer.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_engine.hpp"

namespace rdmx::test
{
namespace
{

class tcp_engine : public tcp_loopback
{
protected:
    tcp_engine() : tcp_loopback(16) {}
};

bool wait_state(connection& c, connection_state s, std::chrono::milliseconds t = 5s)
{
    auto deadline = std::chrono::steady_clock::now() + t;
    while (std::chrono::steady_clock::now() < deadline) {
        if (c.state() == s)
            return true;
        std::this_thread::sleep_for(1ms);
    }
    return c.state() == s;
}

/// A busy ping-pong of small sends, 300 round trips: enough read wake-ups that find the
/// application polling for both engines to stand down (docs/tcp-engine.md).
void busy_ping_pong(connection& client, connection& server, const sge& cs, const sge& ss)
{
    for (std::uint64_t i = 0; i < 300; ++i) {
        ASSERT_FALSE(server.post_recv({&ss, 1}, i));
        ASSERT_FALSE(client.post_recv({&cs, 1}, i));
        ASSERT_FALSE(client.post_send({&cs, 1}, i));
        expect_ok(server, 1, 5s); // the ping
        ASSERT_FALSE(server.post_send({&ss, 1}, i));
        expect_ok(server, 1, 5s); // the pong's completion
        expect_ok(client, 2, 5s); // the ping's completion and the pong
    }
}

TEST_F(tcp_engine, device_limits_name_tcp)
{
    EXPECT_EQ(server_dom_->limits().device_name, "tcp");
    EXPECT_EQ(server_dom_->backend(), backend::tcp);
    connection_options o;
    o.send_queue_depth = 1u << 30;
    o.max_send_sge = 1000;
    o.max_inline = 1u << 20;
    auto p = connect_pair(o);
    EXPECT_EQ(p.client->limits().send_queue_depth, 16384u);
    EXPECT_EQ(p.client->limits().max_send_sge, 32u);
    EXPECT_EQ(p.client->limits().max_inline, 4096u);
}

TEST_F(tcp_engine, ipv6_loopback)
{
    std::unique_ptr<listener> l6;
    try {
        l6 = server_dom_->listen("tcp://[::1]:0");
    } catch (const rdmx::error& e) {
        GTEST_SKIP() << "no IPv6 loopback: " << e.what();
    }
    auto acc =
        std::async(std::launch::async, [&] { return l6->get_request(5s)->accept({}, as_bytes("v6")); });
    auto c = client_dom_->connect("tcp://[::1]:" + std::to_string(l6->port()), {}, as_bytes("hi"));
    auto s = acc.get();
    EXPECT_EQ(as_string(c->peer_private_data()), "v6");
    EXPECT_EQ(as_string(s->peer_private_data()), "hi");
    // The v6 listener is bound to ::1 only: 127.0.0.1 on that port is refused.
    connection_options o;
    o.timeout = 2s;
    EXPECT_THROW(client_dom_->connect("tcp://127.0.0.1:" + std::to_string(l6->port()), o), rdmx::error);
}

TEST_F(tcp_engine, request_destroyed_unanswered_rejects)
{
    auto t = std::async(std::launch::async, [&] {
        auto req = listener_->get_request(5s);
        ASSERT_NE(req, nullptr);
    });
    try {
        client_dom_->connect(addr());
        ADD_FAILURE() << "connect succeeded";
    } catch (const rdmx::error& e) {
        EXPECT_EQ(e.code(), errc::rejected) << e.what();
        EXPECT_TRUE(e.private_data().empty());
    }
    t.get();
}

TEST_F(tcp_engine, get_request_times_out_and_private_data_limits)
{
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(listener_->get_request(50ms), nullptr);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
    std::string big(57, 'x');
    EXPECT_THROW(client_dom_->connect(addr(), {}, as_bytes(big)), rdmx::error);
}

TEST_F(tcp_engine, connect_error_names_the_step)
{
    connection_options o;
    o.timeout = 2s;
    try {
        client_dom_->connect("tcp://127.0.0.1:1", o);
        FAIL();
    } catch (const rdmx::error& e) {
        EXPECT_EQ(e.code(), errc::connection_refused);
        EXPECT_NE(std::string(e.what()).find("connect tcp://127.0.0.1:1"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("connect(): Connection refused"), std::string::npos) << e.what();
    }
}

// A name that resolves to several addresses is tried address by address, by connect() and
// start_connect() alike (one flow): the first refuses, the second is the listener's. The
// name exists only on a thread of this test, in a mount namespace of its own where a hosts
// file of ours covers /etc/hosts (root: CAP_SYS_ADMIN); getaddrinfo orders 127.0.0.1 before
// 127.0.0.2 (RFC 6724's longest matching prefix), so the listener takes the second.
TEST_F(tcp_engine, a_name_with_several_addresses_is_tried_address_by_address)
{
    auto second = server_dom_->listen("tcp://127.0.0.2:0");
    const std::string port = std::to_string(second->port());
    auto cq = client_dom_->create_completion_queue({.depth = 1024});
    std::string skip;
    auto dialler = std::async(std::launch::async, [&]() -> std::vector<std::unique_ptr<connection>> {
        if (::unshare(CLONE_NEWNS) != 0 ||
            ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
            skip = std::string("a mount namespace of its own needs CAP_SYS_ADMIN: ") + std::strerror(errno);
            return {};
        }
        char path[] = "/tmp/rdmx-hosts-XXXXXX";
        int fd = ::mkstemp(path);
        if (fd < 0)
            throw std::runtime_error("mkstemp");
        const std::string hosts = "127.0.0.2 rdmx-two-addresses\n127.0.0.1 rdmx-two-addresses\n";
        bool written = ::write(fd, hosts.data(), hosts.size()) == static_cast<ssize_t>(hosts.size());
        ::close(fd);
        int mounted = written ? ::mount(path, "/etc/hosts", nullptr, MS_BIND, nullptr) : -1;
        ::unlink(path); // the mount holds the file
        if (mounted != 0)
            throw std::runtime_error("cannot cover /etc/hosts");
        const std::string name = "tcp://rdmx-two-addresses:" + port;
        auto addrs = detail::resolve(uri::parse(name), false, "test");
        if (addrs.size() != 2 ||
            reinterpret_cast<const sockaddr_in&>(addrs[0].addr).sin_addr.s_addr != htonl(INADDR_LOOPBACK))
            throw std::runtime_error("the name does not resolve to 127.0.0.1, then 127.0.0.2");
        std::vector<std::unique_ptr<connection>> out;
        connection_options o;
        o.timeout = 5s;
        out.push_back(client_dom_->connect(name, o));
        o.send_cq = cq; // a redialled socket joins the shared queue's epoll set too
        o.recv_cq = cq;
        out.push_back(client_dom_->start_connect(name, o));
        return out;
    });
    std::vector<std::unique_ptr<connection>> servers;
    for (int i = 0; i < 2 && skip.empty(); ++i)
        if (auto req = second->get_request(i == 0 ? 10s : 2s))
            servers.push_back(req->accept({}));
    auto clients = dialler.get();
    if (!skip.empty())
        GTEST_SKIP() << skip;
    ASSERT_EQ(clients.size(), 2u);
    ASSERT_EQ(servers.size(), 2u);
    EXPECT_EQ(clients[0]->state(), connection_state::established);
    ASSERT_TRUE(wait_state(*clients[1], connection_state::established));
    // Both work: a message each way, the second client's completions from its shared queue.
    std::vector<std::byte> buf(64);
    auto mr = client_dom_->register_memory(buf.data(), buf.size(), access::local_write);
    std::vector<std::byte> sbuf(64);
    auto smr = server_dom_->register_memory(sbuf.data(), sbuf.size(), access::local_write);
    for (std::size_t i = 0; i < 2; ++i) {
        sge cs{mr.get(), 0, 8}, ss{smr.get(), 0, 8};
        ASSERT_FALSE(servers[i]->post_recv({&ss, 1}, 1));
        ASSERT_FALSE(clients[i]->post_recv({&cs, 1}, 2));
        ASSERT_FALSE(clients[i]->post_send({&cs, 1}, 3));
        expect_ok(*servers[i], 1, 5s);
        ASSERT_FALSE(servers[i]->post_send({&ss, 1}, 4));
        expect_ok(*servers[i], 1, 5s);
        if (i == 0) {
            expect_ok(*clients[i], 2, 5s);
            continue;
        }
        std::size_t got = 0;
        auto deadline = std::chrono::steady_clock::now() + 5s;
        while (got < 2 && std::chrono::steady_clock::now() < deadline) {
            completion wc[2];
            for (auto& c : std::span(wc).first(cq->poll(wc))) {
                EXPECT_FALSE(c.status) << c.status.message();
                ++got;
            }
        }
        EXPECT_EQ(got, 2u);
    }
}

TEST_F(tcp_engine, deregistration_revokes_remote_access_at_once)
{
    auto p = connect_pair();
    std::vector<std::byte> remote(4096, std::byte{7}), local(4096);
    auto rmr = server_dom_->register_memory(remote.data(), remote.size(), access::remote_read);
    auto lmr = client_dom_->register_memory(local.data(), local.size(), access::local_write);
    auto rb = rmr->remote();
    sge s{lmr.get(), 0, 4096};
    ASSERT_FALSE(p.client->post_read({&s, 1}, rb, 1));
    expect_ok(*p.client, 1);
    EXPECT_EQ(local, remote);
    rmr.reset();
    ASSERT_FALSE(p.client->post_read({&s, 1}, rb, 2));
    auto c = poll_n(*p.client, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, errc::remote_access);
    EXPECT_EQ(c[0].opcode, opcode::unknown);
    EXPECT_TRUE(wait_state(*p.client, connection_state::error));
    // Posting on an errored connection completes as flushed.
    ASSERT_FALSE(p.client->post_read({&s, 1}, rb, 3));
    c = poll_n(*p.client, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, errc::flushed);
    EXPECT_EQ(c[0].wr_id, 3u);
    // The target went to error too, and its posted receives are flushed.
    EXPECT_TRUE(wait_state(*p.server, connection_state::error));
}

TEST_F(tcp_engine, rnr_go_back_n_keeps_order_of_pipelined_requests)
{
    auto p = connect_pair();
    constexpr int n = 20;
    std::vector<std::byte> src(n * 64), dst(n * 64), target(n * 64);
    for (std::size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<std::byte>(i * 7);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dmr = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    auto tmr = server_dom_->register_memory(target.data(), target.size(), access::remote_write);
    // Interleave sends (need receives) and writes (do not): all wait behind the first RNR.
    for (int i = 0; i < n; ++i) {
        sge s{smr.get(), static_cast<std::size_t>(i) * 64, 64};
        if (i % 2 == 0)
            ASSERT_FALSE(p.client->post_send({&s, 1}, static_cast<std::uint64_t>(i)));
        else
            ASSERT_FALSE(p.client->post_write({&s, 1}, tmr->remote(static_cast<std::size_t>(i) * 64, 64),
                                              static_cast<std::uint64_t>(i)));
    }
    std::this_thread::sleep_for(30ms);
    for (int i = 0; i < n / 2; ++i) {
        sge r{dmr.get(), static_cast<std::size_t>(i) * 64, 64};
        ASSERT_FALSE(p.server->post_recv({&r, 1}, static_cast<std::uint64_t>(i)));
        std::this_thread::sleep_for(2ms); // receives trickle in: several RNR rounds
    }
    auto sc = expect_ok(*p.client, n, 20s);
    for (int i = 0; i < static_cast<int>(sc.size()); ++i)
        EXPECT_EQ(sc[static_cast<std::size_t>(i)].wr_id, static_cast<std::uint64_t>(i));
    auto rc = expect_ok(*p.server, n / 2, 20s);
    for (int i = 0; i < n / 2; ++i)
        EXPECT_EQ(0, std::memcmp(dst.data() + i * 64, src.data() + 2 * i * 64, 64)) << i;
    for (int i = 1; i < n; i += 2)
        EXPECT_EQ(0, std::memcmp(target.data() + i * 64, src.data() + i * 64, 64)) << i;
}

// An RNR retry is due after min_rnr_timer whoever progresses the connection: with the
// client domain's engine thread held (as busy pollers on every CPU can keep it off one for
// milliseconds), the application's polls read the NAK and send the retry themselves.
TEST_F(tcp_engine, a_polled_connection_retries_after_rnr_without_its_engine_thread)
{
    auto p = connect_pair();
    std::vector<std::byte> src(64, std::byte{0x5a}), dst(64);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dmr = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    engine_hold hold(*client_dom_);
    sge s{smr.get(), 0, 64};
    ASSERT_FALSE(p.client->post_send({&s, 1}, 7));
    // The server's engine answers RNR (no receive yet); the client's polls read the NAK.
    completion c[1];
    const auto nak_by = std::chrono::steady_clock::now() + 30ms;
    while (std::chrono::steady_clock::now() < nak_by)
        ASSERT_EQ(p.client->poll(c), 0u) << "a send completed without a receive";
    sge r{dmr.get(), 0, 64};
    ASSERT_FALSE(p.server->post_recv({&r, 1}, 8));
    auto sc = expect_ok(*p.client, 1, 5s);
    ASSERT_EQ(sc.size(), 1u) << "the retry waited for the engine thread";
    EXPECT_EQ(sc[0].wr_id, 7u);
    hold.release();
    auto rc = expect_ok(*p.server, 1, 5s);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(dst, src);
}

TEST_F(tcp_engine, unsignaled_error_still_completes_and_later_ones_flush)
{
    auto p = connect_pair();
    std::vector<std::byte> target(64), src(64);
    auto tmr = server_dom_->register_memory(target.data(), target.size(), access::remote_read);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::local_write);
    sge s{smr.get(), 0, 64};
    work_request w[3];
    w[0] = {.opcode = opcode::write,
            .wr_id = 1,
            .local = {&s, 1},
            .remote = tmr->remote(),
            .flags = send_flags::none};
    w[1] = {.opcode = opcode::read,
            .wr_id = 2,
            .local = {&s, 1},
            .remote = tmr->remote(),
            .flags = send_flags::none};
    w[2] = {.opcode = opcode::read, .wr_id = 3, .local = {&s, 1}, .remote = tmr->remote()};
    ASSERT_FALSE(p.client->post(w));
    auto c = poll_n(*p.client, 3);
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c[0].wr_id, 1u);
    EXPECT_EQ(c[0].status, errc::remote_access);
    EXPECT_EQ(c[1].status, errc::flushed);
    EXPECT_EQ(c[2].status, errc::flushed);
}

TEST_F(tcp_engine, destroying_the_peer_flushes_like_a_disconnect)
{
    auto p = connect_pair();
    std::vector<std::byte> b(256);
    auto m = client_dom_->register_memory(b.data(), b.size(), access::local_write);
    sge s{m.get(), 0, 256};
    ASSERT_FALSE(p.client->post_recv({&s, 1}, 5));
    p.server.reset();
    auto c = poll_n(*p.client, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, errc::flushed);
    EXPECT_EQ(p.client->state(), connection_state::disconnected);
}

TEST_F(tcp_engine, both_engines_stream_reads_at_each_other_without_deadlock)
{
    auto p = connect_pair();
    constexpr std::size_t size = 8 << 20;
    std::vector<std::byte> a(size, std::byte{1}), b(size, std::byte{2}), ga(size), gb(size);
    auto am = client_dom_->register_memory(a.data(), size, access::remote_read);
    auto bm = server_dom_->register_memory(b.data(), size, access::remote_read);
    auto gam = client_dom_->register_memory(ga.data(), size, access::local_write);
    auto gbm = server_dom_->register_memory(gb.data(), size, access::local_write);
    for (int round = 0; round < 4; ++round) {
        sge s1{gam.get(), 0, size}, s2{gbm.get(), 0, size};
        ASSERT_FALSE(p.client->post_read({&s1, 1}, bm->remote(), 1));
        ASSERT_FALSE(p.server->post_read({&s2, 1}, am->remote(), 2));
        expect_ok(*p.client, 1, 30s);
        expect_ok(*p.server, 1, 30s);
    }
    EXPECT_EQ(ga, b);
    EXPECT_EQ(gb, a);
}

TEST_F(tcp_engine, reads_beyond_max_rd_atomic_are_paced)
{
    connection_options o;
    o.max_rd_atomic = 1;
    o.send_queue_depth = 256;
    auto p = connect_pair(o);
    std::vector<std::byte> remote(256 * 16), local(256 * 16);
    for (std::size_t i = 0; i < remote.size(); ++i)
        remote[i] = static_cast<std::byte>(i);
    auto rm = server_dom_->register_memory(remote.data(), remote.size(), access::remote_read);
    auto lm = client_dom_->register_memory(local.data(), local.size(), access::local_write);
    for (std::size_t i = 0; i < 256; ++i) {
        sge s{lm.get(), i * 16, 16};
        ASSERT_FALSE(p.client->post_read({&s, 1}, rm->remote(i * 16, 16), i));
    }
    auto c = expect_ok(*p.client, 256);
    EXPECT_EQ(local, remote);
}

TEST_F(tcp_engine, cq_overrun_puts_the_connection_in_error)
{
    connection_options o;
    o.send_queue_depth = 4;
    o.recv_queue_depth = 4;
    auto p = connect_pair(o);
    std::vector<std::byte> t(64), s(64);
    auto tm = server_dom_->register_memory(t.data(), t.size(), access::remote_write);
    auto sm = client_dom_->register_memory(s.data(), s.size(), access::none);
    sge g{sm.get(), 0, 64};
    auto deadline = std::chrono::steady_clock::now() + 5s;
    int posted = 0;
    while (p.client->state() == connection_state::established &&
           std::chrono::steady_clock::now() < deadline) {
        if (!p.client->post_write({&g, 1}, tm->remote(), static_cast<std::uint64_t>(posted)))
            ++posted;
        else
            std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(p.client->state(), connection_state::error);
    EXPECT_GE(posted, 8);
}

TEST_F(tcp_engine, solicited_only_notification)
{
    auto p = connect_pair();
    std::vector<std::byte> src(16), dst(64);
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dm = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    for (int i = 0; i < 2; ++i) {
        sge r{dm.get(), static_cast<std::size_t>(i) * 16, 16};
        ASSERT_FALSE(p.server->post_recv({&r, 1}, static_cast<std::uint64_t>(i)));
    }
    ASSERT_FALSE(p.server->request_notify(true));
    sge s{sm.get(), 0, 16};
    ASSERT_FALSE(p.client->post_send({&s, 1}, 1)); // not solicited: no event
    expect_ok(*p.client, 1);
    std::this_thread::sleep_for(20ms);
    pollfd pfd{p.server->completion_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&pfd, 1, 0), 0);
    ASSERT_FALSE(p.client->post_send({&s, 1}, 2, send_flags::signaled | send_flags::solicited));
    EXPECT_EQ(::poll(&pfd, 1, 5000), 1);
    ASSERT_FALSE(p.server->ack_notify());
    EXPECT_EQ(::poll(&pfd, 1, 0), 0) << "ack_notify drains the event";
    expect_ok(*p.server, 2);
    expect_ok(*p.client, 1);
}

/// The engine over shm:// (UNIX sockets, CMA for large one-sided payloads).
class shm_engine : public tcp_engine
{
protected:
    shm_engine() { b_ = backend::shm; }
};

TEST_F(shm_engine, a_write_imm_by_cma_keeps_its_immediate_and_solicited_bit)
{
    // 64 KiB: over the CMA size, so the frame is WRITE_IMM_CMA; its receive completion
    // carries the immediate, and only the solicited one wakes a solicited-only waiter.
    auto p = connect_pair();
    constexpr std::size_t n = 64 * 1024;
    std::vector<std::byte> src(n, std::byte{0x5a}), dst(2 * n), rbuf(16);
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dm =
        server_dom_->register_memory(dst.data(), dst.size(), access::local_write | access::remote_write);
    auto rm = server_dom_->register_memory(rbuf.data(), rbuf.size(), access::local_write);
    for (int i = 0; i < 2; ++i) {
        sge r{rm.get(), 0, 16};
        ASSERT_FALSE(p.server->post_recv({&r, 1}, static_cast<std::uint64_t>(10 + i)));
    }
    ASSERT_FALSE(p.server->request_notify(true));
    const std::uint64_t cma0 = tcp::cma_requests_completed();
    sge s{sm.get(), 0, n};
    ASSERT_FALSE(p.client->post_write_imm({&s, 1}, dm->remote(), 7, 1)); // not solicited: no event
    expect_ok(*p.client, 1);
    std::this_thread::sleep_for(20ms);
    pollfd pfd{p.server->completion_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&pfd, 1, 0), 0);
    ASSERT_FALSE(p.client->post_write_imm({&s, 1}, *dm->remote().slice(n, n), 8, 2,
                                          send_flags::signaled | send_flags::solicited));
    EXPECT_EQ(::poll(&pfd, 1, 5000), 1) << "the solicited bit was lost";
    expect_ok(*p.client, 1);
    auto rc = expect_ok(*p.server, 2);
    ASSERT_EQ(rc.size(), 2u);
    EXPECT_EQ(rc[0].imm, 7u);
    EXPECT_EQ(rc[1].imm, 8u);
    EXPECT_EQ(rc[0].byte_len, n);
    EXPECT_EQ(tcp::cma_requests_completed() - cma0, 2u) << "not both by CMA";
    EXPECT_EQ(dst, std::vector<std::byte>(2 * n, std::byte{0x5a}));
}

TEST_F(shm_engine, a_large_send_by_cma_lands_in_a_receive_of_several_sges)
{
    // 200 KiB from two SGEs into a receive of three: the target reads the sender's ranges
    // into the receive's pieces (SEND_CMA), as a send frame's payload would land.
    auto p = connect_pair();
    constexpr std::size_t n = 200 * 1024;
    std::vector<std::byte> src(n), dst(n + 30000, std::byte{0x11});
    for (std::size_t i = 0; i < n; ++i)
        src[i] = static_cast<std::byte>((i * 7 + i / 1000) & 0xff);
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dm = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    const sge r[3] = {
        {dm.get(), 0, 50000}, {dm.get(), 60000, 100000}, {dm.get(), 170000, n + 30000 - 170000}};
    ASSERT_FALSE(p.server->post_recv(r, 5));
    const std::uint64_t cma0 = tcp::cma_requests_completed();
    const sge s[2] = {{sm.get(), 0, 70000}, {sm.get(), 70000, n - 70000}};
    ASSERT_FALSE(p.client->post_send(s, 1, send_flags::signaled | send_flags::solicited));
    expect_ok(*p.client, 1);
    auto rc = expect_ok(*p.server, 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].opcode, opcode::recv);
    EXPECT_EQ(rc[0].byte_len, n);
    EXPECT_EQ(tcp::cma_requests_completed() - cma0, 1u) << "the send did not go by CMA";
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), 50000), 0);
    EXPECT_EQ(std::memcmp(dst.data() + 60000, src.data() + 50000, 100000), 0);
    EXPECT_EQ(std::memcmp(dst.data() + 170000, src.data() + 150000, n - 150000), 0);
    EXPECT_EQ(dst[55000], std::byte{0x11}) << "a byte between the receive's pieces was written";
}

TEST_F(shm_engine, a_send_by_cma_waits_for_a_receive_and_one_too_large_fails_both_sides)
{
    connection_options o;
    o.rnr_retry_count = 7;
    auto p = connect_pair(o);
    constexpr std::size_t n = 64 * 1024;
    std::vector<std::byte> src(n, std::byte{0x3c}), dst(n, std::byte{0});
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dm = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    // No receive yet: RNR, and the send goes again once one is posted.
    sge s{sm.get(), 0, n};
    ASSERT_FALSE(p.client->post_send({&s, 1}, 1));
    std::this_thread::sleep_for(30ms);
    sge r{dm.get(), 0, n};
    ASSERT_FALSE(p.server->post_recv({&r, 1}, 2));
    expect_ok(*p.client, 1);
    auto rc = expect_ok(*p.server, 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].byte_len, n);
    EXPECT_EQ(dst, src);
    // Larger than the receive: local_length at the receiver, an invalid request at the
    // sender, both connections in error, as for a send frame.
    sge small{dm.get(), 0, n / 2};
    ASSERT_FALSE(p.server->post_recv({&small, 1}, 3));
    ASSERT_FALSE(p.client->post_send({&s, 1}, 4));
    auto cc = poll_n(*p.client, 1);
    ASSERT_EQ(cc.size(), 1u);
    EXPECT_EQ(cc[0].status, errc::remote_invalid_request);
    auto sc = poll_n(*p.server, 1);
    ASSERT_EQ(sc.size(), 1u);
    EXPECT_EQ(sc[0].status, errc::local_length);
}

TEST_F(tcp_engine, burst_of_small_frames_reaches_a_sleeping_receiver)
{
    // Hundreds of small sends arrive at once: the receiver's engine reads them a staging
    // buffer at a time and stops after a budget of frames per run, with frames left in the
    // buffer and nothing left in the socket to wake it. Every message must still arrive,
    // in order, at a receiver that sleeps in wait() (and at one that polls now and then).
    connection_options opts;
    opts.send_queue_depth = 1024;
    opts.recv_queue_depth = 1024;
    auto p = connect_pair(opts);
    constexpr std::size_t n = 1000;
    std::vector<std::byte> src(n * 4), dst(n * 4);
    for (std::size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<std::byte>(i * 7 + 1);
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dm = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    for (int round = 0; round < 2; ++round) {
        std::vector<recv_request> rr(n);
        std::vector<sge> rs(n);
        std::vector<work_request> wr(n);
        std::vector<sge> ws(n);
        for (std::size_t i = 0; i < n; ++i) {
            rs[i] = {dm.get(), i * 4, 4};
            rr[i] = {.wr_id = i, .local = {&rs[i], 1}};
            ws[i] = {sm.get(), i * 4, 4};
            // Zero-length sends in between: frames without payload, one step each.
            wr[i] = {.opcode = opcode::send,
                     .wr_id = i,
                     .local = {&ws[i], i % 3 == 0 ? 0u : 1u},
                     .flags = i + 1 == n ? send_flags::signaled : send_flags::none};
        }
        ASSERT_FALSE(p.server->post_recv(rr));
        std::fill(dst.begin(), dst.end(), std::byte{0});
        ASSERT_FALSE(p.client->post(wr));
        std::vector<completion> got;
        completion c[64];
        auto deadline = std::chrono::steady_clock::now() + 10s;
        while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
            std::size_t k = round == 0 ? p.server->wait(c, 100ms) : p.server->poll(c);
            got.insert(got.end(), c, c + k);
            if (round == 1 && k == 0)
                std::this_thread::sleep_for(2ms);
        }
        ASSERT_EQ(got.size(), n) << (round == 0 ? "sleeping" : "polling") << " receiver";
        for (std::size_t i = 0; i < n; ++i) {
            ASSERT_FALSE(got[i].status) << got[i].status.message();
            ASSERT_EQ(got[i].wr_id, i);
            ASSERT_EQ(got[i].byte_len, i % 3 == 0 ? 0u : 4u);
        }
        for (std::size_t i = 0; i < n; ++i) {
            if (i % 3 != 0) {
                ASSERT_EQ(0, std::memcmp(dst.data() + i * 4, src.data() + i * 4, 4)) << "message " << i;
            }
        }
        expect_ok(*p.client, 1, 5s);
    }
}

TEST_F(tcp_engine, frames_left_staged_at_the_end_of_a_receive_run_are_served)
{
    // Bursts of zero-length writes written in one piece by a raw peer, to a target whose
    // application calls nothing: the engine reads them a staging buffer at a time and ends
    // a run after a budget of frames, sometimes with frames staged and the socket empty, so
    // that no readiness event will come. Every burst size up to 160 frames must be
    // acknowledged to the last frame.
    int fd;
    auto c = accept_raw(fd);
    ASSERT_NE(c, nullptr);
    std::uint64_t seq = 0;
    for (std::size_t n = 1; n <= 160; ++n) {
        std::vector<std::byte> wire(n * frame_header::wire_size);
        for (std::size_t i = 0; i < n; ++i) {
            frame_header h;
            h.op = frame_op::write; // zero length: touches nothing, needs no key
            h.seq = seq + i;
            h.encode(wire.data() + i * frame_header::wire_size);
        }
        for (std::size_t off = 0; off < wire.size();) {
            ssize_t k = ::send(fd, wire.data() + off, wire.size() - off, MSG_NOSIGNAL);
            ASSERT_GT(k, 0);
            off += static_cast<std::size_t>(k);
        }
        seq += n;
        // ACKs are cumulative: read them until the one for the burst's last frame.
        std::uint64_t acked = 0;
        while (acked != seq) {
            pollfd pfd{fd, POLLIN, 0};
            ASSERT_EQ(::poll(&pfd, 1, 5000), 1) << "burst of " << n << " frames: acknowledged up to " << acked
                                                << " of " << seq << ", the rest stayed staged";
            frame_header r;
            ASSERT_TRUE(read_header(fd, r));
            ASSERT_EQ(r.op, frame_op::ack);
            acked = r.seq + 1;
        }
    }
    EXPECT_EQ(c->state(), connection_state::established);
    ::close(fd);
}

// The takeover check's interval (connection_options::tcp.takeover_check): the default, and
// a longer one, as a user who trades takeover delay for fewer engine wake-ups sets it.
class tcp_engine_takeover : public tcp_engine, public testing::WithParamInterface<std::chrono::microseconds>
{
};

TEST_P(tcp_engine_takeover, transfer_left_by_a_polling_application_completes_without_it)
{
    // A busy-polling application keeps sending a large transfer from its own post() and
    // poll() calls instead of handing it to the engine (tcp_connection.cpp, app_keeps_tx).
    // Once it stops calling, the engine must take over: the whole write lands while the
    // initiator calls nothing at all. First right after a poll (a receiver draining fast
    // may let the first sendmsg take it all), then after a busy ping-pong that let the
    // engines stand down (the receiver then drains only after its stand-down check, so
    // the initiator's socket fills and the transfer stops in the application's hands).
    connection_options opts;
    opts.tcp.takeover_check = GetParam();
    auto p = connect_pair(opts);
    constexpr std::size_t big = 24u << 20;
    std::vector<std::byte> src(big), dst(big), ping(64);
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::local_write);
    auto dm =
        server_dom_->register_memory(dst.data(), dst.size(), access::local_write | access::remote_write);
    auto pm = client_dom_->register_memory(ping.data(), ping.size(), access::local_write);
    auto qm = server_dom_->register_memory(ping.data(), ping.size(), access::local_write);
    for (int phase = 0; phase < 2; ++phase) {
        if (phase == 1) {
            sge cs{pm.get(), 0, 8}, ss{qm.get(), 32, 8};
            ASSERT_NO_FATAL_FAILURE(busy_ping_pong(*p.client, *p.server, cs, ss));
        }
        for (std::size_t i = 0; i < big; ++i)
            src[i] = static_cast<std::byte>((i >> 12) + i * 13 + phase);
        completion none[1];
        ASSERT_EQ(p.client->poll(none), 0u); // polling, right now
        sge w{sm.get(), 0, big};
        ASSERT_FALSE(p.client->post_write({&w, 1}, dm->remote(0, big), 7));
        // From here the client calls nothing for a while: far longer than the checks (1 or
        // 20 ms) and the transfer need. Its first poll() afterwards must then find the write
        // complete: one poll() sends at most 1 MiB and cannot also get the ACK back. (No
        // peeking at the target memory meanwhile: that would race with the engine writing
        // it.)
        std::this_thread::sleep_for(1500ms);
        completion first[2];
        std::size_t n = p.client->poll(first);
        ASSERT_EQ(n, 1u) << "phase " << phase << ": the write stopped when the application stopped calling";
        EXPECT_FALSE(first[0].status) << first[0].status.message();
        EXPECT_EQ(first[0].wr_id, 7u);
        // The server's engine wrote dst under the server connection's mutex: taking it (a
        // poll of the server side) orders those writes before the comparison, for
        // ThreadSanitizer too (it cannot see the ordering through the socket).
        completion none_yet[1];
        EXPECT_EQ(p.server->poll(none_yet), 0u);
        EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), big)) << "phase " << phase;
    }
}

INSTANTIATE_TEST_SUITE_P(check, tcp_engine_takeover, testing::Values(1000us, 20000us),
                         [](const testing::TestParamInfo<std::chrono::microseconds>& i) {
                             return std::to_string(i.param.count()) + "us";
                         });

/// The congestion control algorithm (TCP_CONGESTION, read back from the kernel) of each
/// connected TCP socket of this process whose local or remote port is `port`.
std::vector<std::string> congestion_on_port(std::uint16_t port)
{
    std::vector<std::string> out;
    for (int fd = 0; fd < 4096; ++fd) {
        sockaddr_in local{}, peer{};
        socklen_t ll = sizeof local, pl = sizeof peer;
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || local.sin_family != AF_INET ||
            ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
            continue;
        if (ntohs(local.sin_port) != port && ntohs(peer.sin_port) != port)
            continue;
        char name[32] = {};
        socklen_t nl = sizeof name - 1;
        if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &nl) == 0)
            out.emplace_back(name);
    }
    return out;
}

std::string system_congestion()
{
    std::string s;
    if (FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r")) {
        char buf[32] = {};
        if (std::fgets(buf, sizeof buf, f))
            s = buf;
        std::fclose(f);
    }
    while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
        s.pop_back();
    return s;
}

TEST_F(tcp_engine, congestion_control_is_each_sides_choice_or_the_systems)
{
    // connection_options::tcp.congestion: both ends of the connection run the algorithm
    // asked for ("reno" is built into every kernel), data moves; left empty, the system's.
    {
        auto p = connect_pair();
        std::string sys = system_congestion();
        ASSERT_FALSE(sys.empty());
        EXPECT_EQ(congestion_on_port(port_), (std::vector<std::string>{sys, sys}));
    }
    // The engines close those sockets on their own threads: wait until they are gone.
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!congestion_on_port(port_).empty() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(congestion_on_port(port_).empty());
    connection_options opts;
    opts.tcp.congestion = "reno";
    auto p = connect_pair(opts);
    EXPECT_EQ(congestion_on_port(port_), (std::vector<std::string>{"reno", "reno"}));
    std::vector<std::byte> src(1 << 20), dst(1 << 20);
    for (std::size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<std::byte>(i * 7 + 3);
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::local_write);
    auto dm =
        server_dom_->register_memory(dst.data(), dst.size(), access::local_write | access::remote_write);
    sge w{sm.get(), 0, src.size()};
    ASSERT_FALSE(p.client->post_write({&w, 1}, dm->remote(0, dst.size()), 1));
    ASSERT_EQ(expect_ok(*p.client, 1).size(), 1u);
    completion none[1];
    EXPECT_EQ(p.server->poll(none), 0u); // orders the engine's writes before the comparison
    EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), src.size()));
}

TEST_F(tcp_engine, unknown_congestion_control_fails_the_side_that_asked_for_it)
{
    // On connect: before the hello, so the listener never sees a request.
    auto connect_fails = [&](const std::string& name, std::error_code expected, const std::string& text) {
        connection_options o;
        o.tcp.congestion = name;
        try {
            client_dom_->connect(addr(), o);
            ADD_FAILURE() << name << ": connect succeeded";
        } catch (const rdmx::error& e) {
            // An errno arrives in the system category: compare it as a condition.
            EXPECT_TRUE(e.code() == expected || e.code() == expected.default_error_condition()) << e.what();
            EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
        }
        EXPECT_EQ(listener_->get_request(300ms), nullptr) << name;
    };
    connect_fails("no-such-cc", std::make_error_code(std::errc::no_such_file_or_directory),
                  "setsockopt(TCP_CONGESTION, \"no-such-cc\")");
    // A name longer than the kernel's limit (15 bytes) would be cut and could match.
    connect_fails("reno-and-then-some", errc::invalid_argument, "at most 15 bytes");
    connection_options bad;
    bad.tcp.congestion = "no-such-cc";
    // On accept: the request stays unanswered, and the client is rejected.
    auto t = std::async(std::launch::async, [&] {
        auto req = listener_->get_request(5s);
        ASSERT_NE(req, nullptr);
        try {
            req->accept(bad);
            ADD_FAILURE() << "accept succeeded";
        } catch (const rdmx::error& e) {
            EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory) << e.what();
        }
    });
    try {
        client_dom_->connect(addr());
        ADD_FAILURE() << "connect succeeded";
    } catch (const rdmx::error& e) {
        EXPECT_EQ(e.code(), errc::rejected) << e.what();
    }
    t.get();
}

TEST_F(tcp_engine, requests_left_for_coalescing_go_out_when_the_application_stops_calling)
{
    // A busy application posting one request per call with many in flight: post() leaves
    // the newest requests for its next call, to send several in one sendmsg
    // (coalesce_post). When the application stops calling right after a post, the engine
    // must send them (from its own receive runs or its transmit check): the receiver gets
    // every message while the sender calls nothing.
    connection_options opts;
    opts.send_queue_depth = 512;
    opts.recv_queue_depth = 512;
    auto p = connect_pair(opts);
    constexpr std::size_t n = 400, len = 4096;
    std::vector<std::byte> src(n * len), dst(n * len);
    for (std::size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<std::byte>(i * 31 + 7);
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dm = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    for (std::size_t i = 0; i < n; ++i) {
        sge r{dm.get(), i * len, len};
        ASSERT_FALSE(p.server->post_recv({&r, 1}, i));
    }
    completion none[4];
    for (std::size_t i = 0; i < n; ++i) {
        sge s{sm.get(), i * len, len};
        ASSERT_FALSE(p.client->post_send({&s, 1}, i, i + 1 == n ? send_flags::signaled : send_flags::none));
        // A tight loop: post and poll, then (the last 100) posts back to back, so that the
        // last post() leaves requests behind.
        if (i < n - 100) {
            ASSERT_EQ(p.client->poll(none), 0u);
        }
    }
    // From here only the server is called.
    std::size_t got = 0;
    completion wc[64];
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (got < n && std::chrono::steady_clock::now() < deadline) {
        std::size_t k = p.server->poll(wc);
        for (std::size_t j = 0; j < k; ++j) {
            ASSERT_FALSE(wc[j].status) << wc[j].status.message();
            ASSERT_EQ(wc[j].wr_id, got + j);
        }
        got += k;
    }
    ASSERT_EQ(got, n) << "the requests a post() left for the next call never went out";
    EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), dst.size()));
}

TEST_F(tcp_engine, target_that_stops_polling_still_serves_one_sided_requests)
{
    // Busy-polling ping-pong lets both engines stand down and leave the sockets to poll()
    // (docs/tcp-engine.md); then the server's application goes quiet, and the
    // client's writes and reads must still be served, and a send must still wake wait().
    auto p = connect_pair();
    std::vector<std::byte> cbuf(4096, std::byte{1}), sbuf(4096, std::byte{2});
    auto cm = client_dom_->register_memory(cbuf.data(), cbuf.size(), access::local_write);
    auto sm = server_dom_->register_memory(sbuf.data(), sbuf.size(),
                                           access::local_write | access::remote_write | access::remote_read);
    sge cs{cm.get(), 0, 8}, ss{sm.get(), 0, 8};
    ASSERT_NO_FATAL_FAILURE(busy_ping_pong(*p.client, *p.server, cs, ss));
    std::this_thread::sleep_for(5ms);
    // The server's application calls nothing from here on, until wait().
    for (std::size_t i = 0; i < 64; ++i)
        cbuf[1024 + i] = static_cast<std::byte>(i);
    sge w{cm.get(), 1024, 64}, r{cm.get(), 2048, 64};
    ASSERT_FALSE(p.client->post_write({&w, 1}, sm->remote(512, 64), 1));
    ASSERT_FALSE(p.client->post_read({&r, 1}, sm->remote(512, 64), 2));
    expect_ok(*p.client, 2, 5s);
    EXPECT_EQ(0, std::memcmp(sbuf.data() + 512, cbuf.data() + 1024, 64));
    EXPECT_EQ(0, std::memcmp(cbuf.data() + 2048, cbuf.data() + 1024, 64));
    ASSERT_FALSE(p.server->post_recv({&ss, 1}, 1000));
    ASSERT_FALSE(p.client->post_send({&cs, 1}, 3));
    completion c{};
    auto deadline = std::chrono::steady_clock::now() + 5s;
    std::size_t got = 0;
    while (got == 0 && std::chrono::steady_clock::now() < deadline)
        got = p.server->wait({&c, 1}, 100ms);
    ASSERT_EQ(got, 1u);
    EXPECT_FALSE(c.status);
    EXPECT_EQ(c.wr_id, 1000u);
    expect_ok(*p.client, 1, 5s);
}

TEST_F(tcp_engine, target_that_only_posts_still_serves_one_sided_requests)
{
    // Once stood down, the engine stays down while the application keeps calling post(),
    // polls or not (the stand-down check counts every call). An application that posts a
    // long window without polling must then read from post() itself: the peer's read has
    // to be served while the server is still posting, not once it stops.
    auto p = connect_pair();
    std::vector<std::byte> cbuf(4096, std::byte{1}), sbuf(4096, std::byte{2});
    auto cm =
        client_dom_->register_memory(cbuf.data(), cbuf.size(), access::local_write | access::remote_write);
    auto sm =
        server_dom_->register_memory(sbuf.data(), sbuf.size(), access::local_write | access::remote_read);
    sge cs{cm.get(), 0, 8}, ss{sm.get(), 0, 8};
    ASSERT_NO_FATAL_FAILURE(busy_ping_pong(*p.client, *p.server, cs, ss)); // both engines stand down
    for (std::size_t i = 0; i < 64; ++i)
        sbuf[2048 + i] = static_cast<std::byte>(i * 3 + 1);
    std::atomic<bool> read_done{false};
    std::atomic<std::uint64_t> posts{0}, posts_at_done{0};
    std::thread poster([&] {
        // Unsignaled writes into the client's memory, back to back, never a poll().
        sge w{sm.get(), 0, 64};
        auto deadline = std::chrono::steady_clock::now() + 5s;
        while (!read_done.load() && std::chrono::steady_clock::now() < deadline) {
            auto ec = p.server->post_write({&w, 1}, cm->remote(3072, 64), 0, send_flags::none);
            if (!ec)
                posts.fetch_add(1);
            else if (ec != errc::would_block)
                break;
        }
        posts_at_done = posts.load();
        std::this_thread::sleep_for(20ms); // still not polling: only the read counted
    });
    // Well into the posting loop. The send queue's slots come back only from ACKs that
    // post() reads, so without those reads the count stalls at the queue depth.
    auto until = std::chrono::steady_clock::now() + 3s;
    while (posts.load() < 1000 && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
    if (posts.load() < 1000) {
        read_done = true;
        poster.join();
        FAIL() << "post() stalled at " << posts.load() << " requests: nothing reads the ACKs";
    }
    sge r{cm.get(), 512, 64};
    ASSERT_FALSE(p.client->post_read({&r, 1}, sm->remote(2048, 64), 9));
    auto got = poll_n(*p.client, 1, 3s);
    read_done = true;
    poster.join();
    ASSERT_EQ(got.size(), 1u) << "the read was not served while the target only posted";
    EXPECT_FALSE(got[0].status) << got[0].status.message();
    EXPECT_EQ(got[0].wr_id, 9u);
    EXPECT_GT(posts_at_done.load(), 1000u);
    EXPECT_EQ(0, std::memcmp(cbuf.data() + 512, sbuf.data() + 2048, 64));
}

TEST_F(tcp_engine, slow_large_payload_is_not_taken_for_a_dead_peer)
{
    // In the middle of a large payload the engine wakes only once a good part of it has
    // arrived (SO_RCVLOWAT, set_rcvlowat). A peer that sends one slowly thus leaves bytes
    // unread in the socket for longer than the progress bound: that peer is alive, so the
    // target's own outstanding request must not fail with transport_retry_exceeded, and
    // the write must land whole.
    connection_options o;
    o.ack_timeout = 100ms; // with retry_count 1: the 1 s floor of the progress bound
    o.retry_count = 1;
    int fd;
    auto c = accept_raw(fd, o);
    ASSERT_NE(c, nullptr);
    constexpr std::size_t len = 512u << 10;
    std::vector<std::byte> dst(len), payload(len), ping(8, std::byte{5});
    for (std::size_t i = 0; i < len; ++i)
        payload[i] = static_cast<std::byte>(i * 7 + (i >> 10));
    auto dm = server_dom_->register_memory(dst.data(), len, access::local_write | access::remote_write);
    auto pm = server_dom_->register_memory(ping.data(), ping.size(), access::none);
    sge s{pm.get(), 0, 8};
    ASSERT_FALSE(c->post_send({&s, 1}, 1)); // outstanding until the raw peer ACKs it, at the end
    frame_header h;
    h.op = frame_op::write;
    h.seq = 0;
    h.length = static_cast<std::uint32_t>(len);
    h.addr = dm->remote(0, len).addr;
    h.key = dm->remote(0, len).key;
    ASSERT_TRUE(send_header(fd, h));
    // 8 KiB every 100 ms for 2 s: 160 KiB, below the wake threshold, over the 1 s bound.
    std::size_t off = 0;
    for (int i = 0; i < 20; ++i, off += 8192) {
        ASSERT_EQ(::send(fd, payload.data() + off, 8192, MSG_NOSIGNAL), 8192);
        std::this_thread::sleep_for(100ms);
    }
    EXPECT_EQ(c->state(), connection_state::established) << "a slow peer was taken for a dead one";
    while (off < len) {
        ssize_t n = ::send(fd, payload.data() + off, len - off, MSG_NOSIGNAL);
        ASSERT_GT(n, 0);
        off += static_cast<std::size_t>(n);
    }
    // Our write's ACK and the target's send, in either order.
    bool acked = false, sent = false;
    while (!(acked && sent)) {
        frame_header r;
        ASSERT_TRUE(read_header(fd, r));
        if (r.op == frame_op::ack) {
            EXPECT_EQ(r.seq, 0u);
            acked = true;
        } else {
            ASSERT_EQ(r.op, frame_op::send) << "unexpected frame";
            std::byte body[8];
            ASSERT_EQ(::recv(fd, body, 8, MSG_WAITALL), 8);
            sent = true;
        }
    }
    frame_header a;
    a.op = frame_op::ack;
    a.seq = 0;
    ASSERT_TRUE(send_header(fd, a));
    auto done = expect_ok(*c, 1, 5s); // also orders the engine's writes to dst before the compare
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].wr_id, 1u);
    EXPECT_EQ(c->state(), connection_state::established);
    EXPECT_EQ(0, std::memcmp(dst.data(), payload.data(), len));
    ::close(fd);
}

TEST_F(tcp_engine, sleeping_target_wakes_for_the_rest_of_a_payload_its_poll_began)
{
    // The engine's read wait in the middle of a large payload wakes once a good part of it
    // has arrived (SO_RCVLOWAT). The application's poll() may read part of that payload
    // meanwhile; the mark must come down with it. Otherwise an application that then
    // sleeps (request_notify) is never woken for the rest and the send after it: the
    // socket holds fewer bytes than the mark, and the peer sends nothing more until it
    // hears from us (issue 15: event-mode targets stalled until the dead-peer bound).
    int fd;
    auto c = accept_raw(fd);
    ASSERT_NE(c, nullptr);
    constexpr std::size_t len = 300u << 10, first = 8u << 10, middle = 200u << 10, msg = 16;
    std::vector<std::byte> dst(len), payload(len + msg), inbox(msg);
    for (std::size_t i = 0; i < payload.size(); ++i)
        payload[i] = static_cast<std::byte>(i * 13 + (i >> 9));
    auto dm = server_dom_->register_memory(dst.data(), len, access::local_write | access::remote_write);
    auto im = server_dom_->register_memory(inbox.data(), msg, access::local_write);
    sge in{im.get(), 0, msg};
    ASSERT_FALSE(c->post_recv({&in, 1}, 7));
    frame_header w;
    w.op = frame_op::write;
    w.seq = 0;
    w.length = static_cast<std::uint32_t>(len);
    w.addr = dm->remote(0, len).addr;
    w.key = dm->remote(0, len).key;
    ASSERT_TRUE(send_header(fd, w));
    ASSERT_EQ(::send(fd, payload.data(), first, MSG_NOSIGNAL), static_cast<ssize_t>(first));
    // The engine reads those and waits for a good part of the rest; 200 KiB stay below
    // that mark, so they wait for the application's poll, which reads them itself.
    std::this_thread::sleep_for(100ms);
    ASSERT_EQ(::send(fd, payload.data() + first, middle, MSG_NOSIGNAL), static_cast<ssize_t>(middle));
    std::this_thread::sleep_for(100ms);
    completion cs[4];
    EXPECT_EQ(c->poll(cs), 0u);
    ASSERT_FALSE(c->request_notify());
    EXPECT_EQ(c->poll(cs), 0u);
    // The application sleeps now. The rest of the payload, then a send.
    for (std::size_t off = first + middle; off < len;) {
        ssize_t n = ::send(fd, payload.data() + off, len - off, MSG_NOSIGNAL);
        ASSERT_GT(n, 0);
        off += static_cast<std::size_t>(n);
    }
    frame_header sh;
    sh.op = frame_op::send;
    sh.seq = 1;
    sh.length = msg;
    ASSERT_TRUE(send_header(fd, sh));
    ASSERT_EQ(::send(fd, payload.data() + len, msg, MSG_NOSIGNAL), static_cast<ssize_t>(msg));
    pollfd pfd{c->completion_fd(), POLLIN, 0};
    ASSERT_EQ(::poll(&pfd, 1, 5000), 1) << "the sleeping target was never woken for the send";
    ASSERT_FALSE(c->ack_notify());
    auto got = poll_n(*c, 1, 5s);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_FALSE(got[0].status) << got[0].status.message();
    EXPECT_EQ(got[0].wr_id, 7u);
    EXPECT_EQ(got[0].byte_len, msg);
    EXPECT_EQ(0, std::memcmp(dst.data(), payload.data(), len)) << "the write did not land whole";
    EXPECT_EQ(0, std::memcmp(inbox.data(), payload.data() + len, msg));
    // Both requests are acknowledged (ACKs are cumulative: one for seq 1 may cover both).
    for (;;) {
        frame_header r;
        ASSERT_TRUE(read_header(fd, r));
        ASSERT_EQ(r.op, frame_op::ack) << "unexpected frame";
        if (r.seq == 1)
            break;
    }
    ::close(fd);
}

// ---- hostile peers --------------------------------------------------------------------

// On tcp and on shm (the same engine over a UNIX socket: a malicious local peer).
class hostile : public tcp_engine, public testing::WithParamInterface<backend>
{
protected:
    hostile() { b_ = GetParam(); }

    /// Connects a raw peer, accepts it with a posted receive (wr_id 99 into buf_), and
    /// returns the server side.
    std::unique_ptr<connection> accept_receiving(int& fd)
    {
        auto c = accept_raw(fd);
        if (!c)
            return nullptr;
        buf_.assign(4096, std::byte{0x11});
        mr_ = server_dom_->register_memory(buf_.data(), buf_.size(),
                                           access::local_write | access::remote_write | access::remote_read);
        sge r{mr_.get(), 0, 1024};
        EXPECT_FALSE(c->post_recv({&r, 1}, 99));
        return c;
    }
    void expect_flushed_error(connection& c)
    {
        auto cs = poll_n(c, 1);
        ASSERT_EQ(cs.size(), 1u);
        EXPECT_EQ(cs[0].wr_id, 99u);
        EXPECT_EQ(cs[0].status, errc::flushed);
        EXPECT_TRUE(wait_state(c, connection_state::error));
        EXPECT_EQ(buf_, std::vector<std::byte>(4096, std::byte{0x11})) << "memory touched";
    }
    /// Reads the next frame the engine sent to the raw peer: it must be NAK remote_access.
    void expect_remote_access_nak(int fd, frame_header& r)
    {
        ASSERT_TRUE(read_header(fd, r));
        EXPECT_EQ(r.op, frame_op::nak);
        EXPECT_EQ(r.status, static_cast<std::uint32_t>(tcp::nak_code::remote_access));
    }
    /// From the raw peer `fd`, with a tiny receive buffer and never reading the answers:
    /// 40 MB of 4 KiB read requests of buf_ (about 4 GB of answers, far beyond every
    /// socket buffer involved), sent for at most `for_how_long`. True if the server
    /// stopped taking them before all were sent (backpressure).
    bool flood_reads(int fd, std::chrono::milliseconds for_how_long)
    {
        int small = 4096;
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        frame_header h;
        h.op = frame_op::read_req;
        h.length = 4096;
        h.addr = reinterpret_cast<std::uintptr_t>(buf_.data());
        h.key = mr_->remote().key;
        constexpr int count = 1000000;
        std::vector<std::byte> many(40 * std::size_t{count});
        for (int i = 0; i < count; ++i) {
            h.seq = static_cast<std::uint64_t>(i);
            h.encode(many.data() + std::size_t(i) * 40);
        }
        std::size_t sent = 0;
        auto deadline = std::chrono::steady_clock::now() + for_how_long;
        while (sent < many.size() && std::chrono::steady_clock::now() < deadline) {
            ssize_t n = ::send(fd, many.data() + sent, many.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0)
                sent += static_cast<std::size_t>(n);
            else
                std::this_thread::sleep_for(5ms);
        }
        return sent < many.size();
    }
    std::vector<std::byte> buf_;
    std::unique_ptr<memory_region> mr_;
};

TEST_P(hostile, unknown_opcode_closes)
{
    int fd;
    auto c = accept_receiving(fd);
    frame_header::bytes b{};
    b[0] = std::byte{0x7f};
    ASSERT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), 40);
    expect_flushed_error(*c);
    char x;
    EXPECT_EQ(::recv(fd, &x, 1, 0), 0) << "the server closed the socket";
    ::close(fd);
}

TEST_P(hostile, length_over_the_frame_limit_closes)
{
    int fd;
    auto c = accept_receiving(fd);
    frame_header h;
    h.op = frame_op::write;
    h.length = 0xffffffffu;
    h.addr = reinterpret_cast<std::uintptr_t>(buf_.data());
    h.key = mr_->remote().key;
    ASSERT_TRUE(send_header(fd, h));
    expect_flushed_error(*c);
    ::close(fd);
}

TEST_P(hostile, out_of_sequence_request_closes)
{
    int fd;
    auto c = accept_receiving(fd);
    frame_header h;
    h.op = frame_op::send;
    h.seq = 5;
    h.length = 4;
    ASSERT_TRUE(send_header(fd, h));
    expect_flushed_error(*c);
    ::close(fd);
}

TEST_P(hostile, stray_ack_and_truncated_header)
{
    int fd;
    auto c = accept_receiving(fd);
    frame_header h;
    h.op = frame_op::ack;
    h.seq = 0; // nothing of ours is in flight
    ASSERT_TRUE(send_header(fd, h));
    expect_flushed_error(*c);
    ::close(fd);

    auto c2 = accept_receiving(fd);
    frame_header::bytes b{};
    ASSERT_EQ(::send(fd, b.data(), 17, MSG_NOSIGNAL), 17);
    ::close(fd); // EOF inside a header: a disconnect
    auto cs = poll_n(*c2, 1);
    ASSERT_EQ(cs.size(), 1u);
    EXPECT_EQ(cs[0].status, errc::flushed);
    EXPECT_TRUE(wait_state(*c2, connection_state::disconnected));
}

TEST_P(hostile, write_outside_the_registration_is_nacked_and_memory_untouched)
{
    int fd;
    auto c = accept_receiving(fd);
    frame_header h;
    h.op = frame_op::write;
    h.seq = 0;
    h.length = 64;
    h.addr = reinterpret_cast<std::uintptr_t>(buf_.data()) + 4090; // runs past the end
    h.key = mr_->remote().key;
    ASSERT_TRUE(send_header(fd, h));
    std::vector<std::byte> payload(64, std::byte{0xee});
    ASSERT_EQ(::send(fd, payload.data(), 64, MSG_NOSIGNAL), 64);
    frame_header r;
    ASSERT_NO_FATAL_FAILURE(expect_remote_access_nak(fd, r));
    EXPECT_EQ(r.seq, 0u);
    expect_flushed_error(*c);
    ::close(fd);
}

TEST_P(hostile, atomics_are_served_in_little_endian_and_bad_targets_are_nacked)
{
    int fd;
    auto c = accept_receiving(fd);
    std::vector<std::uint64_t> words = {0x1122334455667788ull, 40, 0x7777};
    auto amr = server_dom_->register_memory(words.data(), 16, access::remote_atomic);
    auto atomic = [&](frame_op op, std::uint64_t seq, std::uint64_t addr, std::uint64_t key, std::uint64_t a,
                      std::uint64_t b = 0) {
        frame_header h;
        h.op = op;
        h.seq = seq;
        h.addr = addr;
        h.key = key;
        h.length = op == frame_op::fetch_add_req ? tcp::fetch_add_payload : tcp::compare_swap_payload;
        std::byte payload[16];
        tcp::store_le64(payload, a);
        tcp::store_le64(payload + 8, b);
        return send_header(fd, h) && send_all(fd, payload, h.length);
    };
    auto expect_old = [&](std::uint64_t seq, std::uint64_t old) {
        frame_header r;
        ASSERT_TRUE(read_header(fd, r));
        EXPECT_EQ(r.op, frame_op::atomic_resp);
        EXPECT_EQ(r.seq, seq);
        ASSERT_EQ(r.length, 8u);
        std::byte v[8];
        ASSERT_EQ(recv_all(fd, v, 8), 8u);
        EXPECT_EQ(tcp::load_le64(v), old) << "the old value, little endian on the wire";
    };
    const auto base = reinterpret_cast<std::uintptr_t>(words.data());
    const std::uint64_t key = amr->remote().key;
    ASSERT_TRUE(atomic(frame_op::fetch_add_req, 0, base, key, 0x0100000000000001ull));
    expect_old(0, 0x1122334455667788ull);
    ASSERT_TRUE(atomic(frame_op::compare_swap_req, 1, base + 8, key, 40, 41)); // matches
    expect_old(1, 40);
    ASSERT_TRUE(atomic(frame_op::compare_swap_req, 2, base + 8, key, 40, 42)); // does not
    expect_old(2, 41);
    EXPECT_EQ(std::atomic_ref<std::uint64_t>(words[0]).load(), 0x1222334455667789ull);
    EXPECT_EQ(std::atomic_ref<std::uint64_t>(words[1]).load(), 41u);
    // Misaligned: NAK REMOTE_ACCESS, nothing changed, and the target goes to error.
    ASSERT_TRUE(atomic(frame_op::fetch_add_req, 3, base + 4, key, 1));
    frame_header r;
    ASSERT_NO_FATAL_FAILURE(expect_remote_access_nak(fd, r));
    EXPECT_EQ(r.seq, 3u);
    expect_flushed_error(*c);
    EXPECT_EQ(std::atomic_ref<std::uint64_t>(words[0]).load(), 0x1222334455667789ull);
    EXPECT_EQ(std::atomic_ref<std::uint64_t>(words[1]).load(), 41u);
    EXPECT_EQ(std::atomic_ref<std::uint64_t>(words[2]).load(), 0x7777u) << "past the registration";
    ::close(fd);

    // A region without remote_atomic (buf_: remote read and write), past the end of one
    // with it, and an 8-byte range that wraps around.
    struct bad {
        const char* what;
        std::uint64_t addr, key;
    };
    for (auto [what, addr, k] :
         {bad{"no remote_atomic", reinterpret_cast<std::uintptr_t>(buf_.data()), 0},
          bad{"past the end", base + 16, key}, bad{"wraps around", ~std::uint64_t{0} - 7, key}}) {
        SCOPED_TRACE(what);
        auto c2 = accept_receiving(fd);
        ASSERT_TRUE(atomic(frame_op::compare_swap_req, 0, addr, k ? k : mr_->remote().key, 0x11111111, 1));
        ASSERT_NO_FATAL_FAILURE(expect_remote_access_nak(fd, r));
        expect_flushed_error(*c2);
        ::close(fd);
    }
    EXPECT_EQ(std::atomic_ref<std::uint64_t>(words[2]).load(), 0x7777u);
}

TEST_P(hostile, ranges_that_wrap_around_are_nacked)
{
    // addr + length overflows 64 bits: a naive "addr + len <= end" check would pass it.
    for (frame_op op : {frame_op::read_req, frame_op::write}) {
        int fd;
        auto c = accept_receiving(fd);
        frame_header h;
        h.op = op;
        h.seq = 0;
        h.length = 4096;
        h.addr = ~std::uint64_t{0} - 100;
        h.key = mr_->remote().key;
        ASSERT_TRUE(send_header(fd, h));
        if (op == frame_op::write) {
            std::vector<std::byte> payload(4096, std::byte{0xee});
            ASSERT_EQ(::send(fd, payload.data(), payload.size(), MSG_NOSIGNAL), 4096);
        }
        frame_header r;
        ASSERT_NO_FATAL_FAILURE(expect_remote_access_nak(fd, r));
        expect_flushed_error(*c);
        ::close(fd);
    }
}

/// A CMA request's payload: one descriptor per range of the sender's (this process's) memory.
std::vector<std::byte> cma_descriptors(std::initializer_list<std::pair<std::uint64_t, std::uint64_t>> ranges)
{
    std::vector<std::byte> d;
    for (auto [addr, len] : ranges) {
        std::byte e[tcp::cma_descriptor_size];
        tcp::store_le64(e, addr);
        tcp::store_le64(e + 8, len);
        d.insert(d.end(), e, e + sizeof e);
    }
    return d;
}

/// Sends a CMA request `op` (sequence 0) for the target range at `addr` under `key`,
/// with the descriptors `d` as its payload.
bool send_cma_request(int fd, frame_op op, std::uint64_t addr, std::uint64_t key,
                      const std::vector<std::byte>& d)
{
    frame_header h;
    h.op = op;
    h.seq = 0;
    h.addr = addr;
    h.key = key;
    h.length = static_cast<std::uint32_t>(d.size());
    return send_header(fd, h) && send_all(fd, d.data(), d.size());
}

/// The hostile peer's tests of what exists on shm:// only (CMA requests; on TCP they are
/// violations: cma_requests_are_served_only_on_shm_and_only_inside_the_registration).
using hostile_shm = hostile;

TEST_P(hostile, cma_requests_are_served_only_on_shm_and_only_inside_the_registration)
{
    // The payload names 64 bytes of the raw peer's memory (this process's) to be written
    // at the end of buf_, running past it: on shm the target's registration check refuses
    // it before any CMA; on TCP, where no peer shares our memory, the request itself is a
    // violation.
    std::vector<std::byte> evil(64, std::byte{0xee});
    int fd;
    auto c = accept_receiving(fd);
    const auto d = cma_descriptors({{reinterpret_cast<std::uintptr_t>(evil.data()), evil.size()}});
    ASSERT_TRUE(send_cma_request(fd, frame_op::write_cma,
                                 reinterpret_cast<std::uintptr_t>(buf_.data()) + 4090, mr_->remote().key, d));
    if (b_ == backend::shm) {
        frame_header r;
        ASSERT_NO_FATAL_FAILURE(expect_remote_access_nak(fd, r));
        EXPECT_EQ(r.seq, 0u);
    }
    expect_flushed_error(*c);
    ::close(fd);
}

TEST_P(hostile_shm, cma_descriptors_that_name_no_memory_of_the_peer_fail_the_request_only)
{
    // The peer's own ranges are its business: unmapped ones (page 1) make the target's
    // process_vm_readv fail, and the request fails (REMOTE_OPERATION) with buf_ untouched.
    int fd;
    auto c = accept_receiving(fd);
    const auto d = cma_descriptors({{4096, 64}});
    ASSERT_TRUE(send_cma_request(fd, frame_op::write_cma, reinterpret_cast<std::uintptr_t>(buf_.data()),
                                 mr_->remote().key, d));
    frame_header r;
    ASSERT_TRUE(read_header(fd, r));
    EXPECT_EQ(r.op, frame_op::nak);
    EXPECT_EQ(r.status, static_cast<std::uint32_t>(tcp::nak_code::remote_operation));
    expect_flushed_error(*c);
    ::close(fd);
}

TEST_P(hostile_shm, cma_descriptors_over_the_frame_limit_close_the_connection)
{
    // Each length alone is below the 1 GiB limit, their sum is not (and would wrap 32
    // bits): a violation, nothing read or written.
    int fd;
    auto c = accept_receiving(fd);
    const std::uint64_t big = tcp::max_frame_payload - 10;
    const auto d = cma_descriptors({{reinterpret_cast<std::uintptr_t>(buf_.data()), big},
                                    {reinterpret_cast<std::uintptr_t>(buf_.data()), big}});
    ASSERT_TRUE(send_cma_request(fd, frame_op::read_cma_req, reinterpret_cast<std::uintptr_t>(buf_.data()),
                                 mr_->remote().key, d));
    expect_flushed_error(*c);
    char x;
    EXPECT_EQ(::recv(fd, &x, 1, 0), 0) << "the server closed the socket without a response";
    ::close(fd);
}

TEST_P(hostile_shm, a_cma_read_lands_in_the_peer_and_is_answered_without_payload)
{
    // The raw peer is this process: the target writes the 300 bytes at buf_ + 100 into
    // its two ranges itself, and answers READ_CMA_RESP with the length and no payload.
    int fd;
    auto c = accept_receiving(fd);
    for (std::size_t i = 0; i < buf_.size(); ++i)
        buf_[i] = static_cast<std::byte>(i & 0xff);
    std::vector<std::byte> sink(300, std::byte{0});
    const auto d = cma_descriptors({{reinterpret_cast<std::uintptr_t>(sink.data()), 100},
                                    {reinterpret_cast<std::uintptr_t>(sink.data()) + 100, 200}});
    ASSERT_TRUE(send_cma_request(fd, frame_op::read_cma_req,
                                 reinterpret_cast<std::uintptr_t>(buf_.data()) + 100, mr_->remote().key, d));
    frame_header r;
    ASSERT_TRUE(read_header(fd, r));
    EXPECT_EQ(r.op, frame_op::read_cma_resp);
    EXPECT_EQ(r.seq, 0u);
    EXPECT_EQ(r.length, 300u);
    EXPECT_EQ(std::memcmp(sink.data(), buf_.data() + 100, 300), 0);
    // A READ_CMA_RESP for nothing this side asked: a violation.
    frame_header stray;
    stray.op = frame_op::read_cma_resp;
    stray.length = 8;
    ASSERT_TRUE(send_header(fd, stray));
    auto cs = poll_n(*c, 1);
    ASSERT_EQ(cs.size(), 1u);
    EXPECT_EQ(cs[0].status, errc::flushed);
    EXPECT_TRUE(wait_state(*c, connection_state::error));
    ::close(fd);
}

TEST_P(hostile, read_flood_without_reading_responses_is_bounded)
{
    int fd;
    auto c = accept_receiving(fd);
    // Ask for far more reads than max_rd_atomic and never read the answers: the server must
    // stop reading (backpressure), not queue without bound, and stay responsive.
    EXPECT_TRUE(flood_reads(fd, 3s)) << "the server kept reading requests it could not answer";
    EXPECT_EQ(c->state(), connection_state::established);
    // The server's engine is still serving others.
    auto p = connect_pair();
    EXPECT_EQ(p.client->state(), connection_state::established);
    ::close(fd);
    EXPECT_TRUE(wait_state(*c, connection_state::disconnected));
}

// The same flood on a connection that reports to a shared queue whose poller sleeps on
// the queue's sockets too (progress_fd(), request_notify_watching(): an endpoint's shape).
// Reading stalls (backpressure), and the stalled socket, readable but not to be read
// until a response leaves, must not keep waking that sleeper: it leaves the queue's set
// until the stall ends (it woke the sleeper without pause, hundreds of thousands of times
// a second, before).
TEST_P(hostile, a_stalled_socket_does_not_keep_waking_a_sleeper_on_the_queue)
{
    auto q = server_dom_->create_completion_queue({.depth = 1024});
    auto& qb = dynamic_cast<detail::completion_queue_base&>(*q);
    ASSERT_GE(qb.progress_fd(), 0);
    connection_options o;
    o.send_cq = o.recv_cq = q;
    int fd;
    auto c = accept_raw(fd, o);
    ASSERT_NE(c, nullptr);
    buf_.assign(4096, std::byte{0x11});
    mr_ = server_dom_->register_memory(buf_.data(), buf_.size(), access::remote_read);
    ASSERT_TRUE(flood_reads(fd, 2s)) << "the server kept reading requests it could not answer";

    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    ASSERT_GE(ep, 0);
    for (int wfd : {q->fd(), qb.progress_fd()}) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = wfd;
        ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, wfd, &ev), 0);
    }
    // An event loop over 300 ms: poll, arm, look again, sleep. Each wake-up is counted.
    int wakes = 0;
    completion cs[8];
    const auto until = std::chrono::steady_clock::now() + 300ms;
    while (std::chrono::steady_clock::now() < until) {
        std::size_t n = q->poll(cs);
        (void)qb.request_notify_watching();
        n += q->poll(cs);
        EXPECT_EQ(n, 0u) << "the peer's reads complete nothing on the target";
        epoll_event evs[2];
        int r = ::epoll_wait(ep, evs, 2, 100);
        for (int j = 0; j < r; ++j)
            if (evs[j].data.fd == q->fd())
                (void)q->ack_notify();
        wakes += r > 0;
    }
    ::close(ep);
    EXPECT_LT(wakes, 50) << "the stalled socket kept the sleeper awake";
    EXPECT_EQ(c->state(), connection_state::established);
    ::close(fd);
    EXPECT_TRUE(wait_state(*c, connection_state::disconnected));
}

TEST_P(hostile, random_bytes_never_crash_or_touch_memory)
{
    std::uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 40; ++round) {
        int fd;
        auto c = accept_receiving(fd);
        std::vector<std::byte> junk(static_cast<std::size_t>(1 + round * 97));
        for (auto& b : junk) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b = static_cast<std::byte>(x);
        }
        // Half the rounds start with a plausible header so that payload paths run too.
        if (round % 2 == 0 && junk.size() >= 40) {
            frame_header h;
            h.op = round % 4 == 0 ? frame_op::send : frame_op::write;
            h.length = static_cast<std::uint32_t>(x % 5000);
            if (h.op == frame_op::write) { // a send carries no address or key
                h.addr = reinterpret_cast<std::uintptr_t>(buf_.data()) + x % 8192;
                h.key = mr_->remote().key ^ (round % 8 == 2 ? 0 : 1); // half with the right key
            }
            h.encode(junk.data());
        }
        ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
        ::close(fd);
        // Either end state is fine; waiting for one then the other would sit out a timeout.
        auto deadline = std::chrono::steady_clock::now() + 5s;
        while (c->state() == connection_state::established && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(1ms);
        EXPECT_TRUE(c->state() == connection_state::error || c->state() == connection_state::disconnected)
            << to_string(c->state());
        c.reset();
        mr_.reset();
    }
}

INSTANTIATE_TEST_SUITE_P(transports, hostile, testing::Values(backend::tcp, backend::shm), param_name);
INSTANTIATE_TEST_SUITE_P(transports, hostile_shm, testing::Values(backend::shm), param_name);

// ---- the loose ends of the wire format, decided (docs/wire-format.md) -------------------

class wire_rules : public hostile
{
protected:
    static std::vector<std::byte> hello_bytes(std::uint32_t max_rd, std::uint8_t flags = 0)
    {
        handshake h;
        h.type = handshake_type::hello;
        h.max_rd_atomic = max_rd;
        h.flags = flags;
        h.private_data_len = 2;
        h.private_data[0] = std::byte{'h'};
        h.private_data[1] = std::byte{'i'};
        std::vector<std::byte> b(handshake::hello_size);
        h.encode(b.data());
        return b;
    }
    static void send_frame(int fd, const frame_header& h, std::span<const std::byte> payload = {})
    {
        ASSERT_TRUE(send_header(fd, h));
        ASSERT_TRUE(send_all(fd, payload.data(), payload.size()));
    }
    /// True when the engine sent nothing more within `t` (for "it must wait" checks).
    static bool quiet_for(int fd, std::chrono::milliseconds t)
    {
        pollfd pfd{fd, POLLIN, 0};
        return ::poll(&pfd, 1, static_cast<int>(t.count())) == 0;
    }
    /// Accepts a raw peer (HELLO with `max_rd`) without posting a receive; returns the reply.
    std::unique_ptr<connection> accept_bare(int& fd, handshake& reply, const connection_options& o = {},
                                            std::uint32_t max_rd = 16, std::uint8_t flags = 0)
    {
        fd = raw_dial();
        EXPECT_GE(fd, 0);
        auto hb = hello_bytes(max_rd, flags);
        EXPECT_EQ(::send(fd, hb.data(), hb.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hb.size()));
        auto req = listener_->get_request(5s);
        EXPECT_NE(req, nullptr);
        if (!req)
            return nullptr;
        auto c = req->accept(o);
        std::byte buf[handshake::reply_size];
        EXPECT_EQ(::recv(fd, buf, sizeof buf, MSG_WAITALL), static_cast<ssize_t>(sizeof buf));
        auto r = handshake::decode(buf, false);
        EXPECT_TRUE(r && r->type == handshake_type::accept);
        if (r)
            reply = *r;
        buf_.assign(4096, std::byte{0x11});
        mr_ = server_dom_->register_memory(buf_.data(), buf_.size(),
                                           access::local_write | access::remote_write | access::remote_read);
        return c;
    }
};

TEST_P(wire_rules, malformed_hellos_are_closed_unanswered)
{
    // Section 1: non-zero padding, a read limit of 0, a reserved byte set. The listener
    // closes each socket without a reply, and the application never sees a request.
    std::vector<std::pair<const char*, std::vector<std::byte>>> bad;
    bad.emplace_back("padding", hello_bytes(16));
    bad.back().second.back() = std::byte{1};
    bad.emplace_back("read limit 0", hello_bytes(0));
    bad.emplace_back("unknown flag in byte 7", hello_bytes(16));
    bad.back().second[7] = std::byte{4};
    for (auto& [what, bytes] : bad) {
        SCOPED_TRACE(what);
        int fd = raw_dial();
        ASSERT_GE(fd, 0);
        ASSERT_TRUE(send_all(fd, bytes.data(), bytes.size()));
        EXPECT_EQ(listener_->get_request(300ms), nullptr) << "a malformed HELLO became a request";
        pollfd pfd{fd, POLLIN, 0};
        ASSERT_EQ(::poll(&pfd, 1, 5000), 1) << "the socket was left open";
        char x;
        EXPECT_EQ(::recv(fd, &x, 1, 0), 0) << "closed without a reply";
        ::close(fd);
    }
    // The listener still serves well-formed clients.
    auto p = connect_pair();
    EXPECT_EQ(p.client->state(), connection_state::established);
}

// Issue 26, item 9: the wire protocol's version. A HELLO of version 1 (before the GOODBYE
// flag, the atomic frames and SEND_INV) is answered with a REJECT in version 1's form whose
// private data names the version required; the application never sees it.
TEST_P(wire_rules, a_hello_of_another_version_is_rejected_in_its_own_form_with_the_reason)
{
    for (std::uint8_t v : {std::uint8_t{1}, std::uint8_t{3}}) {
        SCOPED_TRACE(int{v});
        auto hb = hello_bytes(16);
        hb[4] = std::byte{v};
        int fd = raw_dial();
        ASSERT_GE(fd, 0);
        ASSERT_TRUE(send_all(fd, hb.data(), hb.size()));
        EXPECT_EQ(listener_->get_request(300ms), nullptr) << "another version's HELLO became a request";
        std::byte buf[handshake::reply_size];
        ASSERT_EQ(recv_all(fd, buf, sizeof buf), sizeof buf) << "no REJECT";
        EXPECT_EQ(handshake::peer_version(buf), v) << "the REJECT is not in the HELLO's version";
        // As that version's client reads it: our decoder with the version byte ours.
        buf[4] = std::byte{tcp::protocol_version};
        auto r = handshake::decode(buf, false);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->type, handshake_type::reject);
        std::string why(reinterpret_cast<const char*>(r->data().data()), r->data().size());
        EXPECT_NE(why.find("version 2 required"), std::string::npos) << why;
        char x;
        EXPECT_EQ(::recv(fd, &x, 1, 0), 0) << "closed after the REJECT";
        ::close(fd);
    }
    auto p = connect_pair();
    EXPECT_EQ(p.client->state(), connection_state::established);
}

// Issue 26, item 9: GOODBYE is the last frame of a peer that set the GOODBYE flag. One from
// a peer without the flag, and any frame after a GOODBYE, are violations: the connection
// goes to error (protocol_error), not to a clean `disconnected`.
TEST_P(wire_rules, goodbye_only_from_a_peer_with_the_flag_and_nothing_after_it)
{
    for (bool flagged : {false, true}) {
        SCOPED_TRACE(flagged ? "a frame after GOODBYE" : "GOODBYE without the flag");
        int fd;
        handshake reply;
        auto c = accept_bare(fd, reply, {}, 16, flagged ? tcp::handshake_flag_goodbye : 0);
        ASSERT_NE(c, nullptr);
        EXPECT_EQ(reply.flags, tcp::handshake_flag_goodbye) << "rdmx always sets the flag in ACCEPT";
        ASSERT_NO_FATAL_FAILURE(send_frame(fd, frame_header{.op = frame_op::goodbye}));
        if (flagged) {
            // A request that would be well-formed before the GOODBYE (seq 0, empty).
            ASSERT_NO_FATAL_FAILURE(send_frame(fd, frame_header{.op = frame_op::send}));
        }
        auto deadline = std::chrono::steady_clock::now() + 5s;
        while (c->state() == connection_state::established && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(1ms);
        EXPECT_EQ(c->state(), connection_state::error) << to_string(c->state());
        EXPECT_EQ(c->last_error(), errc::protocol_error) << c->last_error().message();
        ::close(fd);
        c.reset();
    }
}

TEST_P(wire_rules, a_large_read_limit_is_accepted_and_the_smaller_one_applies)
{
    // Section 1: a HELLO may offer any number of reads; each side has at most
    // min(own, peer's) outstanding. Here the peer offers 2^32 - 1 and we allow 2.
    connection_options o;
    o.max_rd_atomic = 2;
    int fd;
    handshake reply;
    auto c = accept_bare(fd, reply, o, 0xffffffffu);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(reply.max_rd_atomic, 2u) << "the ACCEPT states our own limit";
    std::vector<std::byte> sink(3 * 8);
    auto sm = server_dom_->register_memory(sink.data(), sink.size(), access::local_write);
    remote_buffer far{.addr = 0x10000, .length = 64, .key = 5, .backend = b_};
    for (std::uint64_t i = 0; i < 3; ++i) {
        sge s{sm.get(), i * 8, 8};
        ASSERT_FALSE(c->post_read({&s, 1}, *far.slice(i * 8, 8), i));
    }
    frame_header r;
    for (std::uint64_t i = 0; i < 2; ++i) {
        ASSERT_TRUE(read_header(fd, r));
        EXPECT_EQ(r.op, frame_op::read_req);
        EXPECT_EQ(r.seq, i);
    }
    EXPECT_TRUE(quiet_for(fd, 300ms)) << "a third read went out with two outstanding";
    for (std::uint64_t i = 0; i < 3; ++i) {
        frame_header resp;
        resp.op = frame_op::read_resp;
        resp.seq = i;
        resp.length = 8;
        std::vector<std::byte> data(8, static_cast<std::byte>(0x40 + i));
        ASSERT_NO_FATAL_FAILURE(send_frame(fd, resp, data));
        if (i == 0) { // a credit came back: the third read goes out now
            ASSERT_TRUE(read_header(fd, r));
            EXPECT_EQ(r.op, frame_op::read_req);
            EXPECT_EQ(r.seq, 2u);
        }
    }
    auto done = expect_ok(*c, 3, 5s);
    ASSERT_EQ(done.size(), 3u);
    for (std::size_t i = 0; i < sink.size(); ++i)
        EXPECT_EQ(sink[i], static_cast<std::byte>(0x40 + i / 8)) << i;
    ::close(fd);
}

TEST_P(wire_rules, requests_with_fields_their_opcode_does_not_use_are_violations)
{
    // Section 2: no request field is ignored. Each of these closes the connection without
    // a response and without touching memory; so does a first request whose seq is 2^32
    // (the counter is 64 bits: a peer that truncated it to 32 would take it for request 0).
    struct bad_request {
        const char* what;
        frame_op op;
        void (*tweak)(frame_header&);
    };
    const bad_request cases[] = {
        {"solicited write", frame_op::write, [](frame_header& h) { h.flags = tcp::flag_solicited; }},
        {"solicited read", frame_op::read_req, [](frame_header& h) { h.flags = tcp::flag_solicited; }},
        {"imm on a read", frame_op::read_req, [](frame_header& h) { h.imm = 1; }},
        {"imm on a send", frame_op::send, [](frame_header& h) { h.imm = 1; }},
        {"key on a send", frame_op::send, [](frame_header& h) { h.key = 1; }},
        {"addr on a send", frame_op::send, [](frame_header& h) { h.addr = 1; }},
        {"status on a write", frame_op::write, [](frame_header& h) { h.status = 2; }},
        {"seq 2^32 first", frame_op::write, [](frame_header& h) { h.seq = std::uint64_t{1} << 32; }},
    };
    for (const auto& bc : cases) {
        SCOPED_TRACE(bc.what);
        int fd;
        auto c = accept_receiving(fd);
        frame_header h;
        h.op = bc.op;
        if (bc.op != frame_op::send) { // a valid target: only the tweak is wrong
            h.addr = reinterpret_cast<std::uintptr_t>(buf_.data());
            h.key = mr_->remote().key;
            h.length = bc.op == frame_op::read_req ? 8 : 0;
        }
        bc.tweak(h);
        ASSERT_NO_FATAL_FAILURE(send_frame(fd, h));
        expect_flushed_error(*c);
        pollfd pfd{fd, POLLIN, 0};
        ASSERT_EQ(::poll(&pfd, 1, 5000), 1);
        char x;
        EXPECT_EQ(::recv(fd, &x, 1, 0), 0) << "no response, just the close";
        ::close(fd);
    }
}

TEST_P(wire_rules, no_receive_wins_over_a_bad_key_and_an_overlong_send)
{
    // Section 5, order of the target's checks: a WRITE_IMM that finds no receive is
    // NAKed RNR before its key is looked at (as rxe checks resources before the rkey);
    // retransmitted once a receive is there, the bad key gets NAK REMOTE_ACCESS.
    int fd;
    handshake reply;
    auto c = accept_bare(fd, reply);
    ASSERT_NE(c, nullptr);
    std::vector<std::byte> payload(16, std::byte{0xee});
    frame_header w;
    w.op = frame_op::write_imm;
    w.seq = 0;
    w.imm = 9;
    w.length = 16;
    w.addr = reinterpret_cast<std::uintptr_t>(buf_.data());
    w.key = mr_->remote().key ^ 1;
    ASSERT_NO_FATAL_FAILURE(send_frame(fd, w, payload));
    frame_header r;
    ASSERT_TRUE(read_header(fd, r));
    EXPECT_EQ(r.op, frame_op::nak);
    EXPECT_EQ(r.seq, 0u);
    EXPECT_EQ(r.status, static_cast<std::uint32_t>(tcp::nak_code::rnr));
    completion none[1];
    EXPECT_EQ(c->poll(none), 0u) << "an RNR consumes nothing";
    EXPECT_EQ(c->state(), connection_state::established);
    sge rs{mr_.get(), 0, 64};
    ASSERT_FALSE(c->post_recv({&rs, 1}, 99));
    ASSERT_NO_FATAL_FAILURE(send_frame(fd, w, payload));
    ASSERT_NO_FATAL_FAILURE(expect_remote_access_nak(fd, r));
    EXPECT_EQ(r.seq, 0u);
    expect_flushed_error(*c);
    ::close(fd);

    // A send longer than any receive, with none posted: RNR, not a length error.
    auto c2 = accept_bare(fd, reply);
    ASSERT_NE(c2, nullptr);
    frame_header s;
    s.op = frame_op::send;
    s.length = 16;
    ASSERT_NO_FATAL_FAILURE(send_frame(fd, s, payload));
    ASSERT_TRUE(read_header(fd, r));
    EXPECT_EQ(r.op, frame_op::nak);
    EXPECT_EQ(r.status, static_cast<std::uint32_t>(tcp::nak_code::rnr));
    EXPECT_EQ(c2->state(), connection_state::established);
    ::close(fd);
}

TEST_P(wire_rules, zero_length_write_imm_and_read_need_no_key)
{
    // Section 5: zero-length requests touch nothing, so addr and key are not checked; a
    // WRITE_IMM still consumes a receive.
    int fd;
    auto c = accept_receiving(fd); // a receive is posted, wr_id 99
    frame_header w;
    w.op = frame_op::write_imm;
    w.seq = 0;
    w.imm = 42;
    w.addr = ~std::uint64_t{0};
    w.key = 12345;
    ASSERT_NO_FATAL_FAILURE(send_frame(fd, w));
    frame_header rd;
    rd.op = frame_op::read_req;
    rd.seq = 1;
    rd.addr = 1;
    ASSERT_NO_FATAL_FAILURE(send_frame(fd, rd));
    frame_header r;
    ASSERT_TRUE(read_header(fd, r));
    EXPECT_EQ(r.op, frame_op::ack);
    EXPECT_EQ(r.seq, 0u);
    ASSERT_TRUE(read_header(fd, r));
    EXPECT_EQ(r.op, frame_op::read_resp);
    EXPECT_EQ(r.seq, 1u);
    EXPECT_EQ(r.length, 0u);
    auto done = expect_ok(*c, 1, 5s);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].wr_id, 99u);
    EXPECT_EQ(done[0].opcode, opcode::recv_with_imm);
    EXPECT_TRUE(done[0].with_imm);
    EXPECT_EQ(done[0].imm, 42u);
    EXPECT_EQ(done[0].byte_len, 0u);
    EXPECT_EQ(buf_, std::vector<std::byte>(4096, std::byte{0x11}));
    ::close(fd);
}

TEST_P(wire_rules, fence_and_solicited_on_a_write_put_no_bit_on_the_wire)
{
    // Sections 2 and 5: the fence is the initiator's own rule (the fenced write waits for
    // the earlier read's response), and the solicited flag is only sent on SEND and
    // WRITE_IMM. The write's header carries flags 0; read_header's decode would refuse
    // anything else.
    int fd;
    handshake reply;
    auto c = accept_bare(fd, reply);
    ASSERT_NE(c, nullptr);
    std::vector<std::byte> sink(8), src(8, std::byte{0x5a});
    auto sm = server_dom_->register_memory(sink.data(), sink.size(), access::local_write);
    auto wm = server_dom_->register_memory(src.data(), src.size(), access::none);
    remote_buffer far{.addr = 0x10000, .length = 64, .key = 5, .backend = b_};
    sge rs{sm.get(), 0, 8}, ws{wm.get(), 0, 8};
    ASSERT_FALSE(c->post_read({&rs, 1}, *far.slice(0, 8), 1));
    ASSERT_FALSE(c->post_write({&ws, 1}, *far.slice(0, 8), 2,
                               send_flags::signaled | send_flags::fence | send_flags::solicited));
    frame_header r;
    ASSERT_TRUE(read_header(fd, r));
    EXPECT_EQ(r.op, frame_op::read_req);
    EXPECT_EQ(r.flags, 0u);
    EXPECT_TRUE(quiet_for(fd, 300ms)) << "the fenced write went out before the read completed";
    frame_header resp;
    resp.op = frame_op::read_resp;
    resp.seq = 0;
    resp.length = 8;
    std::vector<std::byte> data(8, std::byte{0x33});
    ASSERT_NO_FATAL_FAILURE(send_frame(fd, resp, data));
    ASSERT_TRUE(read_header(fd, r));
    EXPECT_EQ(r.op, frame_op::write);
    EXPECT_EQ(r.seq, 1u);
    EXPECT_EQ(r.flags, 0u) << "no fence or solicited bit on a write";
    std::byte body[8];
    ASSERT_EQ(::recv(fd, body, 8, MSG_WAITALL), 8);
    EXPECT_EQ(0, std::memcmp(body, src.data(), 8));
    frame_header a;
    a.op = frame_op::ack;
    a.seq = 1;
    ASSERT_NO_FATAL_FAILURE(send_frame(fd, a));
    auto done = expect_ok(*c, 2, 5s);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].wr_id, 1u);
    EXPECT_EQ(done[1].wr_id, 2u);
    EXPECT_EQ(sink, data);
    ::close(fd);
}

// Progress by whichever queue is polled (docs/tcp-engine.md, "Progress by the polled
// queue"): with the server domain's engine thread held, only the application's polls can
// read the server's sockets. A thread that polls one shared queue alone serves a connection
// that reports to another shared queue of the domain (its messages land in that queue, its
// ACKs and read responses leave, its target takes writes), and a thread that polls only a
// connection's own queue serves the shared queues' connections likewise.
INSTANTIATE_TEST_SUITE_P(transports, wire_rules, testing::Values(backend::tcp, backend::shm), param_name);

TEST_F(tcp_engine, a_poll_of_any_queue_of_the_domain_progresses_its_shared_queues_connections)
{
    auto q1 = server_dom_->create_completion_queue({.depth = 1024});
    auto q2 = server_dom_->create_completion_queue({.depth = 1024});
    connection_options o1, o2;
    o1.send_cq = o1.recv_cq = q1;
    o2.send_cq = o2.recv_cq = q2;
    pair a = connect_pair({}, o1), b = connect_pair({}, o2), c = connect_pair();
    constexpr int msgs = 8;
    std::vector<std::byte> target(8192, std::byte{0}), rbuf(64 * msgs), src = pattern(4096, 3), dst(4096);
    auto tmr = server_dom_->register_memory(target.data(), target.size(),
                                            access::local_write | access::remote_write | access::remote_read);
    auto rmr = server_dom_->register_memory(rbuf.data(), rbuf.size(), access::local_write);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::local_write);
    auto dmr = client_dom_->register_memory(dst.data(), dst.size(), access::local_write);

    engine_hold hold(*server_dom_);

    // `served` receives 8 messages, a 4 KiB write into the target and a read of it back,
    // while a thread polls only `poll_one`; what the messages complete goes to `its_queue`.
    auto round = [&](connection& served_client, connection& served_server, completion_queue& its_queue,
                     const std::function<std::size_t(std::span<completion>)>& poll_one, std::uint8_t seed) {
        std::vector<std::byte> msg = pattern(64, seed);
        auto mmr = client_dom_->register_memory(msg.data(), msg.size(), access::local_write);
        for (int k = 0; k < msgs; ++k) {
            sge r{rmr.get(), static_cast<std::size_t>(k) * 64, 64};
            ASSERT_FALSE(served_server.post_recv({&r, 1}, k));
        }
        std::atomic<bool> done{false};
        std::atomic<std::size_t> foreign{0};
        std::thread poller([&] {
            completion cs[8];
            while (!done)
                foreign += poll_one(cs);
        });
        const auto bytes = pattern(4096, seed);
        std::copy(bytes.begin(), bytes.end(), src.begin()); // the registered memory, in place
        sge m{mmr.get(), 0, 64}, w{smr.get(), 0, 4096}, rd{dmr.get(), 0, 4096};
        for (int k = 0; k < msgs; ++k)
            ASSERT_FALSE(served_client.post_send({&m, 1}, k));
        ASSERT_FALSE(served_client.post_write({&w, 1}, *tmr->remote().slice(0, 4096), 100));
        ASSERT_FALSE(served_client.post_read({&rd, 1}, *tmr->remote().slice(0, 4096), 101));
        auto cs = expect_ok(served_client, msgs + 2, 10s);
        done = true;
        poller.join();
        ASSERT_EQ(cs.size(), std::size_t(msgs + 2))
            << "the polls of another queue did not serve the connection";
        EXPECT_EQ(foreign, 0u) << "the polled queue returned completions of another";
        EXPECT_EQ(std::memcmp(target.data(), src.data(), 4096), 0) << "the write did not land";
        EXPECT_EQ(std::memcmp(dst.data(), src.data(), 4096), 0) << "the read returned other bytes";
        // The receives completed into their own queue, by those polls (the engine is held).
        std::vector<completion> got;
        completion rc[msgs];
        got.insert(got.end(), rc, rc + its_queue.poll(rc));
        ASSERT_EQ(got.size(), std::size_t(msgs));
        for (int k = 0; k < msgs; ++k) {
            EXPECT_FALSE(got[k].status) << got[k].status.message();
            EXPECT_EQ(got[k].opcode, opcode::recv);
            EXPECT_EQ(got[k].wr_id, std::uint64_t(k));
            EXPECT_EQ(std::memcmp(rbuf.data() + k * 64, msg.data(), 64), 0);
        }
    };
    // b (on q2) served by polls of q1 alone; then a (on q1) by polls of c's own queue alone.
    auto poll_q1 = [&](std::span<completion> out) { return q1->poll(out); };
    auto poll_c = [&](std::span<completion> out) { return c.server->poll(out); };
    round(*b.client, *b.server, *q2, poll_q1, 1);
    round(*a.client, *a.server, *q1, poll_c, 2);
}

} // namespace
} // namespace rdmx::test
