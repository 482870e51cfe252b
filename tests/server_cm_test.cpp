// Connection management for servers (issue 17, item 3), on every backend: a listener's fd
// and an event queue in one poll() set, connections started and accepted without a
// blocked thread, their events in order with exactly one terminal event each, the
// failures of a start as error events, and receives posted before the peer may send.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <map>
#include <vector>

#include "common/child_process.hpp"
#include "common/test_util.hpp"

namespace rdmx::test
{
namespace
{

class server_cm : public pair_fixture
{
protected:
    /// Waits (poll) on the listener's fd and the queues' fds; calls on_request for each
    /// request taken with get_request(0ms) and on_event for each event, until done() or
    /// `timeout`. Nothing else blocks.
    template <class OnRequest, class OnEvent, class Done>
    void serve(std::vector<event_queue*> queues, OnRequest on_request, OnEvent on_event, Done done,
               std::chrono::milliseconds timeout = 20s)
    {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!done() && std::chrono::steady_clock::now() < deadline) {
            std::vector<pollfd> fds;
            if (listener_)
                fds.push_back({listener_->fd(), POLLIN, 0});
            for (auto* q : queues)
                fds.push_back({q->fd(), POLLIN, 0});
            ASSERT_GE(::poll(fds.data(), fds.size(), 100), 0);
            if (listener_)
                while (auto req = listener_->get_request(0ms))
                    on_request(std::move(req));
            for (auto* q : queues) {
                event evs[16];
                while (std::size_t n = q->poll(evs))
                    for (std::size_t i = 0; i < n; ++i)
                        on_event(evs[i]);
            }
        }
    }

    /// Accepts the request of `child` (a disconnect_peer) into `s` with `opts`, then lets
    /// the peer go on and waits until it has its side: only now may it end (a disconnect
    /// racing the accept would fail it).
    void accept_peer(child_process& child, const connection_options& opts, std::unique_ptr<connection>& s)
    {
        auto req = listener_->get_request(10s);
        ASSERT_NE(req, nullptr);
        s = req->accept(opts);
        char one = 1;
        ASSERT_TRUE(child.write(&one, 1));
        ASSERT_TRUE(child.read_exact(&one, 1, 10s)) << "the peer did not get there";
    }
};

TEST_P(server_cm, listener_fd_and_event_queues_serve_eight_started_clients_from_one_thread)
{
    constexpr int n = 8;
    auto server_q = event_queue::create();
    auto client_q = event_queue::create();
    ASSERT_GE(listener_->fd(), 0);

    std::vector<std::unique_ptr<connection>> clients, servers;
    for (int i = 0; i < n; ++i) {
        connection_options o;
        o.events = client_q;
        o.context = static_cast<std::uint64_t>(i);
        std::string pd = "client " + std::to_string(i);
        clients.push_back(client_dom_->start_connect(server_address(), o, as_bytes(pd)));
        EXPECT_EQ(clients.back()->state(), connection_state::connecting);
        // Still connecting: nothing can be sent yet.
        EXPECT_EQ(clients.back()->post({}, nullptr), errc::not_connected);
    }
    // Every event per context, in arrival order.
    std::map<std::uint64_t, std::vector<event>> seen;
    auto established = [&] {
        std::size_t k = 0;
        for (auto& [ctx, evs] : seen)
            k += std::count_if(evs.begin(), evs.end(),
                               [](const event& e) { return e.type == event_type::established; });
        return k;
    };
    serve(
        {server_q.get(), client_q.get()},
        [&](std::unique_ptr<connection_request> req) {
            connection_options o;
            o.events = server_q;
            o.context = 100 + servers.size();
            auto pd = unpadded(req->private_data());
            EXPECT_EQ(pd.rfind("client ", 0), 0u) << pd;
            servers.push_back(req->start_accept(o, as_bytes("server")));
        },
        [&](const event& e) { seen[e.context].push_back(e); }, [&] { return established() == 2 * n; });
    ASSERT_EQ(servers.size(), static_cast<std::size_t>(n));
    ASSERT_EQ(established(), static_cast<std::size_t>(2 * n));
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(seen[i].size(), 1u);
        EXPECT_EQ(seen[i][0].conn, clients[i].get());
        EXPECT_EQ(clients[i]->state(), connection_state::established);
        EXPECT_EQ(unpadded(clients[i]->peer_private_data()), "server");
        auto& s = seen[100 + static_cast<std::uint64_t>(i)];
        ASSERT_EQ(s.size(), 1u);
        EXPECT_EQ(s[0].conn, servers[i].get());
        EXPECT_EQ(servers[i]->state(), connection_state::established);
    }

