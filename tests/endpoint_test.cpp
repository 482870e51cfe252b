// Endpoints (issue 18): tagged messages eager and by rendezvous, matching with ignore masks
// and directed / any receives, truncation, the source of messages from peers never
// inserted, one-sided operations by peer, remove, peek / claim and the event mode; on
// every backend. The races of item 3 are in endpoint_race_test.cpp.
#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <map>
#include <numeric>
#include <vector>

#include "common/endpoint_util.hpp"

namespace rdmx::test
{
namespace
{

class endpoint_fixture : public ep_fixture
{
};

TEST_P(endpoint_fixture, eager_messages_arrive_with_every_byte_and_the_source_of_a_peer_never_inserted)
{
    auto a = open_ep();
    auto b = open_ep();
    auto ma = region(64 * 1024);
    auto mb = region(64 * 1024);
    fill(*ma, 0, 4000, 7);
    rdmx::peer to_b = a.ep->insert(b.ep->address());
    sge s{ma.get(), 0, 4000};
    ASSERT_FALSE(a.ep->send(to_b, 42, {&s, 1}, 1));
    sge r{mb.get(), 0, 8192};
    ASSERT_FALSE(b.ep->recv(any_peer, 42, 0, {&r, 1}, 2));
    auto got = pump({&a, &b}, [&] { return a.done.size() == 1 && b.done.size() == 1; });
    ASSERT_TRUE(got);
    EXPECT_FALSE(a.done[0].status) << a.done[0].status.message();
    EXPECT_EQ(a.done[0].op, endpoint_op::send);
    EXPECT_EQ(a.done[0].context, 1u);
    ASSERT_FALSE(b.done[0].status) << b.done[0].status.message();
    EXPECT_EQ(b.done[0].op, endpoint_op::recv);
    EXPECT_EQ(b.done[0].tag, 42u);
    EXPECT_EQ(b.done[0].length, 4000u);
    EXPECT_TRUE(check(*mb, 0, 4000, 7));
    // A was never inserted at B: its handle came with the message, and inserting A's
    // address gives the same one.
    rdmx::peer src = b.done[0].peer;
    EXPECT_EQ(b.ep->address_of(src), a.ep->address());
    EXPECT_EQ(b.ep->insert(a.ep->address()), src);
    EXPECT_EQ(b.ep->statistics().peers, 1u);
    EXPECT_EQ(b.ep->statistics().connected, 1u);
    // And B answers on that handle over the same connection.
    fill(*mb, 100, 10, 9);
    sge s2{mb.get(), 100, 10};
    ASSERT_FALSE(b.ep->send(src, 43, {&s2, 1}, 3));
    sge r2{ma.get(), 8192, 100};
    ASSERT_FALSE(a.ep->recv(to_b, 43, 0, {&r2, 1}, 4));
    ASSERT_TRUE(pump({&a, &b}, [&] { return a.done.size() == 2 && b.done.size() == 2; }));
    EXPECT_FALSE(a.done[1].status);
    EXPECT_EQ(a.done[1].length, 10u);
    EXPECT_TRUE(check(*ma, 8192, 10, 9));
    EXPECT_EQ(a.ep->statistics().connected, 1u);
}

TEST_P(endpoint_fixture, receives_match_in_posting_order_with_ignore_masks_and_directed_or_any_peer)
{
    auto a = open_ep();
    auto b = open_ep();
    auto c = open_ep();
    auto m = region(1 << 20);
    rdmx::peer a_to_c = a.ep->insert(c.ep->address());
    rdmx::peer b_to_c = b.ep->insert(c.ep->address());
    rdmx::peer c_to_b = c.ep->insert(b.ep->address());
    // 16 messages from A in order, tags 0x100 + i; 4 from B with tag 0x900.
    constexpr int n = 16;
    for (int i = 0; i < n; ++i) {
        fill(*m, i * 64, 64, i);
        sge s{m.get(), static_cast<std::size_t>(i) * 64, 64};
        ASSERT_FALSE(a.ep->send(a_to_c, 0x100 + i, {&s, 1}, i));
    }
    for (int i = 0; i < 4; ++i) {
        fill(*m, 4096 + i * 64, 64, 100 + i);
        sge s{m.get(), 4096 + static_cast<std::size_t>(i) * 64, 64};
        ASSERT_FALSE(b.ep->send(b_to_c, 0x900, {&s, 1}, i));
    }
    // Let everything arrive unexpected at C first.
    ASSERT_TRUE(pump({&a, &b, &c}, [&] {
        return a.done.size() == n && b.done.size() == 4 && c.ep->statistics().unexpected == n + 4;
    }));
    // Directed at B with an exact tag: B's, in their order.
    auto r = region(1 << 20);
    for (int i = 0; i < 4; ++i) {
        sge s{r.get(), static_cast<std::size_t>(i) * 64, 64};
        ASSERT_FALSE(c.ep->recv(c_to_b, 0x900, 0, {&s, 1}, 1000 + i));
    }
    // Any peer, ignoring the low 8 bits: A's 16 in order (B's 0x900 would match 0x9xx only).
    for (int i = 0; i < n; ++i) {
        sge s{r.get(), 8192 + static_cast<std::size_t>(i) * 64, 64};
        ASSERT_FALSE(c.ep->recv(any_peer, 0x100, 0xff, {&s, 1}, 2000 + i));
    }
    ASSERT_TRUE(pump({&a, &b, &c}, [&] { return c.done.size() == n + 4; }));
    for (std::size_t k = 0; k < c.done.size(); ++k) {
        auto& x = c.done[k];
        ASSERT_FALSE(x.status) << x.status.message();
        if (x.context >= 2000) {
            int i = static_cast<int>(x.context - 2000);
            EXPECT_EQ(x.tag, 0x100u + i);
            EXPECT_TRUE(check(*r, 8192 + i * 64, 64, i)) << i;
        } else {
            int i = static_cast<int>(x.context - 1000);
            EXPECT_EQ(x.peer, c_to_b);
            EXPECT_TRUE(check(*r, i * 64, 64, 100 + i)) << i;
        }
    }
    // Posted first, then the messages: a receive for a tag that never comes stays posted and
    // does not take later messages.
    sge never{r.get(), 65536, 64};
    ASSERT_FALSE(c.ep->recv(any_peer, 0xdead, 0, {&never, 1}, 9999));
    sge s1{r.get(), 70000, 64};
    ASSERT_FALSE(c.ep->recv(any_peer, 0x77, 0, {&s1, 1}, 3000));
    fill(*m, 0, 64, 55);
    sge out{m.get(), 0, 64};
    ASSERT_FALSE(a.ep->send(a_to_c, 0x77, {&out, 1}, 77));
    ASSERT_TRUE(pump({&a, &b, &c}, [&] { return c.done.size() == n + 5; }));
    EXPECT_EQ(c.done.back().context, 3000u);
    EXPECT_TRUE(check(*r, 70000, 64, 55));
}

TEST_P(endpoint_fixture, a_message_longer_than_the_receive_is_local_length_with_its_first_bytes)
{
    auto a = open_ep();
    auto b = open_ep();
    auto m = region(1 << 20);
    rdmx::peer to_b = a.ep->insert(b.ep->address());
    for (std::size_t len : {std::size_t{1000}, std::size_t{200000}}) { // eager, then rendezvous
        SCOPED_TRACE(len);
        a.done.clear();
        b.done.clear();
        fill(*m, 0, len, 3);
        std::memset(m->data() + 500000, 0, 1000);
        sge s{m.get(), 0, len};
        ASSERT_FALSE(a.ep->send(to_b, 5, {&s, 1}, 1));
        sge r{m.get(), 500000, 100};
        ASSERT_FALSE(b.ep->recv(any_peer, 5, 0, {&r, 1}, 2));
        ASSERT_TRUE(pump({&a, &b}, [&] { return a.done.size() == 1 && b.done.size() == 1; }));
        EXPECT_EQ(b.done[0].status, errc::local_length);
        EXPECT_EQ(b.done[0].length, len);
        EXPECT_TRUE(check(*m, 500000, 100, 3));
        EXPECT_EQ(m->data()[500100], std::byte{0});
        EXPECT_FALSE(a.done[0].status) << a.done[0].status.message();
    }
}

TEST_P(endpoint_fixture, rendezvous_both_peers_send_large_then_receive_and_all_four_complete)
{
    // libfabric #10945: both send a large message first, then post their receives.
    auto a = open_ep();
    auto b = open_ep();
    constexpr std::size_t len = 3 * 1024 * 1024 + 17;
    auto ma = region(2 * len + 4096);
    auto mb = region(2 * len + 4096);
    fill(*ma, 0, len, 11);
    fill(*mb, 0, len, 22);
    rdmx::peer to_b = a.ep->insert(b.ep->address());
    rdmx::peer to_a = b.ep->insert(a.ep->address());
    // Two sges on the sending side (two descriptors), three on the receiving side.
    sge sa[2]{{ma.get(), 0, 1000000}, {ma.get(), 1000000, len - 1000000}};
    sge sb[1]{{mb.get(), 0, len}};
    ASSERT_FALSE(a.ep->send(to_b, 1, sa, 1));
    ASSERT_FALSE(b.ep->send(to_a, 1, sb, 1));
    ASSERT_TRUE(pump(
                    {&a, &b}, [&] { return false; }, 300ms) ||
                true);
    sge ra[3]{
        {ma.get(), len, 12345}, {ma.get(), len + 12345, 2000000}, {ma.get(), len + 2012345, len - 2012345}};
    sge rb[1]{{mb.get(), len, len}};
    ASSERT_FALSE(a.ep->recv(to_b, 1, 0, ra, 2));
    ASSERT_FALSE(b.ep->recv(to_a, 1, 0, rb, 2));
    ASSERT_TRUE(pump(
        {&a, &b}, [&] { return a.done.size() == 2 && b.done.size() == 2; }, 60s));
    for (auto* e : {&a, &b})
        for (auto& x : e->done) {
            EXPECT_FALSE(x.status) << to_string(x.op) << ": " << x.status.message();
            EXPECT_EQ(x.length, len);
        }
    EXPECT_TRUE(check(*ma, len, len, 22));
    EXPECT_TRUE(check(*mb, len, len, 11));
}

TEST_P(endpoint_fixture, one_sided_write_and_read_by_peer_handle)
{
    auto a = open_ep();
    auto b = open_ep();
    auto ma = region(1 << 16);
    auto mb = region(1 << 16, access::local_write | access::remote_write | access::remote_read);
    rdmx::peer to_b = a.ep->insert(b.ep->address());
    fill(*ma, 0, 5000, 33);
    fill(*mb, 20000, 3000, 44);
    sge w{ma.get(), 0, 5000};
    ASSERT_FALSE(a.ep->write(to_b, {&w, 1}, mb->remote(100, 5000), 1)); // queued: not connected yet
    sge rd{ma.get(), 10000, 3000};
    ASSERT_FALSE(a.ep->read(to_b, {&rd, 1}, mb->remote(20000, 3000), 2));
    ASSERT_TRUE(pump({&a, &b}, [&] { return a.done.size() == 2; }));
    for (auto& x : a.done)
        EXPECT_FALSE(x.status) << to_string(x.op) << ": " << x.status.message();
    EXPECT_TRUE(check(*mb, 100, 5000, 33));
    EXPECT_TRUE(check(*ma, 10000, 3000, 44));
}

TEST_P(endpoint_fixture, remove_cancels_queued_and_outstanding_work_and_the_peer_sees_a_clean_disconnect)
{
    auto a = open_ep();
    auto b = open_ep();
    auto m = region(1 << 22);
    rdmx::peer to_b = a.ep->insert(b.ep->address());
    sge s{m.get(), 0, 16};
    ASSERT_FALSE(a.ep->send(to_b, 1, {&s, 1}, 1));
    sge r{m.get(), 4096, 16};
    ASSERT_FALSE(b.ep->recv(any_peer, 1, 0, {&r, 1}, 1));
    ASSERT_TRUE(pump({&a, &b}, [&] { return a.done.size() == 1 && b.done.size() == 1; }));
    // A rendezvous send B never receives stays outstanding; a receive directed at B too.
    sge big{m.get(), 65536, 1 << 20};
    ASSERT_FALSE(a.ep->send(to_b, 2, {&big, 1}, 2));
    sge r2{m.get(), 8192, 16};
    ASSERT_FALSE(a.ep->recv(to_b, 9, 0, {&r2, 1}, 3));
    pump(
        {&a, &b}, [] { return false; }, 200ms);
    a.ep->remove(to_b);
    EXPECT_FALSE(a.ep->address_of(to_b));
    EXPECT_EQ(a.ep->send(to_b, 1, {&s, 1}, 1), errc::invalid_argument); // stale handle
    ASSERT_TRUE(pump({&a, &b}, [&] { return a.done.size() == 3 && b.ep->statistics().connected == 0; }));
    for (std::size_t i = 1; i < 3; ++i)
        EXPECT_EQ(a.done[i].status, errc::canceled) << a.done[i].status.message();
    EXPECT_EQ(a.ep->statistics().peers, 0u);
    // B's entry for A stays (its address vector is its own) and A can reach B again.
    EXPECT_EQ(b.ep->statistics().peers, 1u);
    to_b = a.ep->insert(b.ep->address());
    fill(*m, 0, 16, 5);
    ASSERT_FALSE(a.ep->send(to_b, 7, {&s, 1}, 4));
    ASSERT_FALSE(b.ep->recv(any_peer, 7, 0, {&r, 1}, 5));
    ASSERT_TRUE(pump({&a, &b}, [&] { return a.done.size() == 4 && b.done.size() == 2; }));
    EXPECT_FALSE(b.done[1].status) << b.done[1].status.message();
    EXPECT_TRUE(check(*m, 4096, 16, 5));
}

TEST_P(endpoint_fixture, peek_finds_and_claim_takes_a_held_message)
{
    auto a = open_ep();
    auto b = open_ep();
    auto m = region(1 << 21);
    rdmx::peer to_b = a.ep->insert(b.ep->address());
    fill(*m, 0, 100, 1);
    fill(*m, 1000, 300000, 2); // rendezvous
    sge s1{m.get(), 0, 100}, s2{m.get(), 1000, 300000};
    ASSERT_FALSE(a.ep->send(to_b, 0x10, {&s1, 1}, 1));
    ASSERT_FALSE(a.ep->send(to_b, 0x20, {&s2, 1}, 2));
    ASSERT_TRUE(pump({&a, &b}, [&] { return b.ep->statistics().unexpected == 2; }));
    EXPECT_FALSE(b.ep->peek(any_peer, 0x30, 0));
    auto info = b.ep->peek(any_peer, 0x20, 0);
    ASSERT_TRUE(info);
    EXPECT_EQ(info->length, 300000u);
    auto claimed = b.ep->peek(any_peer, 0x00, 0xff, true); // the oldest: 0x10
    ASSERT_TRUE(claimed);
    EXPECT_EQ(claimed->tag, 0x10u);
    EXPECT_NE(claimed->claim, 0u);
    // Claimed: no receive matches it any more.
    auto r = region(1 << 21);
    sge r2{r.get(), 0, 300000};
    ASSERT_FALSE(b.ep->recv(any_peer, 0, ~std::uint64_t{0}, {&r2, 1}, 20)); // takes 0x20
    sge r1{r.get(), 400000, 100};
    ASSERT_FALSE(b.ep->recv_claimed(claimed->claim, {&r1, 1}, 10));
    EXPECT_EQ(b.ep->recv_claimed(claimed->claim, {&r1, 1}, 10), errc::invalid_argument);
    ASSERT_TRUE(pump({&a, &b}, [&] { return b.done.size() == 2 && a.done.size() == 2; }));
    std::map<std::uint64_t, endpoint_completion> by;
    for (auto& x : b.done)
        by[x.context] = x;
    EXPECT_FALSE(by[10].status);
    EXPECT_EQ(by[10].tag, 0x10u);
    EXPECT_FALSE(by[20].status) << by[20].status.message();
    EXPECT_EQ(by[20].tag, 0x20u);
    EXPECT_TRUE(check(*r, 400000, 100, 1));
    EXPECT_TRUE(check(*r, 0, 300000, 2));
    EXPECT_EQ(b.ep->statistics().unexpected, 0u);
}

TEST_P(endpoint_fixture, event_mode_sleeps_on_fd_without_busy_polling)
{
    auto a = open_ep();
    auto b = open_ep();
    auto m = region(1 << 16);
    rdmx::peer to_b = a.ep->insert(b.ep->address());
    int ep = ::epoll_create1(0);
    ASSERT_GE(ep, 0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, b.ep->fd(), &ev), 0);
    sge r{m.get(), 0, 64};
    ASSERT_FALSE(b.ep->recv(any_peer, 3, 0, {&r, 1}, 1));
    endpoint_completion out[4];
    EXPECT_EQ(b.ep->poll(out), 0u);
    // B sleeps; nothing comes: epoll times out.
    EXPECT_EQ(::epoll_wait(ep, &ev, 1, 100), 0) << "fd() readable with nothing to do";
    fill(*m, 1000, 64, 8);
    sge s{m.get(), 1000, 64};
    ASSERT_FALSE(a.ep->send(to_b, 3, {&s, 1}, 1));
    // A makes progress through wait(); B only when its fd says so.
    std::size_t got = 0;
    int wakeups = 0;
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (got == 0 && std::chrono::steady_clock::now() < deadline) {
        a.ep->wait(out, 10ms);
        if (::epoll_wait(ep, &ev, 1, 10) == 1) {
            ++wakeups;
            got = b.ep->poll(out);
        }
    }
    ASSERT_EQ(got, 1u);
    EXPECT_FALSE(out[0].status);
    EXPECT_TRUE(check(*m, 0, 64, 8));
    EXPECT_LT(wakeups, 200) << "woken far more often than there were events";
    // wait() with nothing to do sleeps for its timeout.
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(b.ep->wait(out, 200ms), 0u);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms);
    ::close(ep);
}

INSTANTIATE_TEST_SUITE_P(backends, endpoint_fixture, testing::ValuesIn(selected_backends()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(endpoint_fixture);

} // namespace
} // namespace rdmx::test
