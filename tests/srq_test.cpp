// Shared receive queues (rdmx/queues.hpp), on every backend: many connections consuming
// from one queue, rdmx's own count of its outstanding receives, receiver-not-ready while
// it is empty, the low-watermark event, and connections that go while receives remain.
#include <gtest/gtest.h>

#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>

#include "common/test_util.hpp"

namespace rdmx::test
{
namespace
{

class srq : public pair_fixture
{
protected:
    bool iwarp() const { return server_dom_->limits().iwarp; }

    /// The queue, or null with skip_ set when the device has none (errc::not_supported).
    std::shared_ptr<shared_receive_queue> make_srq(const shared_receive_queue_options& o)
    {
        try {
            return server_dom_->create_shared_receive_queue(o);
        } catch (const error& e) {
            if (e.code() != errc::not_supported)
                throw;
            skip_ = std::string("no shared receive queues on this device: ") + e.what();
            return nullptr;
        }
    }

    /// Connects a client (with `client_opts`; its index as private data) and accepts it
    /// with `server_opts` on a helper thread.
    pair connect(const connection_options& client_opts, const connection_options& server_opts,
                 const std::string& pdata = {})
    {
        auto accepted = std::async(std::launch::async, [&] {
            auto req = listener_->get_request(10s);
            if (!req)
                throw std::runtime_error("no connection request within 10 s");
            return req->accept(server_opts);
        });
        pair p;
        try {
            p.client = client_dom_->connect(server_address(), client_opts, as_bytes(pdata));
        } catch (const std::exception& e) {
            // Say why the server side refused, if it did.
            std::string why = e.what();
            try {
                accepted.get();
            } catch (const std::exception& s) {
                why += std::string(" (server: ") + s.what() + ")";
            }
            throw std::runtime_error(why);
        }
        p.server = accepted.get();
        return p;
    }

    connection_options on(const std::shared_ptr<shared_receive_queue>& q) const
    {
        connection_options o;
        o.srq = q;
        return o;
    }

