// Shared completion queues (rdmx/queues.hpp): many connections report to one queue, each
// completion names its connection and context, the reservations make overrun impossible,
// and a destroyed connection's completions are never returned. On every backend.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <set>

#include "common/test_data.hpp"
#include "common/test_util.hpp"
#include "lib/cq_reservation.hpp"

namespace rdmx::test
{
namespace
{

/// Polls `q` for `for_how_long` and returns everything that came.
std::vector<completion> poll_for(completion_queue& q, std::chrono::milliseconds for_how_long)
{
    std::vector<completion> out;
    completion buf[16];
    auto until = std::chrono::steady_clock::now() + for_how_long;
    while (std::chrono::steady_clock::now() < until) {
        std::size_t got = q.poll(buf);
        out.insert(out.end(), buf, buf + got);
        if (got == 0)
            std::this_thread::sleep_for(1ms);
    }
    return out;
}

/// Why the tests that keep a window of sends as deep as the receive queue skip on iWARP.
constexpr const char* no_rnr_window =
    "iWARP has no receiver-not-ready retries: senders that keep a window as deep as the "
    "receive queue while the server reposts overrun it, and the connection ends (a send "
    "completes once handed to TCP, not once received)";

class shared_cq : public pair_fixture
{
protected:
    bool iwarp() const { return server_dom_->limits().iwarp; }

    /// A client connection with `copts` and the server's end of it with `sopts`.
    pair connect_with(const connection_options& copts, const connection_options& sopts)
    {
        auto accepted = std::async(std::launch::async, [&] {
            auto req = listener_->get_request(10s);
            if (!req)
                throw std::runtime_error("no connection request within 10 s");
            return req->accept(sopts);
        });
        pair p;
        p.client = client_dom_->connect(server_address(), copts);
        p.server = accepted.get();
        return p;
    }