    // Each client disconnects: its own event says this side did, the server's says the peer.
    for (auto& c : clients)
        c->disconnect();
    auto terminal = [&] {
        std::size_t k = 0;
        for (auto& [ctx, evs] : seen)
            k += std::count_if(evs.begin(), evs.end(), [](const event& e) {
                return e.type == event_type::disconnected || e.type == event_type::error;
            });
        return k;
    };
    serve(
        {server_q.get(), client_q.get()}, [](auto) { ADD_FAILURE() << "unexpected request"; },
        [&](const event& e) { seen[e.context].push_back(e); }, [&] { return terminal() == 2 * n; });
    // Nothing more comes: exactly one terminal event each.
    serve(
        {server_q.get(), client_q.get()}, [](auto) {}, [&](const event& e) { seen[e.context].push_back(e); },
        [] { return false; }, 300ms);
    for (auto& [ctx, evs] : seen) {
        ASSERT_EQ(evs.size(), 2u) << "context " << ctx;
        EXPECT_EQ(evs[0].type, event_type::established);
        EXPECT_EQ(evs[1].type, event_type::disconnected)
            << "context " << ctx << ": " << evs[1].cause.message();
        EXPECT_EQ(evs[1].cause, errc::disconnected);
        EXPECT_EQ(evs[1].by_peer, ctx >= 100) << "context " << ctx;
    }
    // Destroying a connection removes its unpolled events: none names a dead object.
    clients.clear();
    servers.clear();
    event evs[4];
    EXPECT_EQ(server_q->poll(evs) + client_q->poll(evs), 0u);
}

TEST_P(server_cm, started_connect_to_a_closed_port_ends_in_an_error_event)
{
    auto port = port_;
    listener_.reset();
    auto q = event_queue::create();
    connection_options o;
    o.events = q;
    o.context = 7;
    o.timeout = 3s;
    auto c = client_dom_->start_connect(address(b_, port), o);
    event ev;
    ASSERT_EQ(q->wait({&ev, 1}, 10s), 1u) << "no event";
    EXPECT_EQ(ev.type, event_type::error);
    EXPECT_EQ(ev.context, 7u);
    EXPECT_EQ(ev.conn, c.get());
    EXPECT_EQ(ev.cause, errc::connection_refused) << ev.cause.message();
    EXPECT_EQ(c->state(), connection_state::error);
    EXPECT_EQ(q->wait({&ev, 1}, 300ms), 0u) << "a second terminal event: " << to_string(ev.type);
}

TEST_P(server_cm, started_connect_that_is_rejected_carries_the_private_data)
{
    auto q = event_queue::create();
    connection_options o;
    o.events = q;
    auto c = client_dom_->start_connect(server_address(), o, as_bytes("let me in"));
    std::vector<event> evs;
    serve(
        {q.get()},
        [&](std::unique_ptr<connection_request> req) {
            EXPECT_EQ(unpadded(req->private_data()), "let me in");
            req->reject(as_bytes("go away"));
        },
        [&](const event& e) { evs.push_back(e); }, [&] { return !evs.empty(); });
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(evs[0].type, event_type::error);
    EXPECT_EQ(evs[0].cause, errc::rejected) << evs[0].cause.message();
    EXPECT_EQ(c->state(), connection_state::error);
    EXPECT_EQ(unpadded(c->peer_private_data()), "go away");
}

TEST_P(server_cm, started_connect_nobody_answers_times_out_with_an_event)
{
    // The listener never takes the request.
    auto q = event_queue::create();
    connection_options o;
    o.events = q;
    o.timeout = 500ms;
    auto t0 = std::chrono::steady_clock::now();
    auto c = client_dom_->start_connect(server_address(), o);
    event ev;
    ASSERT_EQ(q->wait({&ev, 1}, 10s), 1u) << "no event";
    EXPECT_EQ(ev.type, event_type::error);
    EXPECT_EQ(ev.cause, errc::timed_out) << ev.cause.message();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    EXPECT_EQ(c->state(), connection_state::error);
    // Destroying it does not wait for the provider to give up as well (iWARP: the kernel
    // holds the QP until siw's MPA timer, 10 s, ends the attempt; the domain's reaper
    // destroys it then).
    auto t1 = std::chrono::steady_clock::now();
    c.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t1, 5s);
}