    std::string skip_;
};

shared_receive_queue_options qopts(std::uint32_t depth, std::uint32_t max_sge,
                                   std::shared_ptr<event_queue> events = nullptr, std::uint64_t context = 0)
{
    shared_receive_queue_options o;
    o.depth = depth;
    o.max_sge = max_sge;
    o.events = std::move(events);
    o.context = context;
    return o;
}

/// The byte at `offset` of message `seq` from client `client`: every byte says where it
/// belongs.
std::byte pattern(std::size_t client, std::size_t seq, std::size_t offset)
{
    return static_cast<std::byte>((client * 131 + seq * 29 + offset * 7 + offset / 251) & 0xff);
}

TEST_P(srq, eight_clients_share_one_receive_queue)
{
    constexpr std::size_t clients = 8, per_round = 8, rounds = 2, slot = 64 << 10;
    constexpr std::size_t slots = clients * per_round;
    shared_receive_queue_options qo;
    qo.depth = slots;
    qo.max_sge = 1;
    auto q = make_srq(qo);
    if (!q)
        GTEST_SKIP() << skip_;
    ASSERT_EQ(q->depth(), slots);
    std::vector<std::byte> rbuf(slots * slot);
    auto rmr = server_dom_->register_memory(rbuf.data(), rbuf.size(), access::local_write);
    for (std::uint64_t i = 0; i < slots; ++i) {
        sge s{rmr.get(), i * slot, slot};
        ASSERT_FALSE(q->post_recv({&s, 1}, i));
    }
    std::vector<pair> ps;
    std::map<connection*, std::size_t> client_of; // server connection -> client index
    for (std::size_t c = 0; c < clients; ++c) {
        ps.push_back(connect({}, on(q), std::to_string(c)));
        ASSERT_EQ(ps.back().server->limits().recv_queue_depth, q->depth());
        ASSERT_EQ(ps.back().server->limits().max_recv_sge, q->max_sge());
        client_of[ps.back().server.get()] = std::stoul(as_string(ps.back().server->peer_private_data()));
    }
    // Mixed sizes, 1 B .. 64 KiB; every message's size and bytes follow from its client and seq.
    auto size_of = [](std::size_t c, std::size_t seq) -> std::size_t {
        static constexpr std::size_t sizes[] = {1, 64, 4096, 777, slot, 33000, 8, 12345};
        return sizes[(c + seq * 3) % std::size(sizes)];
    };
    std::vector<std::vector<std::byte>> sbuf(clients);
    std::vector<std::unique_ptr<memory_region>> smr(clients);
    for (std::size_t c = 0; c < clients; ++c) {
        sbuf[c].resize(per_round * rounds * slot);
        for (std::size_t seq = 0; seq < per_round * rounds; ++seq)
            for (std::size_t i = 0; i < size_of(c, seq); ++i)
                sbuf[c][seq * slot + i] = pattern(c, seq, i);
        smr[c] = client_dom_->register_memory(sbuf[c].data(), sbuf[c].size(), access::none);
    }
    std::vector<std::size_t> next_seq(clients, 0);
    for (std::size_t r = 0; r < rounds; ++r) {
        // Each client sends its round; the queue holds a receive for every message (siw has
        // no receiver-not-ready: a send without a receive would end the connection).
        for (std::size_t k = 0; k < clients; ++k)
            for (std::size_t m = 0; m < per_round; ++m) {
                std::size_t seq = r * per_round + m;
                std::size_t c = client_of[ps[k].server.get()];
                sge s{smr[c].get(), seq * slot, size_of(c, seq)};
                ASSERT_FALSE(ps[k].client->post_send({&s, 1}, seq));
            }
        // The server polls every connection; each completion names a slot, and the message
        // in it must be the next one of the client on that connection.
        std::size_t got = 0;
        auto deadline = std::chrono::steady_clock::now() + 20s;
        while (got < clients * per_round && std::chrono::steady_clock::now() < deadline) {
            for (auto& p : ps) {
                completion cs[16];
                std::size_t n = p.server->poll(cs);
                for (std::size_t i = 0; i < n; ++i) {
                    const completion& x = cs[i];
                    ASSERT_FALSE(x.status) << x.status.message();
                    ASSERT_EQ(x.opcode, opcode::recv);
                    if (x.conn) {
                        EXPECT_EQ(x.conn, p.server.get());
                    }
                    ASSERT_LT(x.wr_id, slots);
                    std::size_t c = client_of[p.server.get()];
                    std::size_t seq = next_seq[c]++;
                    ASSERT_EQ(x.byte_len, size_of(c, seq)) << "client " << c << " message " << seq;
                    const std::byte* m = rbuf.data() + x.wr_id * slot;
                    for (std::size_t b = 0; b < x.byte_len; ++b)
                        ASSERT_EQ(m[b], pattern(c, seq, b))
                            << "client " << c << " message " << seq << " byte " << b;
                    // Back into the queue for the next round.
                    sge s{rmr.get(), x.wr_id * slot, slot};
                    ASSERT_FALSE(q->post_recv({&s, 1}, x.wr_id));
                    ++got;
                }
            }
            std::this_thread::yield();
        }
        ASSERT_EQ(got, clients * per_round) << "round " << r;
        for (auto& p : ps)
            expect_ok(*p.client, per_round);
    }
    for (std::size_t c = 0; c < clients; ++c)
        EXPECT_EQ(next_seq[c], per_round * rounds);
}

TEST_P(srq, post_recv_counts_outstanding_receives_until_polled)
{
    shared_receive_queue_options qo;
    qo.depth = 4;
    qo.max_sge = 1;
    auto q = make_srq(qo);
    if (!q)
        GTEST_SKIP() << skip_;
    ASSERT_EQ(q->depth(), 4u);
    EXPECT_EQ(q->max_sge(), 1u);
    EXPECT_EQ(q->backend(), b_);
    if (b_ == backend::verbs) {
        EXPECT_NE(q->native(), nullptr);
    }
    std::vector<std::byte> buf(8 * 256), other(256);
    auto mr = server_dom_->register_memory(buf.data(), buf.size(), access::local_write);
    auto foreign = client_dom_->register_memory(other.data(), other.size(), access::local_write);
    auto ro = server_dom_->register_memory(other.data(), other.size(), access::none);

    // Validation first: nothing of a list with a bad request is posted.
    sge two[2] = {{mr.get(), 0, 128}, {mr.get(), 128, 128}};
    sge good{mr.get(), 0, 256}, alien{foreign.get(), 0, 256}, outside{mr.get(), buf.size() - 8, 16},
        readonly{ro.get(), 0, 256};
    std::size_t posted = 99;
    recv_request bad_list[] = {{1, {&good, 1}}, {2, {two, 2}}};
    EXPECT_EQ(q->post_recv(bad_list, &posted), errc::invalid_argument);
    EXPECT_EQ(posted, 0u);
    recv_request alien_list[] = {{1, {&good, 1}}, {2, {&alien, 1}}};
    EXPECT_EQ(q->post_recv(alien_list, &posted), errc::invalid_argument);
    EXPECT_EQ(posted, 0u);
    EXPECT_EQ(q->post_recv({&outside, 1}, 3), errc::invalid_argument);
    EXPECT_EQ(q->post_recv({&readonly, 1}, 3), errc::local_protection);

    auto p = connect({}, on(q));
    EXPECT_EQ(p.server->limits().recv_queue_depth, 4u);
    EXPECT_EQ(p.server->limits().max_recv_sge, 1u);
    // The connection has no receive queue of its own.
    EXPECT_EQ(p.server->post_recv({&good, 1}, 7), errc::invalid_argument);

    // Six into a queue of four: four go in, then would_block, exactly counted.
    std::vector<sge> s(8);
    std::vector<recv_request> six(6);
    for (std::size_t i = 0; i < 6; ++i) {
        s[i] = {mr.get(), i * 256, 256};
        six[i] = {100 + i, {&s[i], 1}};
    }
    EXPECT_EQ(q->post_recv(six, &posted), errc::would_block);
    EXPECT_EQ(posted, 4u);
    EXPECT_EQ(q->post_recv(std::span(six).subspan(4), &posted), errc::would_block);
    EXPECT_EQ(posted, 0u);

    // A receive consumed but not polled is still outstanding.
    std::vector<std::byte> src(200);
    for (std::size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<std::byte>(i * 3 + 1);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::none);
    sge ss{smr.get(), 0, src.size()};
    ASSERT_FALSE(p.client->post_send({&ss, 1}, 1));
    expect_ok(*p.client, 1);
    std::this_thread::sleep_for(iwarp() ? 300ms : 50ms); // iWARP: sent is not yet placed
    EXPECT_EQ(q->post_recv(std::span(six).subspan(4, 1), &posted), errc::would_block);
    EXPECT_EQ(posted, 0u);
    auto rc = expect_ok(*p.server, 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].wr_id, 100u); // the first posted, the first consumed
    EXPECT_EQ(rc[0].opcode, opcode::recv);
    EXPECT_EQ(rc[0].byte_len, src.size());
    EXPECT_TRUE(std::equal(src.begin(), src.end(), buf.begin()));
    // Polled: one slot is free again, and only one.
    EXPECT_EQ(q->post_recv(std::span(six).subspan(4), &posted), errc::would_block);
    EXPECT_EQ(posted, 1u);

