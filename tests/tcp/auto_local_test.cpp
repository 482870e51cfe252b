// auto:// and peers on this host (docs/shm.md, "auto://"): a TCP domain that auto:// chose
// opens a UNIX socket beside each auto:// listener, and its auto:// connections to a
// listener on this host take it (backend shm, CMA) instead of TCP; anything else stays TCP,
// and the client's log says which it took and why.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include <rdmx/log.hpp>
#include <rdmx/rdmx.hpp>

#include "common/log_lines.hpp"
#include "common/test_util.hpp"
#include "tcp/tcp_engine.hpp"

namespace rdmx::test
{
namespace
{

struct link {
    std::unique_ptr<connection> client, server;
};

/// Connects `cd` to `address` and accepts on `l`.
link connect_through(domain& cd, listener& l, const std::string& address)
{
    auto acc = std::async(std::launch::async, [&] {
        auto req = l.get_request(10s);
        return req ? req->accept() : nullptr;
    });
    link k;
    k.client = cd.connect(address);
    k.server = acc.get();
    return k;
}

/// A 1 MiB write from the client into the server's region, and a send back; every byte
/// checked. The write goes by CMA exactly when `by_cma`.
void moves_data(domain& cd, domain& sd, link& k, bool by_cma)
{
    constexpr std::size_t n = 1 << 20;
    std::vector<std::byte> src(n), dst(n, std::byte{0});
    for (std::size_t i = 0; i < n; ++i)
        src[i] = static_cast<std::byte>((i * 13) & 0xff);
    auto sm = cd.register_memory(src.data(), n, access::local_write);
    auto dm = sd.register_memory(dst.data(), n, access::local_write | access::remote_write);
    const std::uint64_t cma0 = tcp::cma_requests_completed();
    sge w{sm.get(), 0, n};
    ASSERT_FALSE(k.client->post_write({&w, 1}, dm->remote(), 1));
    expect_ok(*k.client, 1);
    EXPECT_EQ(src, dst);
    EXPECT_EQ(tcp::cma_requests_completed() - cma0, by_cma ? 1u : 0u);
    sge r{sm.get(), 0, 64};
    ASSERT_FALSE(k.client->post_recv({&r, 1}, 2));
    sge s{dm.get(), 100, 64};
    ASSERT_FALSE(k.server->post_send({&s, 1}, 3));
    expect_ok(*k.server, 1);
    expect_ok(*k.client, 1);
    EXPECT_EQ(std::memcmp(src.data(), dst.data() + 100, 64), 0);
}

/// Skips unless auto:// falls back to TCP for loopback here (an RDMA device on loopback
/// would take it: shm is auto://'s choice on TCP domains only).
#define REQUIRE_AUTO_TCP(d)                                                                                  \
    if ((d).backend() != backend::tcp)                                                                       \
    GTEST_SKIP() << "auto:// chose " << to_string((d).backend())                                             \
                 << " for loopback here: peers on this host take shm only where auto:// falls back to TCP"

TEST(auto_local, a_listener_on_this_host_is_reached_over_its_unix_socket)
{
    log_lines log;
    auto sd = domain::open("auto://127.0.0.1:0");
    REQUIRE_AUTO_TCP(*sd);
    auto cd = domain::open("auto://127.0.0.1:0");
    auto l = sd->listen("auto://127.0.0.1:0");
    const std::string at = "auto://127.0.0.1:" + std::to_string(l->port());
    auto k = connect_through(*cd, *l, at);
    ASSERT_TRUE(k.server);
    EXPECT_EQ(cd->backend(), backend::tcp) << "the domain stays TCP: it serves remote peers too";
    EXPECT_EQ(k.client->backend(), backend::shm);
    EXPECT_EQ(k.server->backend(), backend::shm);
    EXPECT_TRUE(log.has("connect " + at + ": the listener is on this host: shm"));
    moves_data(*cd, *sd, k, true);
}

TEST(auto_local, a_wildcard_listener_is_reached_over_its_unix_socket_too)
{
    auto sd = domain::open("auto://127.0.0.1:0");
    REQUIRE_AUTO_TCP(*sd);
    auto cd = domain::open("auto://127.0.0.1:0");
    auto l = sd->listen("auto://0.0.0.0:0");
    auto k = connect_through(*cd, *l, "auto://127.0.0.1:" + std::to_string(l->port()));
    ASSERT_TRUE(k.server);
    EXPECT_EQ(k.client->backend(), backend::shm);
    EXPECT_EQ(k.server->backend(), backend::shm);
    moves_data(*cd, *sd, k, true);
}

TEST(auto_local, a_listener_without_a_unix_socket_is_reached_by_tcp_and_the_log_says_why)
{
    // A tcp:// listener opens no UNIX socket: the client's auto:// finds none on this
    // host, says so, and connects by TCP.
    log_lines log;
    auto sd = domain::open("tcp://127.0.0.1:0");
    auto cd = domain::open("auto://127.0.0.1:0");
    REQUIRE_AUTO_TCP(*cd);
    auto l = sd->listen("tcp://127.0.0.1:0");
    const std::string at = "auto://127.0.0.1:" + std::to_string(l->port());
    auto k = connect_through(*cd, *l, at);
    ASSERT_TRUE(k.server);
    EXPECT_EQ(k.client->backend(), backend::tcp);
    EXPECT_EQ(k.server->backend(), backend::tcp);
    EXPECT_TRUE(log.has("connect " + at + ": no auto:// listener for it in this network namespace"));
    moves_data(*cd, *sd, k, false);
}

TEST(auto_local, a_tcp_client_of_an_auto_listener_is_served_by_tcp)
{
    auto sd = domain::open("auto://127.0.0.1:0");
    REQUIRE_AUTO_TCP(*sd);
    auto cd = domain::open("tcp://127.0.0.1:0");
    auto l = sd->listen("auto://127.0.0.1:0");
    auto k = connect_through(*cd, *l, "tcp://127.0.0.1:" + std::to_string(l->port()));
    ASSERT_TRUE(k.server);
    EXPECT_EQ(k.client->backend(), backend::tcp);
    EXPECT_EQ(k.server->backend(), backend::tcp);
    moves_data(*cd, *sd, k, false);
}

TEST(auto_local, an_allocated_region_is_copied_into_by_a_local_peer_and_served_to_a_remote_one)
{
    // One region of an auto:// domain, two clients: the one on this host (over the UNIX
    // socket) maps it and copies; the tcp:// one has its write served by the target.
    auto sd = domain::open("auto://127.0.0.1:0");
    REQUIRE_AUTO_TCP(*sd);
    auto l = sd->listen("auto://127.0.0.1:0");
    constexpr std::size_t n = 256 * 1024;
    auto target = sd->allocate_memory(2 * n, access::remote_write | access::remote_read);
    ASSERT_NE(target->remote().key & tcp::shared_key_bit, 0u)
        << "an auto:// domain's allocated key is not mappable";
    std::vector<std::byte> src(n);
    for (std::size_t i = 0; i < n; ++i)
        src[i] = static_cast<std::byte>((i * 29) & 0xff);
    for (const char* scheme : {"auto", "tcp"}) {
        SCOPED_TRACE(scheme);
        const bool local = std::strcmp(scheme, "auto") == 0;
        auto cd = domain::open(std::string(scheme) + "://127.0.0.1:0");
        auto k = connect_through(*cd, *l, std::string(scheme) + "://127.0.0.1:" + std::to_string(l->port()));
        ASSERT_TRUE(k.server);
        EXPECT_EQ(k.client->backend(), local ? backend::shm : backend::tcp);
        auto sm = cd->register_memory(src.data(), n, access::none);
        const std::uint64_t mapped0 = tcp::mapped_copies();
        sge w{sm.get(), 0, n};
        const std::size_t at = local ? 0 : n;
        ASSERT_FALSE(k.client->post_write({&w, 1}, *target->remote().slice(at, n), 1));
        expect_ok(*k.client, 1);
        EXPECT_EQ(std::memcmp(target->data() + at, src.data(), n), 0);
        EXPECT_EQ(tcp::mapped_copies() - mapped0, local ? 1u : 0u);
    }
}

TEST(auto_local, endpoints_opened_with_auto_reach_each_other_over_shm)
{
    // An endpoint opened with auto:// dials its peers by auto:// too: on this host that is
    // shm, and a rendezvous message (the receiver reads it) moves by CMA.
    auto d1 = domain::open("auto://127.0.0.1:0");
    REQUIRE_AUTO_TCP(*d1);
    auto d2 = domain::open("auto://127.0.0.1:0");
    auto a = endpoint::open(*d1, "auto://127.0.0.1:0");
    auto b = endpoint::open(*d2, "auto://127.0.0.1:0");
    EXPECT_EQ(a->address().rfind("auto://127.0.0.1:", 0), 0u) << a->address();
    constexpr std::size_t n = 1 << 20;
    std::vector<std::byte> src(n), dst(n, std::byte{0});
    for (std::size_t i = 0; i < n; ++i)
        src[i] = static_cast<std::byte>((i * 31) & 0xff);
    auto sm = d1->register_memory(src.data(), n, access::local_write | access::remote_read);
    auto dm = d2->register_memory(dst.data(), n, access::local_write | access::remote_write);
    const std::uint64_t cma0 = tcp::cma_requests_completed();
    sge r{dm.get(), 0, n};
    ASSERT_FALSE(b->recv(any_peer, 9, 0, {&r, 1}, 2));
    sge s{sm.get(), 0, n};
    ASSERT_FALSE(a->send(a->insert(b->address()), 9, {&s, 1}, 1));
    bool sent = false, received = false;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!(sent && received) && std::chrono::steady_clock::now() < deadline) {
        endpoint_completion out[8];
        for (std::size_t i = 0, k = a->poll(out); i < k; ++i)
            if (out[i].context == 1) {
                EXPECT_FALSE(out[i].status) << out[i].status.message();
                sent = true;
            }
        for (std::size_t i = 0, k = b->poll(out); i < k; ++i)
            if (out[i].context == 2) {
                EXPECT_FALSE(out[i].status) << out[i].status.message();
                received = true;
            }
    }
    ASSERT_TRUE(sent && received) << "the 1 MiB message did not arrive";
    EXPECT_EQ(src, dst);
    EXPECT_GE(tcp::cma_requests_completed() - cma0, 1u) << "the rendezvous did not go by CMA";
}

} // namespace
} // namespace rdmx::test