TEST_P(server_cm, unanswered_connection_on_shared_queues_outlives_its_domain_handle)
{
    auto cq = client_dom_->create_completion_queue({.depth = 1024});
    auto q = event_queue::create();
    connection_options o;
    o.events = q;
    o.timeout = 500ms;
    o.send_cq = o.recv_cq = cq;
    o.srq = client_dom_->create_shared_receive_queue({.depth = 64, .max_sge = 1, .events = {}, .context = 0});
    auto c = client_dom_->start_connect(server_address(), o);
    event ev;
    ASSERT_EQ(q->wait({&ev, 1}, 10s), 1u) << "no event";
    EXPECT_EQ(ev.cause, errc::timed_out) << ev.cause.message();
    // The application lets go of the domain and the queues first; the connection holds
    // them. Destroying it then returns at once, and (iWARP) the reaper destroys its QP, the
    // queues and the domain on its own thread once the provider's attempt ended, which the
    // listener's end brings about (siw closes the stream).
    client_dom_.reset();
    cq.reset();
    o = {};
    // The domain's end shows as its thread's (the verbs event loop, the TCP engine): the
    // listener's end, which closes descriptors too, ends no thread.
    const std::size_t threads_with = live_threads();
    auto t1 = std::chrono::steady_clock::now();
    c.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t1, 5s);
    listener_.reset();
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (live_threads() >= threads_with && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
    EXPECT_LT(live_threads(), threads_with) << "the domain was never destroyed";
}