    // arm_limit needs an event queue and a limit in 1..depth().
    EXPECT_EQ(q->arm_limit(1), errc::invalid_argument);
    qo.events = event_queue::create();
    auto q2 = make_srq(qo);
    ASSERT_TRUE(q2);
    EXPECT_EQ(q2->arm_limit(0), errc::invalid_argument);
    EXPECT_EQ(q2->arm_limit(q2->depth() + 1), errc::invalid_argument);
}

TEST_P(srq, connection_on_another_domains_queue_is_refused)
{
    auto q = make_srq({});
    if (!q)
        GTEST_SKIP() << skip_;
    connection_options o;
    o.srq = q; // the server domain's queue on a client connection
    try {
        client_dom_->connect(server_address(), o);
        ADD_FAILURE() << "connect with another domain's queue succeeded";
    } catch (const error& e) {
        EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
    }
}

TEST_P(srq, send_waits_while_the_queue_is_empty_and_arrives_after_refill)
{
    auto q = make_srq(qopts(16, 1));
    if (!q)
        GTEST_SKIP() << skip_;
    if (iwarp())
        GTEST_SKIP() << "iWARP has no receiver-not-ready retries: a send finding the shared "
                        "queue empty ends the connection";
    auto p = connect({}, on(q)); // the client's rnr_retry_count is 7: retry forever
    std::vector<std::byte> src(3000), dst(4096);
    for (std::size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<std::byte>(i * 7 + 5);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dmr = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    sge s{smr.get(), 0, src.size()};
    ASSERT_FALSE(p.client->post_send({&s, 1}, 1));
    std::this_thread::sleep_for(200ms);
    completion c[2];
    EXPECT_EQ(p.client->poll(c), 0u) << "the send completed with the queue empty";
    EXPECT_EQ(p.server->poll(c), 0u);
    sge r{dmr.get(), 0, dst.size()};
    ASSERT_FALSE(q->post_recv({&r, 1}, 42));
    expect_ok(*p.client, 1, 15s);
    auto rc = expect_ok(*p.server, 1, 15s);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].wr_id, 42u);
    EXPECT_EQ(rc[0].byte_len, src.size());
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin()));
    EXPECT_EQ(p.client->state(), connection_state::established);
}