    // On iWARP a write completes at the initiator once sent, not once placed: give it up to
    // 5 s to land.
    template <class Ok> bool placed_eventually(Ok ok) const
    {
        auto deadline = std::chrono::steady_clock::now() + 5s;
        while (!ok() && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(1ms);
        return ok();
    }

    static connection_options small(std::uint32_t depth = 16)
    {
        connection_options o;
        o.send_queue_depth = depth;
        o.recv_queue_depth = depth;
        return o;
    }
};

// The case of the issue: 8 clients, one server thread, one CQ for all receive and send
// completions of the server's connections. Sends, writes and reads in both directions of
// one connection's traffic, each completion checked for its connection and context, and
// every byte of every transfer.
TEST_P(shared_cq, eight_connections_report_to_one_queue)
{
    constexpr int nconn = 8;
    constexpr int msgs = 6; // client -> server sends per connection
    constexpr std::size_t msg_size = 1000;
    constexpr std::size_t chunk = 4096; // server -> client write / read size
    auto cq = server_dom_->create_completion_queue({.depth = 1024});
    ASSERT_EQ(cq->backend(), b_);
    EXPECT_EQ(cq->depth(), 1024u);
    EXPECT_EQ(cq->reserved(), 0u);
    if (b_ == backend::verbs)
        EXPECT_NE(cq->native(), nullptr);
    else
        EXPECT_EQ(cq->native(), nullptr);

    struct side {
        pair p;
        std::vector<std::byte> srv_recv, srv_src, srv_sink, cli_buf, cli_recv;
        std::unique_ptr<memory_region> srv_recv_mr, srv_src_mr, srv_sink_mr, cli_buf_mr, cli_recv_mr;
    };
    std::vector<side> s(nconn);
    for (int i = 0; i < nconn; ++i) {
        connection_options sopts = small(32);
        sopts.send_cq = sopts.recv_cq = cq;
        sopts.context = 100 + i;
        connection_options copts = small(32);
        copts.context = 200 + i;
        s[i].p = connect_with(copts, sopts);
        EXPECT_EQ(cq->reserved(), 65u * (i + 1));
        EXPECT_EQ(s[i].p.server->completion_fd(), -1) << "both sides shared: no fd of its own";
        s[i].srv_recv.resize(msgs * msg_size);
        s[i].srv_src = pattern(chunk, 1000 + i);
        s[i].srv_sink.resize(chunk);
        s[i].cli_buf =
            pattern(2 * chunk, 2000 + i); // [0, chunk): write target; [chunk, 2 chunk): read source
        std::fill(s[i].cli_buf.begin(), s[i].cli_buf.begin() + chunk, std::byte{0});
        s[i].cli_recv.resize(64);
        s[i].srv_recv_mr =
            server_dom_->register_memory(s[i].srv_recv.data(), s[i].srv_recv.size(), access::local_write);
        s[i].srv_src_mr =
            server_dom_->register_memory(s[i].srv_src.data(), s[i].srv_src.size(), access::local_write);
        s[i].srv_sink_mr =
            server_dom_->register_memory(s[i].srv_sink.data(), s[i].srv_sink.size(), access::local_write);
        s[i].cli_buf_mr =
            client_dom_->register_memory(s[i].cli_buf.data(), s[i].cli_buf.size(),
                                         access::local_write | access::remote_write | access::remote_read);
        s[i].cli_recv_mr =
            client_dom_->register_memory(s[i].cli_recv.data(), s[i].cli_recv.size(), access::local_write);
        for (int k = 0; k < msgs; ++k) {
            sge rs{s[i].srv_recv_mr.get(), k * msg_size, msg_size};
            ASSERT_FALSE(s[i].p.server->post_recv({&rs, 1}, std::uint64_t(i) << 8 | k));
        }
        sge cr{s[i].cli_recv_mr.get(), 0, 64};
        ASSERT_FALSE(s[i].p.client->post_recv({&cr, 1}, 77));
    }

    // Clients send; the server sees every receive on the one queue.
    std::vector<std::vector<std::byte>> sent(nconn);
    std::vector<std::unique_ptr<memory_region>> sent_mr(nconn);
    for (int i = 0; i < nconn; ++i) {
        sent[i].resize(msgs * msg_size);
        for (int k = 0; k < msgs; ++k) {
            auto pat = pattern(msg_size, 31 * i + k);
            std::memcpy(sent[i].data() + k * msg_size, pat.data(), msg_size);
        }
        sent_mr[i] = client_dom_->register_memory(sent[i].data(), sent[i].size(), access::local_write);
        for (int k = 0; k < msgs; ++k) {
            sge ss{sent_mr[i].get(), k * msg_size, msg_size};
            ASSERT_FALSE(s[i].p.client->post_send({&ss, 1}, 500 + k));
        }
    }
    auto recvs = poll_n(*cq, nconn * msgs);
    ASSERT_EQ(recvs.size(), std::size_t(nconn * msgs));
    std::map<int, int> per_conn;
    for (const completion& c : recvs) {
        ASSERT_FALSE(c.status) << c.status.message();
        EXPECT_EQ(c.opcode, opcode::recv);
        const int i = static_cast<int>(c.wr_id >> 8), k = static_cast<int>(c.wr_id & 0xff);
        ASSERT_LT(i, nconn);
        EXPECT_EQ(c.conn, s[i].p.server.get()) << "wr_id " << c.wr_id;
        EXPECT_EQ(c.context, std::uint64_t(100 + i));
        EXPECT_EQ(c.byte_len, msg_size);
        EXPECT_EQ(std::memcmp(s[i].srv_recv.data() + k * msg_size, sent[i].data() + k * msg_size, msg_size),
                  0)
            << "connection " << i << " message " << k;
        ++per_conn[i];
    }
    for (int i = 0; i < nconn; ++i)
        EXPECT_EQ(per_conn[i], msgs) << "connection " << i;

    // The clients' own queues: their sends completed, naming them and their context.
    for (int i = 0; i < nconn; ++i) {
        auto cs = expect_ok(*s[i].p.client, msgs);
        for (auto& c : cs) {
            EXPECT_EQ(c.conn, s[i].p.client.get());
            EXPECT_EQ(c.context, std::uint64_t(200 + i));
            EXPECT_EQ(c.opcode, opcode::send);
        }
    }

    // The server answers each: a write into the client, a read from it, then a send (after
    // the write: its arrival proves the write placed). Completions of all three on the queue.
    for (int i = 0; i < nconn; ++i) {
        remote_buffer rb = s[i].cli_buf_mr->remote();
        sge ws{s[i].srv_src_mr.get(), 0, chunk};
        sge rs{s[i].srv_sink_mr.get(), 0, chunk};
        sge ss{s[i].srv_src_mr.get(), 0, 64};
        ASSERT_FALSE(s[i].p.server->post_write({&ws, 1}, *rb.slice(0, chunk), std::uint64_t(i) << 8 | 1));
        ASSERT_FALSE(s[i].p.server->post_read({&rs, 1}, *rb.slice(chunk, chunk), std::uint64_t(i) << 8 | 2));
        ASSERT_FALSE(s[i].p.server->post_send({&ss, 1}, std::uint64_t(i) << 8 | 3));
    }
    auto sends = poll_n(*cq, 3 * nconn);
    ASSERT_EQ(sends.size(), std::size_t(3 * nconn));
    std::set<std::uint64_t> seen;
    for (const completion& c : sends) {
        ASSERT_FALSE(c.status) << c.status.message();
        const int i = static_cast<int>(c.wr_id >> 8);
        ASSERT_LT(i, nconn);
        EXPECT_EQ(c.conn, s[i].p.server.get());
        EXPECT_EQ(c.context, std::uint64_t(100 + i));
        // siw completes a read after the writes and sends behind it: matched by wr_id.
        const opcode want[] = {opcode::unknown, opcode::write, opcode::read, opcode::send};
        EXPECT_EQ(c.opcode, want[c.wr_id & 0xff]) << "wr_id " << c.wr_id;
        EXPECT_TRUE(seen.insert(c.wr_id).second) << "wr_id " << c.wr_id << " twice";
    }
    for (int i = 0; i < nconn; ++i) {
        auto cs = expect_ok(*s[i].p.client, 1);
        ASSERT_EQ(cs.size(), 1u);
        EXPECT_EQ(cs[0].wr_id, 77u);
        EXPECT_EQ(cs[0].conn, s[i].p.client.get());
        EXPECT_EQ(std::memcmp(s[i].cli_recv.data(), s[i].srv_src.data(), 64), 0);
        EXPECT_EQ(std::memcmp(s[i].cli_buf.data(), s[i].srv_src.data(), chunk), 0) << "write " << i;
        EXPECT_EQ(std::memcmp(s[i].srv_sink.data(), s[i].cli_buf.data() + chunk, chunk), 0) << "read " << i;
        auto expect_read = pattern(2 * chunk, 2000 + i);
        EXPECT_EQ(std::memcmp(s[i].srv_sink.data(), expect_read.data() + chunk, chunk), 0) << "read " << i;
    }
    // Nothing more: no duplicates, nothing of the connections' own.
    EXPECT_TRUE(poll_for(*cq, 50ms).empty());
    for (auto& x : s) {
        completion c[4];
        EXPECT_EQ(x.p.server->poll(c), 0u) << "connection::poll() of shared sides returns nothing";
    }
    s.clear();
    EXPECT_EQ(cq->reserved(), 0u) << "destroying the connections frees their reservations";
}

// Send and receive sides on two queues; a side without a queue keeps its own.
TEST_P(shared_cq, send_and_receive_sides_report_to_separate_queues)
{
    auto scq = server_dom_->create_completion_queue({.depth = 64});
    auto rcq = server_dom_->create_completion_queue({.depth = 64});
    connection_options sopts = small(8);
    sopts.send_cq = scq;
    sopts.recv_cq = rcq;
    sopts.context = 42;
    auto p = connect_with(small(8), sopts);
    EXPECT_EQ(scq->reserved(), 9u);
    EXPECT_EQ(rcq->reserved(), 8u);
    EXPECT_EQ(p.server->completion_fd(), -1);
    EXPECT_TRUE(p.server->request_notify()) << "nothing of its own to arm";

    std::vector<std::byte> a = pattern(256, 5), b(256);
    auto amr = client_dom_->register_memory(a.data(), a.size(), access::local_write);
    auto bmr = server_dom_->register_memory(b.data(), b.size(), access::local_write);
    sge rs{bmr.get(), 0, 256};
    ASSERT_FALSE(p.server->post_recv({&rs, 1}, 1));
    sge ss{amr.get(), 0, 256};
    ASSERT_FALSE(p.client->post_send({&ss, 1}, 2));
    auto rc = poll_n(*rcq, 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_FALSE(rc[0].status);
    EXPECT_EQ(rc[0].opcode, opcode::recv);
    EXPECT_EQ(rc[0].wr_id, 1u);
    EXPECT_EQ(rc[0].conn, p.server.get());
    EXPECT_EQ(rc[0].context, 42u);
    EXPECT_EQ(b, a);
    expect_ok(*p.client, 1);

    // The answer: its completion on the send queue only.
    sge back{bmr.get(), 0, 128};
    std::vector<std::byte> c(128);
    auto cmr = client_dom_->register_memory(c.data(), c.size(), access::local_write);
    sge cr{cmr.get(), 0, 128};
    ASSERT_FALSE(p.client->post_recv({&cr, 1}, 3));
    ASSERT_FALSE(p.server->post_send({&back, 1}, 4));
    auto sc = poll_n(*scq, 1);
    ASSERT_EQ(sc.size(), 1u);
    EXPECT_FALSE(sc[0].status);
    EXPECT_EQ(sc[0].opcode, opcode::send);
    EXPECT_EQ(sc[0].wr_id, 4u);
    EXPECT_EQ(sc[0].conn, p.server.get());
    EXPECT_EQ(sc[0].context, 42u);
    expect_ok(*p.client, 1);
    EXPECT_EQ(std::memcmp(c.data(), a.data(), 128), 0);
    EXPECT_TRUE(poll_for(*rcq, 20ms).empty());
    EXPECT_TRUE(poll_for(*scq, 20ms).empty());
    completion none[4];
    EXPECT_EQ(p.server->poll(none), 0u);
}

// The connecting side shares a queue just as well.
TEST_P(shared_cq, connecting_sides_share_a_queue_too)
{
    constexpr int nconn = 3;
    auto ccq = client_dom_->create_completion_queue({.depth = 64});
    std::vector<pair> ps;
    std::vector<std::byte> out = pattern(512, 6), back(nconn * 512), in(nconn * 512);
    auto omr = client_dom_->register_memory(out.data(), out.size(), access::local_write);
    auto bmr = client_dom_->register_memory(back.data(), back.size(), access::local_write);
    auto imr = server_dom_->register_memory(in.data(), in.size(), access::local_write);
    for (int i = 0; i < nconn; ++i) {
        connection_options copts = small(8);
        copts.send_cq = copts.recv_cq = ccq;
        copts.context = 10 + i;
        ps.push_back(connect_with(copts, small(8)));
        EXPECT_EQ(ps[i].client->completion_fd(), -1);
        sge rs{imr.get(), std::size_t(i) * 512, 512};
        ASSERT_FALSE(ps[i].server->post_recv({&rs, 1}, 1));
        sge br{bmr.get(), std::size_t(i) * 512, 512};
        ASSERT_FALSE(ps[i].client->post_recv({&br, 1}, 2));
        sge ss{omr.get(), 0, 512};
        ASSERT_FALSE(ps[i].client->post_send({&ss, 1}, 3));
    }
    EXPECT_EQ(ccq->reserved(), 17u * nconn);
    // The server echoes each message back.
    for (int i = 0; i < nconn; ++i) {
        auto cs = expect_ok(*ps[i].server, 1);
        ASSERT_EQ(cs.size(), 1u);
        EXPECT_EQ(cs[0].conn, ps[i].server.get());
        sge es{imr.get(), std::size_t(i) * 512, 512};
        ASSERT_FALSE(ps[i].server->post_send({&es, 1}, 4));
    }
    auto cs = poll_n(*ccq, 2 * nconn);
    ASSERT_EQ(cs.size(), std::size_t(2 * nconn));
    std::map<std::uint64_t, std::set<std::uint64_t>> per_ctx;
    for (auto& c : cs) {
        ASSERT_FALSE(c.status) << c.status.message();
        ASSERT_GE(c.context, 10u);
        ASSERT_LT(c.context, std::uint64_t(10 + nconn));
        EXPECT_EQ(c.conn, ps[c.context - 10].client.get());
        EXPECT_EQ(c.opcode, c.wr_id == 2 ? opcode::recv : opcode::send);
        per_ctx[c.context].insert(c.wr_id);
    }
    for (int i = 0; i < nconn; ++i) {
        EXPECT_EQ(per_ctx[10 + i], (std::set<std::uint64_t>{2, 3})) << "connection " << i;
        EXPECT_EQ(std::memcmp(back.data() + i * 512, out.data(), 512), 0) << "connection " << i;
    }
    for (auto& p : ps)
        expect_ok(*p.server, 1);
}

// Only the receive side shared: the connection's own poll() and fd serve its send side.
TEST_P(shared_cq, a_side_without_a_shared_queue_keeps_its_own)
{
    auto rcq = server_dom_->create_completion_queue({.depth = 64});
    connection_options sopts = small(8);
    sopts.recv_cq = rcq;
    sopts.context = 9;
    auto p = connect_with(small(8), sopts);
    EXPECT_EQ(rcq->reserved(), 8u);
    EXPECT_GE(p.server->completion_fd(), 0);

    std::vector<std::byte> a = pattern(64, 1), b(64);
    auto amr = client_dom_->register_memory(a.data(), a.size(), access::local_write);
    auto bmr = server_dom_->register_memory(b.data(), b.size(),
                                            access::local_write | access::remote_write | access::remote_read);
    sge rs{bmr.get(), 0, 64};
    ASSERT_FALSE(p.server->post_recv({&rs, 1}, 1));
    sge ss{amr.get(), 0, 64};
    ASSERT_FALSE(p.client->post_send({&ss, 1}, 2));
    // The receive shows on the shared queue, never on the connection.
    auto rc = poll_n(*rcq, 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].conn, p.server.get());
    EXPECT_EQ(rc[0].context, 9u);
    EXPECT_EQ(b, a);
    // The send side: the connection's own queue, in event mode too.
    std::vector<std::byte> c(64);
    auto cmr = client_dom_->register_memory(c.data(), c.size(), access::local_write);
    sge cr{cmr.get(), 0, 64};
    ASSERT_FALSE(p.client->post_recv({&cr, 1}, 3));
    ASSERT_FALSE(p.server->post_send({&rs, 1}, 4));
    completion out[4];
    std::size_t n = p.server->wait(out, 10s);
    ASSERT_EQ(n, 1u);
    EXPECT_FALSE(out[0].status);
    EXPECT_EQ(out[0].wr_id, 4u);
    EXPECT_EQ(out[0].conn, p.server.get());
    EXPECT_EQ(out[0].context, 9u);
    EXPECT_TRUE(poll_for(*rcq, 20ms).empty());
    expect_ok(*p.client, 2);
    EXPECT_EQ(c, a);
}

// Event mode: a server thread asleep in epoll on the queue's fd wakes for each message.
TEST_P(shared_cq, event_mode_wakes_a_thread_sleeping_on_the_fd)
{
    constexpr int nconn = 3, rounds = 5;
    auto cq = server_dom_->create_completion_queue({.depth = 256});
    std::vector<pair> ps;
    std::vector<std::vector<std::byte>> rbuf(nconn, std::vector<std::byte>(64));
    std::vector<std::unique_ptr<memory_region>> rmr;
    for (int i = 0; i < nconn; ++i) {
        connection_options sopts = small(16);
        sopts.send_cq = sopts.recv_cq = cq;
        sopts.context = i + 1;
        ps.push_back(connect_with(small(16), sopts));
        rmr.push_back(server_dom_->register_memory(rbuf[i].data(), 64, access::local_write));
        for (int r = 0; r < rounds; ++r) {
            sge rs{rmr[i].get(), 0, 64};
            ASSERT_FALSE(ps[i].server->post_recv({&rs, 1}, r));
        }
    }
    std::vector<std::byte> msg = pattern(64, 3);
    auto mmr = client_dom_->register_memory(msg.data(), msg.size(), access::local_write);

    int ep = epoll_create1(EPOLL_CLOEXEC);
    ASSERT_GE(ep, 0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, cq->fd(), &ev), 0);