TEST_P(server_cm, connect_nobody_answers_throws_and_the_domain_goes_on)
{
    // The listener never takes the request: connect() ends with its own timeout, not the
    // provider's, and the domain connects elsewhere meanwhile.
    connection_options o;
    o.timeout = 500ms;
    auto t0 = std::chrono::steady_clock::now();
    try {
        client_dom_->connect(server_address(), o);
        ADD_FAILURE() << "connected to a listener that never took the request";
    } catch (const error& e) {
        EXPECT_EQ(e.code(), errc::timed_out) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    // The first listener stays, with the request nobody took (destroying it would end
    // the provider's attempt at once: siw closes the stream); the next connection goes to
    // another.
    auto unanswering = std::move(listener_);
    listener_ = server_dom_->listen(address(b_, 0));
    port_ = listener_->port();
    {
        auto p = connect_pair();
        std::vector<std::byte> out(64, std::byte{5}), in(64);
        auto out_mr = client_dom_->register_memory(out.data(), out.size(), access::local_write);
        auto in_mr = server_dom_->register_memory(in.data(), in.size(), access::local_write);
        sge og{out_mr.get(), 0, out.size()}, ig{in_mr.get(), 0, in.size()};
        ASSERT_FALSE(p.server->post_recv({&ig, 1}, 1));
        ASSERT_FALSE(p.client->post_send({&og, 1}, 2));
        expect_ok(*p.client, 1);
        auto got = expect_ok(*p.server, 1);
        ASSERT_EQ(got.size(), 1u);
        EXPECT_EQ(got[0].byte_len, out.size());
        EXPECT_EQ(in, out);
    }
    // Closing the domain leaves nothing of the failed connection behind: its handle waits
    // for what the reaper still destroys (iWARP: until siw's MPA timer ends the attempt),
    // so the descriptors are back when it returns.
    const std::size_t fds_with = open_fds();
    client_dom_.reset();
    EXPECT_LT(open_fds(), fds_with);
}

TEST_P(server_cm, initial_recvs_take_the_first_message_without_receiver_not_ready)
{
    // No RNR retries: a first message that found no receive would fail the sender.
    connection_options o;
    o.rnr_retry_count = 0;
    constexpr std::size_t len = 4096;
    std::vector<std::byte> srv_buf(len), cli_buf(len), src(len);
    for (std::size_t i = 0; i < len; ++i)
        src[i] = static_cast<std::byte>((i * 7 + 3) & 0xff);
    auto srv_mr = server_dom_->register_memory(srv_buf.data(), len, access::local_write);
    auto cli_mr = client_dom_->register_memory(cli_buf.data(), len, access::local_write);
    auto src_c = client_dom_->register_memory(src.data(), len, access::local_write);
    auto src_s = server_dom_->register_memory(src.data(), len, access::local_write);
    sge srv_sge{srv_mr.get(), 0, len}, cli_sge{cli_mr.get(), 0, len};
    recv_request srv_rr{.wr_id = 11, .local = {&srv_sge, 1}};
    recv_request cli_rr{.wr_id = 22, .local = {&cli_sge, 1}};

    // iWARP: the acceptor may send only once it received from the connector (RFC 5044
    // 7.1.2; siw fails the connect at the connector when the acceptor's first message
    // comes before the MPA reply was processed: docs/failure-semantics.md, "iWARP").
    const bool iwarp = server_dom_->limits().iwarp;
    std::vector<completion> sc;
    auto accepted = std::async(std::launch::async, [&] {
        auto req = listener_->get_request(10s);
        if (!req)
            throw std::runtime_error("no request");
        auto s = req->accept(o, {}, {&srv_rr, 1});
        if (iwarp)
            sc = expect_ok(*s, 1); // the client's message, taken by the initial receive
        // The server sends at once too (iWARP: once the client's message came): the
        // client's initial receive takes it.
        sge out{src_s.get(), 0, len};
        EXPECT_FALSE(s->post_send({&out, 1}, 2));
        return s;
    });
    auto c = client_dom_->connect(server_address(), o, {}, {&cli_rr, 1});
    sge out{src_c.get(), 0, len};
    ASSERT_FALSE(c->post_send({&out, 1}, 1)); // right after connect returned
    auto s = accepted.get();
    for (auto& x : expect_ok(*s, iwarp ? 1 : 2)) // the send and the receive, either order
        sc.push_back(x);
    auto cc = expect_ok(*c, 2);
    for (auto& x : sc) {
        if (x.opcode == opcode::recv) {
            EXPECT_EQ(x.wr_id, 11u);
        }
    }
    for (auto& x : cc) {
        if (x.opcode == opcode::recv) {
            EXPECT_EQ(x.wr_id, 22u);
        }
    }
    EXPECT_EQ(srv_buf, src);
    EXPECT_EQ(cli_buf, src);
    EXPECT_EQ(c->state(), connection_state::established);
    EXPECT_EQ(s->state(), connection_state::established);
}

TEST_P(server_cm, started_accept_and_connect_take_initial_recvs_too)
{
    connection_options o;
    o.rnr_retry_count = 0;
    auto q = event_queue::create();
    o.events = q;
    constexpr std::size_t len = 512;
    std::vector<std::byte> srv_buf(len), src(len);
    for (std::size_t i = 0; i < len; ++i)
        src[i] = static_cast<std::byte>((i * 13 + 1) & 0xff);
    auto srv_mr = server_dom_->register_memory(srv_buf.data(), len, access::local_write);
    auto src_c = client_dom_->register_memory(src.data(), len, access::local_write);
    std::unique_ptr<connection> s;
    std::unique_ptr<connection> c;
    {
        // The caller's arrays end here: the connection keeps what it needs.
        sge srv_sge{srv_mr.get(), 0, len};
        recv_request srv_rr{.wr_id = 5, .local = {&srv_sge, 1}};
        c = client_dom_->start_connect(server_address(), o);
        std::size_t up = 0;
        serve(
            {q.get()},
            [&](std::unique_ptr<connection_request> req) {
                s = req->start_accept(o, {}, {&srv_rr, 1});
            },
            [&](const event& e) {
                EXPECT_EQ(e.type, event_type::established) << e.cause.message();
                // The client sends the moment it hears it is up.
                if (e.conn == c.get()) {
                    sge out{src_c.get(), 0, len};
                    EXPECT_FALSE(c->post_send({&out, 1}, 1));
                }
                ++up;
            },
            [&] { return up == 2; });
        ASSERT_EQ(up, 2u);
    }
    auto sc = expect_ok(*s, 1);
    ASSERT_EQ(sc.size(), 1u);
    EXPECT_EQ(sc[0].wr_id, 5u);
    EXPECT_EQ(sc[0].byte_len, len);
    EXPECT_EQ(srv_buf, src);
    expect_ok(*c, 1);
}

// A peer that disconnects (or destroys its connection) ends cleanly; one whose process
// dies is lost, on every backend: TCP by its GOODBYE frame, verbs by the goodbye write to
// our flag (docs/wire-format.md). The peer is a process of its own, exec'd, so that it
// shares no RDMA state with this one. Several rounds: the goodbye must arrive before the
// peer's disconnect every time (on iWARP its completion only says it went to TCP).
TEST_P(server_cm, a_clean_disconnect_and_a_dead_peer_process_are_told_apart)
{
    const std::string peer = sibling_program("disconnect_peer");
    ASSERT_EQ(::access(peer.c_str(), X_OK), 0) << peer << ": " << std::strerror(errno);
    const std::string addr = server_address();
    for (int round = 0; round < 3; ++round) {
        for (const char* how : {"disconnect", "destroy", "exit", "sigkill"}) {
            SCOPED_TRACE(std::string(how) + ", round " + std::to_string(round));
            const bool clean = std::strcmp(how, "disconnect") == 0 || std::strcmp(how, "destroy") == 0;
            child_process child(peer, {addr, how});
            auto q = event_queue::create();
            connection_options o;
            o.events = q;
            std::unique_ptr<connection> s;
            ASSERT_NO_FATAL_FAILURE(accept_peer(child, o, s));
            if (std::strcmp(how, "sigkill") == 0)
                child.kill();
            child.wait();
            event ev;
            ASSERT_EQ(q->wait({&ev, 1}, 10s), 1u) << "no event";
            EXPECT_EQ(ev.conn, s.get());
            if (clean) {
                EXPECT_EQ(ev.type, event_type::disconnected) << ev.cause.message();
                EXPECT_EQ(ev.cause, errc::disconnected) << ev.cause.message();
                EXPECT_TRUE(ev.by_peer);
                EXPECT_EQ(s->state(), connection_state::disconnected);
                EXPECT_EQ(s->last_error(), errc::disconnected) << s->last_error().message();
            } else {
                EXPECT_EQ(ev.type, event_type::error);
                EXPECT_EQ(ev.cause, errc::peer_lost) << ev.cause.message();
                EXPECT_EQ(s->state(), connection_state::error);
                EXPECT_EQ(s->last_error(), errc::peer_lost) << s->last_error().message();
            }
            EXPECT_EQ(q->wait({&ev, 1}, 200ms), 0u) << "a second terminal event";
        }
    }
}

// A peer whose process hangs without dying (stopped): its kernel keeps the connection up,
// so nothing but rdmx's own dead-peer rule can end it. A request to it fails within that
// bound (ack_timeout x (retry_count + 1), at least 1 s), and the connection goes to error.
TEST_P(server_cm, a_request_to_a_stopped_peer_process_fails_within_the_dead_peer_bound)
{
    if (b_ == backend::verbs)
        GTEST_SKIP() << "verbs: the RC transport (the NIC, rxe in the kernel) answers for a "
                        "stopped process; its RNR retries, not rdmx, bound the request";
    const std::string peer = sibling_program("disconnect_peer");
    ASSERT_EQ(::access(peer.c_str(), X_OK), 0) << peer << ": " << std::strerror(errno);
    child_process child(peer, {server_address(), "sigkill"});
    connection_options o;
    o.ack_timeout = 100ms;
    o.retry_count = 1;
    std::unique_ptr<connection> s;
    ASSERT_NO_FATAL_FAILURE(accept_peer(child, o, s));
    ASSERT_TRUE(child.signal(SIGSTOP));
    std::vector<std::byte> buf(1024, std::byte{7});
    auto mr = server_dom_->register_memory(buf.data(), buf.size(), access::local_write);
    const auto start = std::chrono::steady_clock::now();
    sge g{mr.get(), 0, buf.size()};
    ASSERT_FALSE(s->post_send({&g, 1}, 1));
    auto sc = poll_n(*s, 1, 10s);
    const auto took = std::chrono::steady_clock::now() - start;
    ASSERT_EQ(sc.size(), 1u) << "the request to the stopped peer never completed";
    EXPECT_EQ(sc[0].status, errc::transport_retry_exceeded) << sc[0].status.message();
    EXPECT_EQ(s->state(), connection_state::error);
    EXPECT_GE(took, 900ms) << "failed before the bound: the peer was only stopped";
    EXPECT_LT(took, 5s) << "the dead-peer rule took far longer than its bound";
    ASSERT_TRUE(child.signal(SIGCONT));
}

INSTANTIATE_TEST_SUITE_P(backends, server_cm, testing::ValuesIn(selected_backends()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(server_cm);

} // namespace
} // namespace rdmx::test