TEST_P(srq, send_to_an_empty_queue_exhausts_rnr_retries_of_zero)
{
    auto q = make_srq(qopts(16, 1));
    if (!q)
        GTEST_SKIP() << skip_;
    if (iwarp())
        GTEST_SKIP() << "iWARP has no receiver-not-ready retries (rnr_retry_count does not apply)";
    connection_options co;
    co.rnr_retry_count = 0;
    auto p = connect(co, on(q));
    std::vector<std::byte> src(64, std::byte{9});
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::none);
    sge s{smr.get(), 0, src.size()};
    ASSERT_FALSE(p.client->post_send({&s, 1}, 1));
    auto c = poll_n(*p.client, 1, 15s);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, errc::rnr_retry_exceeded) << c[0].status.message();
}

TEST_P(srq, limit_event_when_fewer_than_the_limit_remain)
{
    auto events = event_queue::create();
    auto q = make_srq(qopts(16, 1, events, 77));
    if (!q)
        GTEST_SKIP() << skip_;
    if (auto ec = q->arm_limit(4)) {
        if (ec == std::errc::function_not_supported || ec == std::errc::operation_not_supported ||
            ec == std::errc::not_supported)
            GTEST_SKIP() << "device " << server_dom_->limits().device_name
                         << " has no SRQ limit (ibv_modify_srq IBV_SRQ_LIMIT: " << ec.message() << ")";
        FAIL() << "arm_limit: " << ec.message();
    }
    std::vector<std::byte> dst(16 * 64), src(64, std::byte{1});
    auto dmr = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::none);
    for (std::uint64_t i = 0; i < 8; ++i) {
        sge r{dmr.get(), i * 64, 64};
        ASSERT_FALSE(q->post_recv({&r, 1}, i));
    }
    auto p = connect({}, on(q));
    sge s{smr.get(), 0, src.size()};
    auto send = [&](std::size_t n) {
        for (std::size_t i = 0; i < n; ++i)
            ASSERT_FALSE(p.client->post_send({&s, 1}, i));
        expect_ok(*p.client, n);
        expect_ok(*p.server, n);
    };
    event ev[4];
    // Four consumed: four remain, not fewer than the limit.
    send(4);
    EXPECT_EQ(events->wait(ev, 300ms), 0u) << "limit event with 4 of limit 4 left";
    // The fifth leaves three: one event.
    send(1);
    ASSERT_EQ(events->wait(ev, 5s), 1u);
    EXPECT_EQ(ev[0].type, event_type::srq_limit_reached);
    EXPECT_EQ(ev[0].srq, q.get());
    EXPECT_EQ(ev[0].context, 77u);
    EXPECT_EQ(ev[0].conn, nullptr);
    // Disarmed: no more without arming again.
    send(1);
    EXPECT_EQ(events->wait(ev, 300ms), 0u) << "a second event without arming again";
    ASSERT_FALSE(q->arm_limit(2));
    send(1); // one left now
    ASSERT_EQ(events->wait(ev, 5s), 1u);
    EXPECT_EQ(ev[0].srq, q.get());
}