    std::atomic<int> received{0}, wakes{0};
    std::atomic<bool> asleep{false};
    std::vector<completion> got;
    std::thread server([&] {
        completion buf[8];
        auto deadline = std::chrono::steady_clock::now() + 30s;
        while (received < nconn * rounds && std::chrono::steady_clock::now() < deadline) {
            std::size_t n = cq->poll(buf);
            if (n == 0) {
                ASSERT_FALSE(cq->request_notify());
                n = cq->poll(buf); // what came before arming raises no event
                if (n == 0) {
                    asleep = true;
                    epoll_event out;
                    int rc = epoll_wait(ep, &out, 1, 10000);
                    asleep = false;
                    if (rc == 1) {
                        ++wakes;
                        ASSERT_FALSE(cq->ack_notify());
                    }
                    continue;
                }
            }
            got.insert(got.end(), buf, buf + n);
            received += static_cast<int>(n);
        }
    });
    for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < nconn; ++i) {
            // Send only once the server sleeps: each message must wake it.
            auto until = std::chrono::steady_clock::now() + 5s;
            while (!asleep && std::chrono::steady_clock::now() < until)
                std::this_thread::sleep_for(1ms);
            std::this_thread::sleep_for(2ms);
            int before = received;
            sge ss{mmr.get(), 0, 64};
            ASSERT_FALSE(ps[i].client->post_send({&ss, 1}, r));
            until = std::chrono::steady_clock::now() + 10s;
            while (received == before && std::chrono::steady_clock::now() < until)
                std::this_thread::sleep_for(1ms);
            ASSERT_GT(received, before) << "round " << r << " connection " << i << ": no wake-up";
        }
    }
    server.join();
    ::close(ep);
    ASSERT_EQ(got.size(), std::size_t(nconn * rounds));
    EXPECT_GE(wakes, nconn * rounds / 2) << "the server should have slept for most messages";
    std::map<std::uint64_t, int> per_ctx;
    for (auto& c : got) {
        EXPECT_FALSE(c.status);
        ASSERT_GE(c.context, 1u);
        ASSERT_LE(c.context, std::uint64_t(nconn));
        EXPECT_EQ(c.conn, ps[c.context - 1].server.get());
        EXPECT_EQ(c.wr_id, std::uint64_t(per_ctx[c.context]++))
            << "receives complete in order per connection";
    }
    for (int i = 0; i < nconn; ++i)
        EXPECT_EQ(rbuf[i], msg);

    // completion_queue::wait, the helper over the same steps.
    completion out[4];
    EXPECT_EQ(cq->wait(out, 50ms), 0u);
    std::thread late([&] {
        std::this_thread::sleep_for(50ms);
        sge rs{rmr[0].get(), 0, 64};
        (void)ps[0].server->post_recv({&rs, 1}, 99);
        sge ss{mmr.get(), 0, 64};
        (void)ps[0].client->post_send({&ss, 1}, 99);
    });
    std::size_t n = cq->wait(out, 10s);
    late.join();
    ASSERT_EQ(n, 1u);
    EXPECT_EQ(out[0].wr_id, 99u);
    EXPECT_EQ(out[0].conn, ps[0].server.get());
}