TEST_P(srq, receives_outlive_the_connections_that_leave)
{
    auto q = make_srq(qopts(8, 1));
    if (!q)
        GTEST_SKIP() << skip_;
    std::vector<std::byte> dst(8 * 128), src(16 * 128);
    for (std::size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<std::byte>(i % 251);
    auto dmr = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::none);
    // Receive wr_id w lands in slot slot(w) of dst; message m is bytes m * 128 .. +100 of src.
    auto slot = [](std::uint64_t w) -> std::size_t { return w < 10 ? w : (w - 10) % 8; };
    auto post = [&](std::uint64_t first, std::size_t n, std::size_t* posted) {
        std::vector<sge> rs(n);
        std::vector<recv_request> wrs(n);
        for (std::size_t i = 0; i < n; ++i) {
            rs[i] = {dmr.get(), slot(first + i) * 128, 128};
            wrs[i] = {first + i, {&rs[i], 1}};
        }
        return q->post_recv(wrs, posted);
    };
    auto send = [&](pair& p, std::size_t first, std::size_t n) {
        for (std::size_t m = first; m < first + n; ++m) {
            sge s{smr.get(), m * 128, 100};
            ASSERT_FALSE(p.client->post_send({&s, 1}, m));
        }
        expect_ok(*p.client, n);
    };
    // Completions `cs` carry messages first.. in order, into the receives `wr_ids`.
    auto check = [&](const std::vector<completion>& cs, std::size_t first,
                     std::vector<std::uint64_t> wr_ids) {
        ASSERT_EQ(cs.size(), wr_ids.size());
        for (std::size_t k = 0; k < cs.size(); ++k) {
            EXPECT_EQ(cs[k].wr_id, wr_ids[k]); // consumed in the order posted
            EXPECT_EQ(cs[k].byte_len, 100u);
            auto from = src.begin() + static_cast<std::ptrdiff_t>((first + k) * 128);
            EXPECT_TRUE(std::equal(from, from + 100,
                                   dst.begin() + static_cast<std::ptrdiff_t>(slot(cs[k].wr_id) * 128)))
                << "receive " << cs[k].wr_id;
        }
    };
    std::size_t posted = 0;
    ASSERT_FALSE(post(0, 8, &posted));
    {
        // A takes two and the server polls them.
        auto a = connect({}, on(q));
        send(a, 0, 2);
        check(expect_ok(*a.server, 2), 0, {0, 1});
    } // A goes, both sides; six receives stay in the queue.
    {
        // B takes two, which the server never polls before B goes: their slots are free
        // once it is gone.
        auto b = connect({}, on(q));
        send(b, 2, 2);
        std::this_thread::sleep_for(iwarp() ? 300ms : 50ms); // iWARP: sent is not yet placed
    }
    // Four receives left (4..7), four slots free: exactly four more go in.
    EXPECT_EQ(post(10, 5, &posted), errc::would_block);
    EXPECT_EQ(posted, 4u);
    // C consumes what the others left, in the order posted.
    auto c = connect({}, on(q));
    send(c, 4, 8);
    check(expect_ok(*c.server, 8), 4, {4, 5, 6, 7, 10, 11, 12, 13});
    // Everything was polled or went with its connection: the whole depth is free again.
    EXPECT_FALSE(post(20, 8, &posted));
    EXPECT_EQ(posted, 8u);
    EXPECT_EQ(post(28, 1, &posted), errc::would_block);
    send(c, 12, 1);
    check(expect_ok(*c.server, 1), 12, {20});
}

TEST_P(srq, the_domain_may_go_before_its_queue_and_connections)
{
    auto q = make_srq(qopts(8, 1));
    if (!q)
        GTEST_SKIP() << skip_;
    std::vector<std::byte> dst(256), src(256, std::byte{5});
    auto dmr = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::none);
    sge r{dmr.get(), 0, dst.size()};
    ASSERT_FALSE(q->post_recv({&r, 1}, 1));
    auto p = connect({}, on(q));
    sge s{smr.get(), 0, src.size()};
    ASSERT_FALSE(p.client->post_send({&s, 1}, 1));
    expect_ok(*p.server, 1);
    EXPECT_EQ(dst, src);
    // The application's handles go first; the queue and the connection keep what they need.
    listener_.reset();
    server_dom_.reset();
    p.server.reset(); // still in use by the queue's last holder...
    dmr.reset();
    q.reset(); // ...until here: nothing may be torn down on a thread that it would join
    p.client.reset();
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool sanitized_allocator = true;
#elif defined(__has_feature)
constexpr bool sanitized_allocator = __has_feature(address_sanitizer);
#else
constexpr bool sanitized_allocator = false;
#endif

/// Resident set size of this process, in bytes.
std::size_t rss_bytes()
{
    std::ifstream f("/proc/self/statm");
    std::size_t pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

/// Heap bytes in use (malloc's own count: unlike RSS, not blurred by freed memory reused).
std::size_t heap_bytes()
{
    struct mallinfo2 m = ::mallinfo2();
    return m.uordblks + m.hblkhd; // small blocks and the large ones malloc maps on their own
}

// Not a timed test: it records what 64 connections cost with 128-deep receive queues of
// their own (4 KiB buffers each) and with one shared queue of 1024 instead. The 64 clients
// (in this process too) are small and the same in both runs.
TEST_P(srq, memory_per_connection_with_and_without_a_shared_queue)
{
    constexpr std::size_t conns = 64, own_depth = 128, shared_depth = 1024, buf = 4096;
    auto probe = make_srq(qopts(1, 1));
    if (!probe)
        GTEST_SKIP() << skip_;
    probe.reset();
    if (iwarp())
        GTEST_SKIP()
            << "measured on tcp and RoCE; siw0 in the guest refuses the fifth QP on a 1024-deep shared "
               "queue (ibv_create_qp: EAGAIN)";
    connection_options co;
    co.recv_queue_depth = 1;
    co.send_queue_depth = 16;
    struct growth {
        std::size_t rss, heap, buffers;
    };
    auto measure = [&](bool shared) -> growth {
        ::malloc_trim(0);
        const std::size_t rss0 = rss_bytes(), heap0 = heap_bytes();
        std::shared_ptr<shared_receive_queue> q;
        std::vector<std::byte> mem((shared ? shared_depth : conns * own_depth) * buf);
        std::fill(mem.begin(), mem.end(), std::byte{1}); // resident, as posted buffers are
        auto mr = server_dom_->register_memory(mem.data(), mem.size(), access::local_write);
        connection_options so;
        so.max_recv_sge = 1;
        if (shared) {
            q = server_dom_->create_shared_receive_queue(qopts(shared_depth, 1));
            for (std::size_t i = 0; i < shared_depth; ++i) {
                sge s{mr.get(), i * buf, buf};
                EXPECT_FALSE(q->post_recv({&s, 1}, i));
            }
            so.srq = q;
        } else {
            so.recv_queue_depth = own_depth;
        }
        std::vector<pair> ps;
        for (std::size_t c = 0; c < conns; ++c) {
            try {
                ps.push_back(connect(co, so));
            } catch (const std::exception& e) {
                throw std::runtime_error(std::string(shared ? "shared queue" : "own queues") +
                                         ", connection " + std::to_string(c) + ": " + e.what());
            }
            for (std::size_t i = 0; !shared && i < own_depth; ++i) {
                sge s{mr.get(), (c * own_depth + i) * buf, buf};
                EXPECT_FALSE(ps.back().server->post_recv({&s, 1}, i));
            }
        }
        const std::size_t rss1 = rss_bytes(), heap1 = heap_bytes();
        ps.clear();
        // TCP engines linger until their peer's EOF: let them go before the next baseline.
        std::this_thread::sleep_for(500ms);
        return {rss1 - std::min(rss0, rss1), heap1 - std::min(heap0, heap1), mem.size()};
    };
    growth shared = measure(true), own = measure(false);
    auto each = [&](std::size_t bytes, std::size_t minus) {
        return (bytes - std::min(bytes, minus)) / conns >> 10;
    };
    std::printf("[ memory   ] %s, 64 connections: own 128-deep receive queues: RSS +%zu KiB (%zu KiB per "
                "connection; %zu KiB without the buffers), heap +%zu KiB without the buffers (%zu KiB per "
                "connection)\n",
                to_string(b_), own.rss >> 10, each(own.rss, 0), each(own.rss, own.buffers),
                (own.heap - std::min(own.heap, own.buffers)) >> 10, each(own.heap, own.buffers));
    std::printf("[ memory   ] %s, 64 connections: one 1024-deep shared queue: RSS +%zu KiB (%zu KiB per "
                "connection; %zu KiB without the buffers), heap +%zu KiB without the buffers (%zu KiB per "
                "connection)\n",
                to_string(b_), shared.rss >> 10, each(shared.rss, 0), each(shared.rss, shared.buffers),
                (shared.heap - std::min(shared.heap, shared.buffers)) >> 10,
                each(shared.heap, shared.buffers));
    RecordProperty("rss_kib_own_queues", static_cast<int>(own.rss >> 10));
    RecordProperty("rss_kib_shared_queue", static_cast<int>(shared.rss >> 10));
    RecordProperty("heap_kib_per_connection_own_queues", static_cast<int>(each(own.heap, own.buffers)));
    RecordProperty("heap_kib_per_connection_shared_queue",
                   static_cast<int>(each(shared.heap, shared.buffers)));
    // Under ASan the process's RSS is its allocator's: freed blocks wait in a quarantine
    // (256 MiB) whose oldest are unmapped as new ones come in, so a run late in the suite
    // allocates its 32 MiB of buffers while as much leaves the quarantine (CI saw +3 MiB).
    // The connections above still ran under ASan; only the comparison is meaningless there.
    if (sanitized_allocator)
        GTEST_SKIP() << "RSS under ASan's allocator counts its quarantine, not this test's growth";
    // The buffers dominate: 32 MiB of them against 4 MiB.
    EXPECT_LT(shared.rss, own.rss);
}

INSTANTIATE_TEST_SUITE_P(backends, srq, testing::ValuesIn(selected_backends()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(srq);

} // namespace
} // namespace rdmx::test