// Overrun is impossible: a connection whose depth does not fit is refused with
// no_resources naming the queue, and its reservation is free again once it goes.
TEST_P(shared_cq, a_connection_that_does_not_fit_is_refused_and_reservations_are_freed)
{
    auto cq = server_dom_->create_completion_queue({.depth = 26});
    EXPECT_EQ(cq->depth(), 26u);
    connection_options sopts = small(8);
    sopts.send_cq = sopts.recv_cq = cq;
    auto first = connect_with(small(8), sopts);
    EXPECT_EQ(cq->reserved(), 17u);

    // The server side: the send side (8 + 1) would fit, the receive side (8 more) not: accept
    // refuses, the client's connect fails, and nothing stays reserved.
    {
        auto accepted = std::async(std::launch::async, [&]() -> std::error_code {
            auto req = listener_->get_request(10s);
            if (!req)
                return errc::timed_out;
            try {
                req->accept(sopts);
            } catch (const error& e) {
                EXPECT_NE(std::string(e.what()).find("recv_cq"), std::string::npos) << e.what();
                EXPECT_NE(std::string(e.what()).find("accept"), std::string::npos) << e.what();
                return e.code();
            }
            return {};
        });
        EXPECT_THROW(client_dom_->connect(server_address(), small(8)), error);
        EXPECT_EQ(accepted.get(), errc::no_resources);
        EXPECT_EQ(cq->reserved(), 17u) << "a refused connection keeps nothing reserved";
    }
    // The client side refuses before the peer hears of it.
    {
        auto ccq = client_dom_->create_completion_queue({.depth = 12});
        connection_options copts = small(8);
        copts.send_cq = ccq;
        auto c1 = connect_with(copts, small(8));
        EXPECT_EQ(ccq->reserved(), 9u);
        try {
            client_dom_->connect(server_address(), copts);
            ADD_FAILURE() << "connect should have been refused";
        } catch (const error& e) {
            EXPECT_EQ(e.code(), errc::no_resources) << e.what();
            EXPECT_NE(std::string(e.what()).find("connect"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("send_cq"), std::string::npos) << e.what();
        }
        EXPECT_EQ(listener_->get_request(200ms), nullptr) << "the refused connect reached the listener";
        EXPECT_EQ(ccq->reserved(), 9u);
        c1.client.reset();
        EXPECT_EQ(ccq->reserved(), 0u);
        auto c2 = connect_with(copts, small(8));
        EXPECT_EQ(ccq->reserved(), 9u);
    }
    // The first connection goes: its room is free, and a new one fits.
    first.client.reset();
    first.server.reset();
    EXPECT_EQ(cq->reserved(), 0u);
    auto again = connect_with(small(8), sopts);
    EXPECT_EQ(cq->reserved(), 17u);
    EXPECT_EQ(again.server->state(), connection_state::established);
}

// The send queue's slots are freed when the completion is polled from the shared queue,
// as from the connection's own: rdmx's own accounting keeps working.
TEST_P(shared_cq, send_slots_are_freed_when_the_shared_queue_is_polled)
{
    auto cq = server_dom_->create_completion_queue({.depth = 64});
    connection_options sopts = small(4);
    sopts.send_cq = cq;
    auto p = connect_with(small(4), sopts);
    std::vector<std::byte> src = pattern(4 * 256, 8), dst(4 * 256);
    auto smr = server_dom_->register_memory(src.data(), src.size(), access::local_write);
    auto dmr =
        client_dom_->register_memory(dst.data(), dst.size(), access::local_write | access::remote_write);
    for (int round = 0; round < 3; ++round) {
        for (int k = 0; k < 4; ++k) {
            sge ws{smr.get(), std::size_t(k) * 256, 256};
            ASSERT_FALSE(p.server->post_write({&ws, 1}, *dmr->remote().slice(k * 256, 256), k)) << k;
        }
        // All four complete, but until they are polled their slots stay taken.
        std::this_thread::sleep_for(50ms);
        sge one{smr.get(), 0, 8};
        EXPECT_EQ(p.server->post_write({&one, 1}, *dmr->remote().slice(0, 8), 9), errc::would_block);
        auto cs = poll_n(*cq, 4);
        ASSERT_EQ(cs.size(), 4u);
        for (auto& c : cs) {
            EXPECT_FALSE(c.status);
            EXPECT_EQ(c.conn, p.server.get());
        }
    }
    EXPECT_TRUE(placed_eventually([&] { return dst == src; }));
}

// A connection destroyed with completions still queued: they are never returned (nor
// handed to a later connection), and the others' are.
TEST_P(shared_cq, completions_of_a_destroyed_connection_are_not_returned)
{
    auto cq = server_dom_->create_completion_queue({.depth = 256});
    auto make = [&](std::uint64_t ctx) {
        connection_options sopts = small(16);
        sopts.send_cq = sopts.recv_cq = cq;
        sopts.context = ctx;
        return connect_with(small(16), sopts);
    };
    pair a = make(1), b = make(2);
    std::vector<std::byte> msg = pattern(128, 4);
    auto mmr = client_dom_->register_memory(msg.data(), msg.size(), access::local_write);
    std::vector<std::byte> rb(16 * 128);
    auto rmr = server_dom_->register_memory(rb.data(), rb.size(), access::local_write);
    auto exchange = [&](pair& p, int n) {
        for (int k = 0; k < n; ++k) {
            sge rs{rmr.get(), std::size_t(k) * 128, 128};
            ASSERT_FALSE(p.server->post_recv({&rs, 1}, k));
        }
        for (int k = 0; k < n; ++k) {
            sge ss{mmr.get(), 0, 128};
            ASSERT_FALSE(p.client->post_send({&ss, 1}, k));
        }
        expect_ok(*p.client, n);
    };
    exchange(a, 8);
    exchange(b, 5);
    // a's completions (8 receives) are queued, unpolled; destroy it.
    connection* gone = a.server.get();
    a.server.reset();
    a.client.reset();
    EXPECT_EQ(cq->reserved(), 33u);
    // A new connection, perhaps with the QP number of the one that went.
    pair c = make(3);
    exchange(c, 3);
    auto cs = poll_for(*cq, 300ms);
    std::map<std::uint64_t, int> per_ctx;
    for (auto& x : cs) {
        EXPECT_FALSE(x.status) << x.status.message();
        EXPECT_NE(x.context, 1u) << "a completion of the destroyed connection";
        if (x.context == 2) {
            EXPECT_EQ(x.conn, b.server.get());
        } else if (x.context == 3) {
            EXPECT_EQ(x.conn, c.server.get());
        }
        if (x.conn == gone && x.context != 3)
            ADD_FAILURE() << "a completion names the destroyed connection";
        ++per_ctx[x.context];
    }
    EXPECT_EQ(per_ctx[2], 5);
    EXPECT_EQ(per_ctx[3], 3);
    EXPECT_EQ(per_ctx.count(1), 0u);
}

// An error completion polled from a shared queue fails its connection as the own queue
// does, and only that one.
TEST_P(shared_cq, an_error_completion_fails_only_its_connection)
{
    if (iwarp())
        GTEST_SKIP() << "iWARP: a bad key tears the connection down instead of completing with an error";
    auto cq = server_dom_->create_completion_queue({.depth = 64});
    auto make = [&](std::uint64_t ctx) {
        connection_options sopts = small(8);
        sopts.send_cq = sopts.recv_cq = cq;
        sopts.context = ctx;
        return connect_with(small(8), sopts);
    };
    pair bad = make(1), good = make(2);
    std::vector<std::byte> src = pattern(64, 2), dst(64);
    auto smr = server_dom_->register_memory(src.data(), src.size(), access::local_write);
    auto dmr =
        client_dom_->register_memory(dst.data(), dst.size(), access::local_write | access::remote_write);
    remote_buffer wrong = dmr->remote();
    wrong.key ^= 0x5a5a;
    sge ws{smr.get(), 0, 64};
    ASSERT_FALSE(bad.server->post_write({&ws, 1}, wrong, 1));
    ASSERT_FALSE(bad.server->post_write({&ws, 1}, dmr->remote(), 2));
    auto cs = poll_n(*cq, 2);
    ASSERT_EQ(cs.size(), 2u);
    EXPECT_EQ(cs[0].status, errc::remote_access) << cs[0].status.message();
    EXPECT_EQ(cs[0].conn, bad.server.get());
    EXPECT_EQ(cs[0].context, 1u);
    EXPECT_EQ(cs[1].status, errc::flushed);
    EXPECT_EQ(bad.server->state(), connection_state::error);
    EXPECT_EQ(bad.server->last_error(), errc::remote_access);
    // Posting on the failed connection completes as flushed, within its room on the queue.
    std::size_t flushed = 0;
    for (int k = 0; k < 100; ++k) {
        std::error_code ec = bad.server->post_write({&ws, 1}, dmr->remote(), 10 + k);
        if (ec == errc::would_block)
            break;
        ASSERT_FALSE(ec) << ec.message();
        ++flushed;
    }
    EXPECT_LE(flushed, 8u) << "a failed connection must not fill the queue beyond its reservation";
    EXPECT_GE(flushed, 1u);
    auto fl = poll_n(*cq, flushed);
    ASSERT_EQ(fl.size(), flushed);
    for (auto& c : fl) {
        EXPECT_EQ(c.status, errc::flushed);
        EXPECT_EQ(c.conn, bad.server.get());
    }
    // The other connection on the queue is unharmed.
    EXPECT_EQ(good.server->state(), connection_state::established);
    ASSERT_FALSE(good.server->post_write({&ws, 1}, dmr->remote(), 3));
    auto ok = poll_n(*cq, 1);
    ASSERT_EQ(ok.size(), 1u);
    EXPECT_FALSE(ok[0].status) << ok[0].status.message();
    EXPECT_EQ(ok[0].conn, good.server.get());
    EXPECT_TRUE(placed_eventually([&] { return dst == src; }));
}

// A connection with a shared receive queue reserves that queue's depth once per completion
// queue, however many connections use it (the ledger, with a stand-in SRQ: only its public
// interface counts).
class fake_srq final : public shared_receive_queue
{
public:
    explicit fake_srq(std::uint32_t depth) : depth_(depth) {}
    rdmx::backend backend() const noexcept override { return backend::tcp; }
    std::uint32_t depth() const noexcept override { return depth_; }
    std::uint32_t max_sge() const noexcept override { return 1; }
    std::error_code post_recv(std::span<const recv_request>, std::size_t*) noexcept override
    {
        return errc::not_supported;
    }
    std::error_code arm_limit(std::uint32_t) noexcept override { return errc::not_supported; }

private:
    std::uint32_t depth_;
};

TEST_P(shared_cq, a_shared_receive_queue_is_reserved_once_per_completion_queue)
{
    auto cq = server_dom_->create_completion_queue({.depth = 100});
    auto srq1 = std::make_shared<fake_srq>(40);
    auto srq2 = std::make_shared<fake_srq>(30);
    connection_options o;
    o.recv_cq = cq;
    o.srq = srq1;
    connection_limits lim{.send_queue_depth = 8, .recv_queue_depth = 8};
    {
        detail::cq_reservation r1(o, lim, b_, "accept");
        EXPECT_EQ(cq->reserved(), 40u);
        detail::cq_reservation r2(o, lim, b_, "accept");
        EXPECT_EQ(cq->reserved(), 40u) << "the same SRQ: reserved once";
        o.srq = srq2;
        detail::cq_reservation r3(o, lim, b_, "accept");
        EXPECT_EQ(cq->reserved(), 70u);
        o.send_cq = cq; // 8 + 1 more for a send side (own_send_entries)
        detail::cq_reservation r4(o, lim, b_, "accept");
        EXPECT_EQ(cq->reserved(), 79u);
        o.srq = std::make_shared<fake_srq>(30); // a third SRQ does not fit
        try {
            detail::cq_reservation r5(o, lim, b_, "accept");
            ADD_FAILURE() << "no room: should be refused";
        } catch (const error& e) {
            EXPECT_EQ(e.code(), errc::no_resources);
            EXPECT_NE(std::string(e.what()).find("recv_cq"), std::string::npos) << e.what();
        }
        EXPECT_EQ(cq->reserved(), 79u) << "the refused one's send side was given back";
        r1 = {};
        EXPECT_EQ(cq->reserved(), 79u) << "srq1 still used by r2";
        r2 = {};
        EXPECT_EQ(cq->reserved(), 39u);
    }
    EXPECT_EQ(cq->reserved(), 0u);
    // A queue of another backend is refused.
    o.srq = nullptr;
    o.send_cq = nullptr;
    const backend other = b_ == backend::verbs ? backend::tcp : backend::verbs;
    EXPECT_THROW(detail::cq_reservation(o, lim, other, "connect"), error);
}

// A connection's disconnect on a shared queue (verbs: it polls the queue while it waits for
// its goodbye's completion) keeps every other connection's completions: all of them, in
// their order, at the next poll, and none of rdmx's own. The same with the connection's
// own CQ: what the disconnecting connection's peer polls is its own. On every backend.
TEST_P(shared_cq, a_disconnect_keeps_every_other_connections_completions)
{
    auto cq = server_dom_->create_completion_queue({.depth = 64});
    connection_options sopts = small(8);
    sopts.send_cq = sopts.recv_cq = cq;
    pair a = connect_with(small(8), sopts);
    pair b = connect_with(small(8), sopts);
    constexpr std::size_t nrecv = 8, nwrite = 4, size = 64;
    std::vector<std::byte> src = pattern(nrecv * size, 3), inbox(nrecv * size),
                           wsrc = pattern(nwrite * size, 4), wdst(nwrite * size);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::local_write);
    auto imr = server_dom_->register_memory(inbox.data(), inbox.size(), access::local_write);
    auto wsmr = server_dom_->register_memory(wsrc.data(), wsrc.size(), access::local_write);
    auto wdmr =
        client_dom_->register_memory(wdst.data(), wdst.size(), access::local_write | access::remote_write);
    for (std::size_t i = 0; i < nrecv; ++i) {
        sge r{imr.get(), i * size, size};
        ASSERT_FALSE(b.server->post_recv({&r, 1}, 100 + i));
    }
    for (std::size_t i = 0; i < nrecv; ++i) {
        sge s{smr.get(), i * size, size};
        ASSERT_FALSE(b.client->post_send({&s, 1}, i));
    }
    expect_ok(*b.client, nrecv);
    for (std::size_t i = 0; i < nwrite; ++i) {
        sge w{wsmr.get(), i * size, size};
        ASSERT_FALSE(b.server->post_write({&w, 1}, *wdmr->remote().slice(i * size, size), 200 + i));
    }
    // Everything of b's lands in the queue, unpolled (the sends completed at b's client).
    std::this_thread::sleep_for(300ms);

    a.server->disconnect();
    EXPECT_EQ(a.server->state(), connection_state::disconnected);

    auto got = poll_n(*cq, nrecv + nwrite, 10s);
    auto more = poll_for(*cq, 100ms);
    got.insert(got.end(), more.begin(), more.end());
    ASSERT_EQ(got.size(), nrecv + nwrite);
    std::vector<std::uint64_t> recvs, writes;
    for (const completion& c : got) {
        EXPECT_EQ(c.conn, b.server.get()) << "wr_id " << c.wr_id;
        EXPECT_NE(c.wr_id, reserved_wr_id);
        EXPECT_FALSE(c.status) << c.wr_id << ": " << c.status.message();
        (c.opcode == opcode::recv ? recvs : writes).push_back(c.wr_id);
    }
    EXPECT_EQ(recvs, (std::vector<std::uint64_t>{100, 101, 102, 103, 104, 105, 106, 107}));
    EXPECT_EQ(writes, (std::vector<std::uint64_t>{200, 201, 202, 203}));
    EXPECT_EQ(inbox, src);
    EXPECT_TRUE(placed_eventually([&] { return wdst == wsrc; }));

    // a's peer saw a clean disconnect (the goodbye arrived); b is untouched.
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (a.client->state() == connection_state::established && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    EXPECT_EQ(a.client->state(), connection_state::disconnected);
    EXPECT_EQ(a.client->last_error(), errc::disconnected) << a.client->last_error().message();
    EXPECT_EQ(b.server->state(), connection_state::established);
    EXPECT_EQ(b.client->state(), connection_state::established);
}

// Work posted to a connection whose peer has left, once this side knows it (its state
// says so), is never lost: each post fails at once in rdmx's category, or its request
// completes flushed, on the connection's own CQ and on a shared one. siw leaves a request
// posted to a QP in the error state in its send queue for good (its doorbell flushes
// nothing there); rdmx completes it (verbs_connection::strands_). The same race on a
// connection whose peer just died is what made shapes' clients_killed_mid_transfer
// flaky on siw.
TEST_P(shared_cq, work_posted_after_the_peer_left_completes_flushed)
{
    auto cq = server_dom_->create_completion_queue({.depth = 64});
    for (const bool shared : {false, true}) {
        SCOPED_TRACE(shared ? "shared CQ" : "own CQ");
        connection_options sopts = small(8);
        if (shared)
            sopts.send_cq = sopts.recv_cq = cq;
        pair p = connect_with(small(8), sopts);
        std::vector<std::byte> src = pattern(256, 9), dst(256);
        auto smr = server_dom_->register_memory(src.data(), src.size(), access::local_write);
        auto dmr =
            client_dom_->register_memory(dst.data(), dst.size(), access::local_write | access::remote_write);
        const auto target = *dmr->remote().slice(0, 64);
        p.client->disconnect();
        auto deadline = std::chrono::steady_clock::now() + 10s;
        while (p.server->state() == connection_state::established &&
               std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(1ms);
        ASSERT_NE(p.server->state(), connection_state::established) << "the peer's disconnect never arrived";
        std::this_thread::sleep_for(50ms); // whatever the provider does at the end is done

        std::size_t posted = 0;
        for (std::uint64_t round = 0; round < 2; ++round) {
            sge a{smr.get(), 0, 64}, b{smr.get(), 64, 64}, w{smr.get(), 128, 64};
            const std::error_code ecs[] = {p.server->post_send({&a, 1}, 10 * round + 1),
                                           p.server->post_send({&b, 1}, 10 * round + 2),
                                           p.server->post_write({&w, 1}, target, 10 * round + 3)};
            for (const std::error_code& ec : ecs) {
                if (ec)
                    EXPECT_EQ(&ec.category(), &rdmx::category()) << ec.message();
                else
                    ++posted;
            }
            std::vector<completion> got =
                shared ? poll_n(*cq, posted, 10s) : test::poll_n(*p.server, posted, 10s);
            auto more = shared ? poll_for(*cq, 100ms) : test::poll_n(*p.server, 1, 100ms);
            EXPECT_EQ(got.size(), posted) << "round " << round << ": requests posted but never completed";
            EXPECT_TRUE(more.empty()) << "a completion too many, wr_id " << more.front().wr_id;
            for (const completion& c : got) {
                EXPECT_EQ(c.conn, p.server.get());
                EXPECT_EQ(c.status, errc::flushed) << c.wr_id << ": " << c.status.message();
            }
            posted = 0;
        }
    }
}

// Progress is made by whichever queue is polled (issue 27). On TCP a busy poller of a
// shared queue reads its connections' sockets itself, and their engine leaves them to it.
// The poller then sleeps on the queue's fd and must wake for the next message; then it
// polls only another queue, and the first connection's one-sided target is still served.
TEST_P(shared_cq, a_poller_that_sleeps_or_polls_another_queue_still_gets_progress)
{
    auto q1 = server_dom_->create_completion_queue({.depth = 256});
    auto q2 = server_dom_->create_completion_queue({.depth = 256});
    connection_options s1 = small(16), s2 = small(16);
    s1.send_cq = s1.recv_cq = q1;
    s2.send_cq = s2.recv_cq = q2;
    pair a = connect_with(small(16), s1), b = connect_with(small(16), s2);
    std::vector<std::byte> target = pattern(8192, 5), rbuf(64), cbuf(8192), cmsg = pattern(64, 6);
    auto tmr = server_dom_->register_memory(target.data(), target.size(),
                                            access::local_write | access::remote_write | access::remote_read);
    auto rmr = server_dom_->register_memory(rbuf.data(), rbuf.size(), access::local_write);
    auto cmr = client_dom_->register_memory(cbuf.data(), cbuf.size(), access::local_write);
    auto mmr = client_dom_->register_memory(cmsg.data(), cmsg.size(), access::local_write);
    sge rs{rmr.get(), 0, 64}, ss{mmr.get(), 0, 64};

    // 1. Messages on a, the server busy-polling q1 (and nothing else).
    for (int r = 0; r < 200; ++r) {
        ASSERT_FALSE(a.server->post_recv({&rs, 1}, r));
        ASSERT_FALSE(a.client->post_send({&ss, 1}, r));
        auto got = poll_n(*q1, 1, 10s);
        ASSERT_EQ(got.size(), 1u) << "message " << r;
        ASSERT_FALSE(got[0].status) << got[0].status.message();
        EXPECT_EQ(got[0].wr_id, std::uint64_t(r));
        ASSERT_EQ(expect_ok(*a.client, 1).size(), 1u);
    }

    // 2. The poller sleeps on q1's fd; a message sent right then must wake it.
    for (int r = 0; r < 5; ++r) {
        ASSERT_FALSE(a.server->post_recv({&rs, 1}, 1000 + r));
        std::atomic<bool> asleep{false};
        std::thread sender([&] {
            while (!asleep)
                std::this_thread::yield();
            (void)a.client->post_send({&ss, 1}, 1000 + r);
        });
        completion c[2];
        std::size_t n = q1->poll(c);
        if (n == 0) {
            ASSERT_FALSE(q1->request_notify());
            n = q1->poll(c); // what came before arming raises no event
        }
        if (n == 0) {
            pollfd pfd{q1->fd(), POLLIN, 0};
            asleep = true;
            EXPECT_EQ(::poll(&pfd, 1, 10000), 1) << "round " << r << ": no wake-up in 10 s";
            ASSERT_FALSE(q1->ack_notify());
            n = q1->poll(c);
        }
        asleep = true;
        sender.join();
        ASSERT_EQ(n, 1u) << "round " << r;
        EXPECT_EQ(c[0].wr_id, std::uint64_t(1000 + r));
        EXPECT_FALSE(c[0].status);
        ASSERT_EQ(expect_ok(*a.client, 1).size(), 1u);
        // Busy again for a while: the engine leaves the socket to the poller again.
        for (int k = 0; k < 20; ++k) {
            ASSERT_FALSE(a.server->post_recv({&rs, 1}, k));
            ASSERT_FALSE(a.client->post_send({&ss, 1}, k));
            ASSERT_EQ(poll_n(*q1, 1, 10s).size(), 1u);
            ASSERT_EQ(expect_ok(*a.client, 1).size(), 1u);
        }
    }

    // 3. The server polls only q2 (b's messages) while a's client writes into and reads
    // from the server's memory: a's target is served all the same.
    std::vector<std::byte> wsrc = pattern(4096, 7);
    auto wmr = client_dom_->register_memory(wsrc.data(), wsrc.size(), access::local_write);
    remote_buffer rb = tmr->remote();
    std::atomic<bool> done{false};
    std::atomic<int> b_got{0};
    std::thread server([&] {
        completion c[8];
        while (!done) {
            std::size_t n = q2->poll(c);
            for (std::size_t i = 0; i < n; ++i)
                if (!c[i].status && c[i].opcode == opcode::recv)
                    ++b_got;
        }
    });
    for (int k = 0; k < 8; ++k) {
        sge brs{rmr.get(), 0, 64};
        ASSERT_FALSE(b.server->post_recv({&brs, 1}, k)); // only the server thread polls q2
    }
    for (int k = 0; k < 8; ++k) {
        sge bss{mmr.get(), 0, 64};
        ASSERT_FALSE(b.client->post_send({&bss, 1}, k));
    }
    sge w{wmr.get(), 0, 4096}, rd{cmr.get(), 0, 4096};
    ASSERT_FALSE(a.client->post_write({&w, 1}, *rb.slice(0, 4096), 1));
    ASSERT_FALSE(a.client->post_read({&rd, 1}, *rb.slice(0, 4096), 2));
    auto cs = expect_ok(*a.client, 2, 10s);
    ASSERT_EQ(expect_ok(*b.client, 8).size(), 8u);
    auto until = std::chrono::steady_clock::now() + 10s;
    while (b_got < 8 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
    done = true;
    server.join();
    ASSERT_EQ(cs.size(), 2u) << "the one-sided requests on a were not served";
    EXPECT_EQ(std::memcmp(target.data(), wsrc.data(), 4096), 0) << "the write did not land";
    EXPECT_EQ(std::memcmp(cbuf.data(), wsrc.data(), 4096), 0) << "the read returned other bytes";
    EXPECT_EQ(b_got, 8);
    completion c[4];
    EXPECT_EQ(q1->poll(c), 0u) << "nothing of a's client's one-sided requests on the target's queue";
}

// A poller that sleeps on the queue's fd and its progress descriptor too (an endpoint's
// shape: progress_fd() and request_notify_watching(); on TCP the connections' sockets,
// whose engines then leave them to it; on verbs -1 and a plain arming): one event loop
// thread, mixed sizes from 8 B to 64 KiB on 4 connections. On TCP the engines' stand-down
// check is set to its longest (1 s), so that it cannot rescue a wake-up the arming lost:
// every sleep is bounded by 900 ms there (10 s on verbs, whose completion channel needs no
// rescue and whose emulated devices are slow), and one that runs out fails the test.
// Then the poller arms
// and stays away: one-sided requests on its connections are served all the same (by that
// check); then it sleeps again, and a message wakes it.
TEST_P(shared_cq, a_poller_that_sleeps_on_the_sockets_too_misses_nothing)
{
    if (iwarp())
        GTEST_SKIP() << no_rnr_window;
    constexpr int nconn = 4, window = 8, per_conn = 120;
    constexpr std::size_t slot = 64 << 10;
    constexpr std::size_t sizes[] = {8, 100, 1000, 16384, 65536, 40};
    auto size_of = [&](int m) { return sizes[std::size_t(m) % std::size(sizes)]; };
    auto q = server_dom_->create_completion_queue({.depth = 512});
    auto& qb = dynamic_cast<detail::completion_queue_base&>(*q);
    std::vector<pair> ps;
    std::vector<std::vector<std::byte>> rbuf(nconn, std::vector<std::byte>(slot * window));
    std::vector<std::unique_ptr<memory_region>> rmr;
    for (int i = 0; i < nconn; ++i) {
        connection_options sopts = small(window);
        sopts.send_cq = sopts.recv_cq = q;
        sopts.context = i;
        sopts.tcp.takeover_check = 1s;
        ps.push_back(connect_with(small(window), sopts));
        rmr.push_back(
            server_dom_->register_memory(rbuf[i].data(), rbuf[i].size(),
                                         access::local_write | access::remote_write | access::remote_read));
        for (int k = 0; k < window; ++k) {
            sge rs{rmr[i].get(), std::uint64_t(k) * slot, slot};
            ASSERT_FALSE(ps[i].server->post_recv({&rs, 1}, k));
        }
    }

    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    ASSERT_GE(ep, 0);
    auto add = [&](int fd) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        return ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0;
    };
    ASSERT_TRUE(add(q->fd()));
    if (tcp_engine(b_)) {
        ASSERT_GE(qb.progress_fd(), 0) << "a TCP queue has a progress descriptor";
    }
    if (qb.progress_fd() >= 0) {
        ASSERT_TRUE(add(qb.progress_fd()));
    }
    // Sleeps until something comes (on TCP 900 ms at most, less than the stand-down check:
    // false then).
    const int bound_ms = tcp_engine(b_) ? 900 : 10000;
    auto sleep_once = [&] {
        epoll_event evs[2];
        int n = ::epoll_wait(ep, evs, 2, bound_ms);
        for (int j = 0; j < n; ++j)
            if (evs[j].data.fd == q->fd())
                (void)q->ack_notify();
        return n > 0;
    };

    std::vector<int> got(nconn, 0);
    std::atomic<int> total{0}, sleeps{0};
    std::atomic<bool> ok{true};
    std::string why;
    // One batch per wake-up, as an event loop serves: poll, arm, look once more, sleep.
    // (Polling until empty first would give the queue's pending list idle visits that
    // send what it holds back; this shape needs the arming to do that.)
    std::thread server([&] {
        completion c[16];
        auto take = [&](std::size_t n) {
            for (std::size_t j = 0; j < n && ok; ++j) {
                const int i = static_cast<int>(c[j].context), m = got[i], k = m % window;
                const std::byte* at = rbuf[i].data() + std::size_t(k) * slot;
                if (c[j].status || c[j].opcode != opcode::recv || c[j].wr_id != std::uint64_t(k) ||
                    c[j].byte_len != size_of(m) ||
                    wrong_bytes({at, size_of(m)}, std::uint64_t(i) << 16 | m)) {
                    why = "connection " + std::to_string(i) + " message " + std::to_string(m) +
                          ": failed, out of order or other bytes";
                    ok = false;
                    return;
                }
                ++got[i];
                sge rs{rmr[i].get(), std::uint64_t(k) * slot, slot};
                if (m + window < per_conn && ps[i].server->post_recv({&rs, 1}, k)) {
                    why = "post_recv failed";
                    ok = false;
                }
                ++total;
            }
        };
        while (ok && total < nconn * per_conn) {
            take(q->poll(c));
            (void)qb.request_notify_watching();
            const std::size_t n = q->poll(c); // what came before the arming raises no event
            take(n);
            if (n == 0 && ok && total < nconn * per_conn) {
                ++sleeps;
                if (!sleep_once()) {
                    why = "no wake-up in " + std::to_string(bound_ms) + " ms with " + std::to_string(total) +
                          " messages in";
                    ok = false;
                }
            }
        }
    });
    // The client: bursts of a window on each connection in turn, each message's bytes a
    // pattern of its connection and number.
    std::vector<std::byte> msg(slot * window * nconn);
    auto mmr = client_dom_->register_memory(msg.data(), msg.size(), access::local_write);
    std::vector<int> sent(nconn, 0), done(nconn, 0);
    auto deadline = std::chrono::steady_clock::now() + 60s;
    bool all = false;
    while (!all && ok && std::chrono::steady_clock::now() < deadline) {
        all = true;
        for (int i = 0; i < nconn; ++i) {
            completion c[window];
            for (std::size_t n = ps[i].client->poll(c), j = 0; j < n; ++j)
                if (!c[j].status)
                    ++done[i];
            while (sent[i] < per_conn && sent[i] - done[i] < window) {
                const int m = sent[i];
                std::size_t off = (std::size_t(i) * window + std::size_t(m % window)) * slot;
                fill_pattern({msg.data() + off, size_of(m)}, std::uint64_t(i) << 16 | m);
                sge ss{mmr.get(), off, size_of(m)};
                if (ps[i].client->post_send({&ss, 1}, m))
                    break;
                ++sent[i];
            }
            all = all && done[i] == per_conn;
        }
        if (!all)
            std::this_thread::sleep_for(200us); // bursts, and time for the poller to sleep
    }
    server.join();
    ASSERT_TRUE(ok) << why;
    ASSERT_EQ(total, nconn * per_conn);
    EXPECT_GT(sleeps, 0) << "the poller never slept: the test proved nothing about wake-ups";

    // Armed, and away: nobody polls or sleeps on the queue while connection 0's client
    // writes into the server's memory and reads it back.
    ASSERT_EQ(q->poll({}), 0u);
    (void)qb.request_notify_watching();
    std::vector<std::byte> wsrc = pattern(32 << 10, 9), back(32 << 10);
    auto wmr = client_dom_->register_memory(wsrc.data(), wsrc.size(), access::local_write);
    auto bmr = client_dom_->register_memory(back.data(), back.size(), access::local_write);
    remote_buffer rb = rmr[0]->remote();
    sge w{wmr.get(), 0, wsrc.size()}, rd{bmr.get(), 0, back.size()};
    for (int r = 0; r < 3; ++r) {
        ASSERT_FALSE(ps[0].client->post_write({&w, 1}, *rb.slice(0, wsrc.size()), 1));
        ASSERT_FALSE(ps[0].client->post_read({&rd, 1}, *rb.slice(0, back.size()), 2));
        ASSERT_EQ(expect_ok(*ps[0].client, 2, 10s).size(), 2u) << "round " << r << ": not served";
        ASSERT_EQ(std::memcmp(back.data(), wsrc.data(), back.size()), 0) << "round " << r;
    }

    // Back: it sleeps, and a message wakes it.
    completion c[4];
    EXPECT_EQ(q->poll(c), 0u) << "the one-sided requests put nothing on the target's queue";
    (void)qb.request_notify_watching();
    ASSERT_EQ(q->poll(c), 0u);
    std::thread late([&] {
        std::this_thread::sleep_for(20ms);
        fill_pattern({msg.data(), 8}, 77);
        sge ss{mmr.get(), 0, 8};
        (void)ps[1].client->post_send({&ss, 1}, 7);
    });
    sge rs{rmr[1].get(), 0, slot};
    ASSERT_FALSE(ps[1].server->post_recv({&rs, 1}, 99));
    std::size_t n = 0;
    for (int tries = 0; n == 0 && tries < 3; ++tries) {
        EXPECT_TRUE(sleep_once()) << "no wake-up in " << bound_ms << " ms for the late message";
        n = q->poll(c);
        if (n == 0)
            (void)qb.request_notify_watching(); // woken by data not yet a whole message
    }
    late.join();
    ASSERT_EQ(n, 1u);
    EXPECT_EQ(c[0].wr_id, 99u);
    EXPECT_EQ(wrong_bytes({rbuf[1].data(), 8}, 77), 0u);
    ::close(ep);
}

// Fairness among 64 connections on one shared queue (issue 27): one client thread keeps a
// window of sends on each, round robin; the server thread polls the queue and reposts each
// receive as it completes. None starves: halfway through, every connection has had a
// good part of its share, and at the end each has all of its messages, in order.
TEST_P(shared_cq, sixty_four_connections_on_one_queue_all_progress)
{
    if (iwarp())
        GTEST_SKIP() << no_rnr_window;
    constexpr int nconn = 64, window = 8;
    const int per_conn = b_ == backend::verbs ? 24 : 64;
    auto q = server_dom_->create_completion_queue({.depth = 2048});
    std::vector<pair> ps;
    std::vector<std::vector<std::byte>> rbuf(nconn, std::vector<std::byte>(64 * window));
    std::vector<std::unique_ptr<memory_region>> rmr;
    for (int i = 0; i < nconn; ++i) {
        connection_options sopts = small(window);
        sopts.send_cq = sopts.recv_cq = q;
        sopts.context = i;
        ps.push_back(connect_with(small(window), sopts));
        rmr.push_back(server_dom_->register_memory(rbuf[i].data(), rbuf[i].size(), access::local_write));
        for (int k = 0; k < window; ++k) {
            sge rs{rmr[i].get(), std::uint64_t(k) * 64, 64};
            ASSERT_FALSE(ps[i].server->post_recv({&rs, 1}, k));
        }
    }
    std::vector<std::byte> msg(std::size_t(64) * window * nconn); // window slots per connection
    auto mmr = client_dom_->register_memory(msg.data(), msg.size(), access::local_write);

    std::vector<int> got(nconn, 0), at_half;
    std::atomic<int> total{0};
    std::atomic<bool> order_ok{true};
    std::thread server([&] {
        completion c[16];
        auto deadline = std::chrono::steady_clock::now() + 60s;
        while (order_ok && total < nconn * per_conn && std::chrono::steady_clock::now() < deadline) {
            std::size_t n = q->poll(c);
            for (std::size_t j = 0; j < n; ++j) {
                // Message m of connection i lands in slot m % window; the receive that
                // slot gets next is for message m + window.
                const int i = static_cast<int>(c[j].context), m = got[i], k = m % window;
                if (c[j].status || i < 0 || i >= nconn || c[j].wr_id != std::uint64_t(k) ||
                    std::to_integer<int>(rbuf[i][std::size_t(k) * 64]) != m % 251) {
                    order_ok = false;
                    break;
                }
                ++got[i];
                sge rs{rmr[i].get(), std::uint64_t(k) * 64, 64};
                if (m + window < per_conn && ps[i].server->post_recv({&rs, 1}, k))
                    order_ok = false;
                if (++total == nconn * per_conn / 2)
                    at_half = got;
            }
        }
    });
    // The client: round robin over the connections, a send wherever the window has room.
    std::vector<int> sent(nconn, 0), done(nconn, 0);
    auto deadline = std::chrono::steady_clock::now() + 60s;
    bool all = false;
    while (!all && order_ok && std::chrono::steady_clock::now() < deadline) {
        all = true;
        for (int i = 0; i < nconn; ++i) {
            completion c[window];
            for (std::size_t n = ps[i].client->poll(c), j = 0; j < n; ++j)
                if (!c[j].status)
                    ++done[i];
            if (sent[i] < per_conn && sent[i] - done[i] < window) {
                // Each message's first byte says its number; its slot is free again once
                // the send a window earlier completed.
                std::size_t slot = (std::size_t(i) * window + std::size_t(sent[i] % window)) * 64;
                msg[slot] = std::byte(static_cast<unsigned char>(sent[i] % 251));
                sge ss{mmr.get(), slot, 64};
                if (!ps[i].client->post_send({&ss, 1}, sent[i]))
                    ++sent[i];
            }
            all = all && done[i] == per_conn;
        }
    }
    server.join();
    EXPECT_TRUE(order_ok) << "a receive failed, or came out of order or with other bytes";
    ASSERT_EQ(total, nconn * per_conn);
    ASSERT_EQ(at_half.size(), std::size_t(nconn));
    const int floor = per_conn / 5; // the average halfway is per_conn / 2
    for (int i = 0; i < nconn; ++i) {
        EXPECT_EQ(got[i], per_conn) << "connection " << i;
        EXPECT_GE(at_half[i], floor) << "connection " << i << " starved: " << at_half[i]
                                     << " messages when the others had half of theirs";
    }
}

// A stream of small messages, a full window on each of 4 connections, into one shared
// queue that the server busy-polls and reposts from. On TCP the poller reads the sockets
// itself, a run at a time; frames that a run left in the engine's staging buffer must not
// wait for the socket to become readable again (they waited until the senders gave up:
// transport_retry_exceeded at the end of rdmx_perf -q 8 --shared-cq).
TEST_P(shared_cq, a_stream_of_small_messages_into_a_polled_queue_arrives_whole)
{
    if (iwarp())
        GTEST_SKIP() << no_rnr_window;
    constexpr int nconn = 4, window = 128;
    const int per_conn = b_ == backend::verbs ? 2000 : 40000;
    auto q = server_dom_->create_completion_queue({.depth = 4096});
    std::vector<pair> ps;
    // One buffer per connection: each is written under its connection's engine alone.
    std::vector<std::byte> rbuf(64 * nconn);
    auto rmr = server_dom_->register_memory(rbuf.data(), rbuf.size(), access::local_write);
    for (int i = 0; i < nconn; ++i) {
        connection_options sopts = small(window), copts = small(window);
        sopts.send_cq = sopts.recv_cq = q;
        sopts.context = i;
        copts.max_inline = 64;
        ps.push_back(connect_with(copts, sopts));
        for (int k = 0; k < window; ++k) {
            sge rs{rmr.get(), std::uint64_t(i) * 64, 64};
            ASSERT_FALSE(ps[i].server->post_recv({&rs, 1}, k));
        }
    }
    std::atomic<int> total{0};
    std::atomic<bool> failed{false};
    std::thread server([&] {
        std::vector<int> got(nconn, 0);
        completion c[64];
        auto deadline = std::chrono::steady_clock::now() + 120s;
        while (!failed && total < nconn * per_conn && std::chrono::steady_clock::now() < deadline) {
            std::size_t n = q->poll(c);
            for (std::size_t j = 0; j < n; ++j) {
                const int i = static_cast<int>(c[j].context);
                if (c[j].status || i < 0 || i >= nconn) {
                    failed = true;
                    break;
                }
                sge rs{rmr.get(), std::uint64_t(i) * 64, 64};
                if (++got[i] + window <= per_conn && ps[i].server->post_recv({&rs, 1}, 0))
                    failed = true;
                ++total;
            }
        }
    });
    std::vector<std::byte> msg = pattern(64, 9);
    auto mmr = client_dom_->register_memory(msg.data(), msg.size(), access::local_write);
    std::vector<int> sent(nconn, 0), acked(nconn, 0);
    std::error_code first_error;
    auto deadline = std::chrono::steady_clock::now() + 120s;
    bool all = false;
    while (!all && !failed && !first_error && std::chrono::steady_clock::now() < deadline) {
        all = true;
        for (int i = 0; i < nconn; ++i) {
            completion c[32];
            for (std::size_t n = ps[i].client->poll(c), j = 0; j < n; ++j) {
                if (c[j].status && !first_error)
                    first_error = c[j].status;
                acked[i] = static_cast<int>(c[j].wr_id) + 1; // and every send before it
            }
            while (sent[i] < per_conn && sent[i] - acked[i] < window) {
                // Signalled every 16th and the last: a completion covers the ones before it.
                const bool signaled = sent[i] % 16 == 15 || sent[i] + 1 == per_conn;
                sge ss{mmr.get(), 0, 64};
                work_request wr{.opcode = opcode::send,
                                .wr_id = std::uint64_t(sent[i]),
                                .local = {&ss, 1},
                                .flags = signaled ? send_flags::inline_data | send_flags::signaled
                                                  : send_flags::inline_data};
                if (ps[i].client->post({&wr, 1}))
                    break;
                ++sent[i];
            }
            all = all && acked[i] == per_conn;
        }
    }
    server.join();
    EXPECT_FALSE(first_error) << first_error.message();
    EXPECT_FALSE(failed) << "a receive failed, or a repost was refused";
    EXPECT_EQ(total, nconn * per_conn) << "messages whose sends completed never arrived";
}

INSTANTIATE_TEST_SUITE_P(backends, shared_cq, testing::ValuesIn(selected_backends()), param_name);

} // namespace
} // namespace rdmx::test
