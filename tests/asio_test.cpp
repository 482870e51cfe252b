// rdmx/asio.hpp on every backend: a coroutine server on one io_context thread serving
// several coroutine clients (sends with replies, writes and reads, every byte checked), the
// completion-token form with callbacks, cancellation and the io_context's end while a wait
// is pending, and timeouts.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <rdmx/asio.hpp>

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <optional>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "common/test_data.hpp"
#include "common/test_util.hpp"
#include "lib/event_queue.hpp"

namespace rdmx::test
{
namespace
{

namespace net = boost::asio;
using rdmx::asio::async_poll;

bool fd_open(int fd)
{
    return ::fcntl(fd, F_GETFD) != -1;
}

// --- The protocol of the server test -----------------------------------------------------
// Every message is a header and, for echo, its payload. The server tells the client it may
// send (hello) once its receives are posted; each request gets one answer.
enum class op : std::uint32_t { hello, region, echo, write, read, bye, done };
struct header {
    op kind = op::hello;
    std::uint32_t seed = 0, len = 0, offset = 0;
    std::uint32_t bad = 0; ///< done: the bytes the server found wrong
    remote_buffer::bytes region{};
};

constexpr std::size_t echo_slots = 4;
constexpr std::size_t slot_size = 8192; // a header and an echo payload
constexpr std::size_t max_echo = slot_size - sizeof(header);
constexpr std::size_t data_size = 64 * 1024;            // written and read one-sided
constexpr std::size_t send_at = echo_slots * slot_size; // the send slot
constexpr std::size_t data_at = send_at + slot_size;    // the one-sided area
constexpr std::size_t side_size = data_at + data_size;
constexpr std::uint64_t send_id = 100, write_id = 200, read_id = 300;

/// One side's registered memory: receive slots, a send slot, the one-sided area.
struct side_memory {
    std::vector<std::byte> bytes = std::vector<std::byte>(side_size);
    std::unique_ptr<memory_region> mr;
    explicit side_memory(domain& d)
        : mr(d.register_memory(bytes.data(), bytes.size(),
                               access::local_write | access::remote_write | access::remote_read))
    {
    }
    std::byte* at(std::size_t off) { return bytes.data() + off; }
    header head_at(std::size_t off)
    {
        header h;
        std::memcpy(&h, at(off), sizeof h);
        return h;
    }
};

/// The completions of one connection, taken in any order: what a coroutine that does one
/// thing at a time needs when completions of several kinds arrive together. Waits through
/// a completion_watch (the token form, with use_awaitable) when given an executor,
/// otherwise through the free awaitable async_poll.
class inbox
{
public:
    static constexpr std::uint64_t any_recv = ~0ull;

    explicit inbox(connection& c) : c_(c) {}
    inbox(connection& c, const net::any_io_executor& ex) : c_(c) { watch_.emplace(ex, c); }

    /// The next completion with `wr_id` (any_recv: of any receive slot); it must be a success.
    net::awaitable<completion> take(std::uint64_t wr_id)
    {
        for (;;) {
            for (auto it = got_.begin(); it != got_.end(); ++it) {
                if (wr_id == any_recv ? it->wr_id < echo_slots : it->wr_id == wr_id) {
                    completion x = *it;
                    got_.erase(it);
                    EXPECT_FALSE(x.status) << "wr_id " << x.wr_id << ": " << x.status.message();
                    co_return x;
                }
            }
            completion buf[8];
            std::size_t n =
                watch_ ? co_await watch_->async_poll(buf, net::use_awaitable) : co_await async_poll(c_, buf);
            EXPECT_GT(n, 0u);
            got_.insert(got_.end(), buf, buf + n);
        }
    }

private:
    connection& c_;
    std::optional<rdmx::asio::completion_watch> watch_;
    std::deque<completion> got_;
};

/// Posts `h` (and `payload` bytes already in the send slot after it) and waits for its completion.
net::awaitable<void> send(connection& c, side_memory& m, inbox& in, header h, std::size_t payload = 0)
{
    std::memcpy(m.at(send_at), &h, sizeof h);
    sge s{m.mr.get(), send_at, sizeof h + payload};
    auto ec = c.post_send({&s, 1}, send_id);
    EXPECT_FALSE(ec) << ec.message();
    co_await in.take(send_id);
}

void post_slot(connection& c, side_memory& m, std::uint64_t slot)
{
    sge s{m.mr.get(), slot * slot_size, slot_size};
    auto ec = c.post_recv({&s, 1}, slot);
    EXPECT_FALSE(ec) << ec.message();
}

/// The next message: its completion and header (the slot is still to be posted again).
net::awaitable<std::pair<completion, header>> receive(side_memory& m, inbox& in)
{
    completion x = co_await in.take(inbox::any_recv);
    header h = m.head_at(x.wr_id * slot_size);
    EXPECT_GE(x.byte_len, sizeof h);
    co_return std::pair{x, h};
}

/// Fails the test with what a coroutine threw.
void report(std::exception_ptr e)
{
    if (!e)
        return;
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        ADD_FAILURE() << "coroutine threw: " << x.what();
    }
}

/// One server session: a coroutine on the server's io_context thread, the data-path thread
/// of its connection, waiting through a completion_watch (token form, use_awaitable).
// g++ 12 takes the frame's operator delete (Boost 1.74's recycling allocator) for one that
// does not match its operator new in a coroutine with a parameter of a class type, such as
// the unique_ptr: a false -Wmismatched-new-delete.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
net::awaitable<void> serve(std::unique_ptr<connection> c, side_memory& m, std::atomic<int>& served)
{
    inbox in(*c, co_await net::this_coro::executor);
    for (std::uint64_t i = 0; i < echo_slots; ++i)
        post_slot(*c, m, i);
    co_await send(*c, m, in, {.kind = op::hello}); // our receives are posted: the client may send
    std::optional<remote_buffer> peer;
    for (;;) {
        auto [x, h] = co_await receive(m, in);
        std::byte* payload = m.at(x.wr_id * slot_size + sizeof h);
        header answer{.kind = op::done, .seed = h.seed, .len = h.len};
        std::size_t answer_payload = 0;
        switch (h.kind) {
        case op::region:
            peer = remote_buffer::parse(h.region);
            if (!peer) {
                ADD_FAILURE() << "the client's region does not parse";
                co_return;
            }
            break;
        case op::echo:
            EXPECT_EQ(x.byte_len, sizeof h + h.len);
            xor_copy(m.at(send_at + sizeof h), payload, h.len, std::byte{0xa5});
            answer.kind = op::echo;
            answer_payload = h.len;
            break;
        case op::write: {
            fill_pattern({m.at(data_at), h.len}, h.seed);
            sge s{m.mr.get(), data_at, h.len};
            auto ec = c->post_write({&s, 1}, *peer->slice(h.offset, h.len), write_id);
            EXPECT_FALSE(ec) << ec.message();
            co_await in.take(write_id); // the answer's send reaches the client after the data
            break;
        }
        case op::read: {
            std::memset(m.at(data_at), 0, h.len);
            sge s{m.mr.get(), data_at, h.len};
            auto ec = c->post_read({&s, 1}, *peer->slice(h.offset, h.len), read_id);
            EXPECT_FALSE(ec) << ec.message();
            co_await in.take(read_id);
            answer.bad = static_cast<std::uint32_t>(wrong_bytes({m.at(data_at), h.len}, h.seed));
            break;
        }
        case op::bye: break;
        default: ADD_FAILURE() << "unexpected message " << static_cast<int>(h.kind); co_return;
        }
        post_slot(*c, m, x.wr_id);
        co_await send(*c, m, in, answer, answer_payload);
        if (h.kind == op::bye) {
            ++served;
            co_return;
        }
    }
}
#pragma GCC diagnostic pop

/// One client: echoes, one-sided writes by the server into its memory and reads by the
/// server from it, every byte checked; waits through the free awaitable async_poll.
net::awaitable<void> client(connection& c, side_memory& m, std::uint32_t id, int rounds,
                            std::atomic<int>& done)
{
    inbox in(c); // the receive slots are posted already (before the server's hello could come)
    auto [hx, hello] = co_await receive(m, in);
    EXPECT_EQ(hello.kind, op::hello);
    post_slot(c, m, hx.wr_id);

    header r{.kind = op::region, .region = m.mr->remote(data_at, data_size).serialize()};
    co_await send(c, m, in, r);
    auto [rx, rd] = co_await receive(m, in);
    EXPECT_EQ(rd.kind, op::done);
    post_slot(c, m, rx.wr_id);

    const std::uint32_t echo_len[] = {1, 100, 4000, static_cast<std::uint32_t>(max_echo)};
    const std::uint32_t rma_len[] = {1, 1000, 16 * 1024, static_cast<std::uint32_t>(data_size)};
    for (int round = 0; round < rounds; ++round) {
        std::uint32_t seed = id * 1000 + static_cast<std::uint32_t>(round) * 3;
        // A send and its reply: the server answers each byte xor 0xa5.
        std::uint32_t len = echo_len[round % 4];
        fill_pattern({m.at(send_at + sizeof(header)), len}, seed);
        co_await send(c, m, in, {.kind = op::echo, .seed = seed, .len = len}, len);
        auto [ex, eh] = co_await receive(m, in);
        EXPECT_EQ(eh.kind, op::echo);
        EXPECT_EQ(eh.len, len);
        EXPECT_EQ(ex.byte_len, sizeof(header) + len);
        const std::byte* got = m.at(ex.wr_id * slot_size + sizeof(header));
        std::size_t bad = wrong_bytes({got, len}, seed, 0, std::byte{0xa5});
        EXPECT_EQ(bad, 0u) << "client " << id << " round " << round << ": echo of " << len << " bytes";
        post_slot(c, m, ex.wr_id);

        // The server writes into our memory, then answers.
        len = rma_len[round % 4];
        std::uint32_t offset = static_cast<std::uint32_t>((round * 4096) % (data_size - len + 1));
        std::memset(m.at(data_at + offset), 0, len);
        co_await send(c, m, in, {.kind = op::write, .seed = seed + 1, .len = len, .offset = offset});
        auto [wx, wh] = co_await receive(m, in);
        EXPECT_EQ(wh.kind, op::done);
        EXPECT_EQ(wrong_bytes({m.at(data_at + offset), len}, seed + 1), 0u)
            << "client " << id << " round " << round << ": write of " << len << " bytes at " << offset;
        post_slot(c, m, wx.wr_id);

        // The server reads our memory and says how many bytes it found wrong.
        fill_pattern({m.at(data_at + offset), len}, seed + 2);
        co_await send(c, m, in, {.kind = op::read, .seed = seed + 2, .len = len, .offset = offset});
        auto [qx, qh] = co_await receive(m, in);
        EXPECT_EQ(qh.kind, op::done);
        EXPECT_EQ(qh.bad, 0u) << "client " << id << " round " << round << ": read of " << len << " bytes";
        post_slot(c, m, qx.wr_id);
    }
    co_await send(c, m, in, {.kind = op::bye});
    auto [bx, bh] = co_await receive(m, in);
    EXPECT_EQ(bh.kind, op::done);
    ++done;
}

class asio_test : public pair_fixture
{
protected:
    /// Sends `len` pattern bytes (seed) from `from` to a receive posted at the other side.
    static void send_pattern(connection& from, side_memory& m, std::uint32_t len, std::uint32_t seed)
    {
        fill_pattern({m.at(send_at), len}, seed);
        sge s{m.mr.get(), send_at, len};
        auto ec = from.post_send({&s, 1}, send_id);
        ASSERT_FALSE(ec) << ec.message();
    }
    /// Expects `x` to be the receive of send_pattern(len, seed) into slot 0 of `m`.
    static void expect_pattern(const completion& x, side_memory& m, std::uint32_t len, std::uint32_t seed)
    {
        EXPECT_FALSE(x.status) << x.status.message();
        EXPECT_EQ(x.opcode, opcode::recv);
        EXPECT_EQ(x.wr_id, 0u);
        EXPECT_EQ(x.byte_len, len);
        EXPECT_EQ(wrong_bytes({m.at(0), len}, seed), 0u);
    }
};

TEST_P(asio_test, coroutine_server_on_one_thread_serves_clients)
{
    constexpr int clients = 4, rounds = 8;
    std::vector<std::unique_ptr<side_memory>> server_mem, client_mem;
    for (int i = 0; i < clients; ++i) {
        server_mem.push_back(std::make_unique<side_memory>(*server_dom_));
        client_mem.push_back(std::make_unique<side_memory>(*client_dom_));
    }
    std::vector<std::unique_ptr<connection>> conns; // the clients', outliving their io_context
    std::atomic<int> served{0}, done{0};
    {
        net::io_context server_io;
        auto work = net::make_work_guard(server_io);
        // The server's one thread: every session's coroutine runs on it.
        std::thread server_thread([&] { server_io.run_for(60s); });
        // A message that finds no receive breaks an iWARP connection (RNR is fatal there),
        // so each client posts its receives before the server may send its hello: the
        // acceptor hands a connection to the server only once its client has.
        // Here accepting blocks a thread of its own, which hands each connection to the
        // io_context (listener_requests_through_the_io_context shows the io_context form).
        std::vector<std::promise<void>> client_ready(clients);
        std::vector<std::future<void>> client_ready_seen;
        for (auto& r : client_ready)
            client_ready_seen.push_back(r.get_future());
        std::thread acceptor([&] {
            for (int i = 0; i < clients; ++i) {
                auto req = listener_->get_request(20s);
                if (!req) {
                    ADD_FAILURE() << "no connection request within 20 s";
                    return;
                }
                auto c = req->accept();
                client_ready_seen[i].wait();
                net::post(server_io, [&, i, c = std::move(c)]() mutable {
                    net::co_spawn(server_io, serve(std::move(c), *server_mem[i], served), report);
                });
            }
        });
        for (int i = 0; i < clients; ++i) {
            conns.push_back(client_dom_->connect(server_address()));
            for (std::uint64_t s = 0; s < echo_slots; ++s)
                post_slot(*conns[i], *client_mem[i], s);
            client_ready[i].set_value();
        }
        acceptor.join();
        work.reset(); // the server's run ends with its last session

        net::io_context client_io; // the clients' one thread: this one
        for (int i = 0; i < clients; ++i)
            net::co_spawn(client_io,
                          client(*conns[i], *client_mem[i], static_cast<std::uint32_t>(i), rounds, done),
                          report);
        client_io.run_for(60s);
        server_thread.join();
    }
    EXPECT_EQ(done.load(), clients);
    EXPECT_EQ(served.load(), clients);
}

TEST_P(asio_test, completion_token_form_with_callbacks)
{
    // Ping-pong between the two ends of one connection, both on one io_context, each side a
    // chain of callbacks through its completion_watch: the server answers each byte xor 0xa5.
    auto p = connect_pair();
    side_memory cm(*client_dom_), sm(*server_dom_);
    constexpr int messages = 20;
    const std::uint32_t lens[] = {1, 64, 1000, 4096, 8000};
    post_slot(*p.server, sm, 0);
    post_slot(*p.client, cm, 0);

    net::io_context io;
    rdmx::asio::completion_watch cw(io, *p.client), sw(io, *p.server);
    completion cbuf[4], sbuf[4];
    int echoed = 0, checked = 0;
    std::function<void(boost::system::error_code, std::size_t)> on_server, on_client;
    auto ping = [&](int k) {
        std::uint32_t len = lens[k % 5];
        fill_pattern({cm.at(send_at), len}, static_cast<std::uint32_t>(k));
        sge s{cm.mr.get(), send_at, len};
        EXPECT_FALSE(p.client->post_send({&s, 1}, send_id));
    };
    on_server = [&](boost::system::error_code ec, std::size_t n) {
        ASSERT_FALSE(ec) << ec.message();
        ASSERT_GT(n, 0u);
        for (std::size_t i = 0; i < n; ++i) {
            const completion& x = sbuf[i];
            EXPECT_FALSE(x.status) << x.status.message();
            if (x.opcode != opcode::recv)
                continue;
            xor_copy(sm.at(send_at), sm.at(0), x.byte_len, std::byte{0xa5});
            post_slot(*p.server, sm, 0);
            sge s{sm.mr.get(), send_at, x.byte_len};
            EXPECT_FALSE(p.server->post_send({&s, 1}, send_id));
            ++echoed;
        }
        if (echoed < messages)
            sw.async_poll(sbuf, on_server);
    };
    on_client = [&](boost::system::error_code ec, std::size_t n) {
        ASSERT_FALSE(ec) << ec.message();
        ASSERT_GT(n, 0u);
        for (std::size_t i = 0; i < n; ++i) {
            const completion& x = cbuf[i];
            EXPECT_FALSE(x.status) << x.status.message();
            if (x.opcode != opcode::recv)
                continue;
            std::uint32_t len = lens[checked % 5];
            EXPECT_EQ(x.byte_len, len);
            std::size_t bad = wrong_bytes({cm.at(0), len}, checked, 0, std::byte{0xa5});
            EXPECT_EQ(bad, 0u) << "message " << checked;
            post_slot(*p.client, cm, 0);
            if (++checked < messages)
                ping(checked);
        }
        if (checked < messages)
            cw.async_poll(cbuf, on_client);
    };
    bool inline_call = true;
    sw.async_poll(sbuf, [&](boost::system::error_code ec, std::size_t n) {
        EXPECT_FALSE(inline_call) << "a handler ran inside async_poll";
        on_server(ec, n);
    });
    cw.async_poll(cbuf, on_client);
    inline_call = false;
    ping(0);
    io.run_for(60s);
    EXPECT_EQ(echoed, messages);
    EXPECT_EQ(checked, messages);
}

TEST_P(asio_test, cancel_and_destroying_the_watch_end_a_pending_wait)
{
    auto p = connect_pair();
    side_memory cm(*client_dom_), sm(*server_dom_);
    post_slot(*p.server, sm, 0);
    const int fd = p.server->completion_fd();
    net::io_context io;
    completion buf[4];
    {
        rdmx::asio::completion_watch w(io, *p.server);
        boost::system::error_code got;
        std::size_t n = 99;
        w.async_poll(buf, [&](boost::system::error_code ec, std::size_t k) {
            got = ec;
            n = k;
        });
        net::steady_timer t(io, 50ms);
        t.async_wait([&](boost::system::error_code) { w.cancel(); });
        io.run_for(10s);
        EXPECT_EQ(got, net::error::operation_aborted);
        EXPECT_EQ(n, 0u);
        EXPECT_TRUE(fd_open(fd));

        // The watch still waits after a cancel: the peer's message completes the next one.
        send_pattern(*p.client, cm, 333, 7);
        n = 0;
        got = net::error::fault;
        w.async_poll(buf, [&](boost::system::error_code ec, std::size_t k) {
            got = ec;
            n = k;
        });
        io.restart();
        io.run_for(10s);
        EXPECT_FALSE(got) << got.message();
        ASSERT_EQ(n, 1u);
        expect_pattern(buf[0], sm, 333, 7);
    }
    // Destroying a watch with a wait pending ends that wait; the descriptor stays rdmx's.
    post_slot(*p.server, sm, 0);
    boost::system::error_code got;
    bool called = false;
    {
        rdmx::asio::completion_watch w(io, *p.server);
        w.async_poll(buf, [&](boost::system::error_code ec, std::size_t) {
            called = true;
            got = ec;
        });
        io.restart();
        io.poll(); // the wait is queued with the reactor now
    }
    io.restart();
    io.run_for(10s);
    EXPECT_TRUE(called);
    EXPECT_EQ(got, net::error::operation_aborted);
    EXPECT_TRUE(fd_open(fd));
    // And the connection waits as before, blocking or through a new watch.
    send_pattern(*p.client, cm, 1000, 8);
    ASSERT_EQ(p.server->wait(buf, 10s), 1u);
    expect_pattern(buf[0], sm, 1000, 8);
}

TEST_P(asio_test, io_context_destroyed_with_waits_pending_leaks_nothing)
{
    auto p = connect_pair();
    side_memory cm(*client_dom_), sm(*server_dom_);
    post_slot(*p.server, sm, 0);
    auto events = event_queue::create();
    const int fd = p.server->completion_fd();
    const std::size_t fds_before = open_fds();
    std::atomic<int> suspended{0}, resumed{0}, frames_gone{0};
    struct on_exit {
        std::atomic<int>& gone;
        ~on_exit() { ++gone; }
    };
    {
        net::io_context io;
        net::co_spawn(
            io,
            [&]() -> net::awaitable<void> {
                on_exit guard{frames_gone};
                completion buf[4];
                ++suspended;
                co_await async_poll(*p.server, buf);
                ++resumed;
            },
            report);
        net::co_spawn(
            io,
            [&]() -> net::awaitable<void> {
                on_exit guard{frames_gone};
                event ev[4];
                ++suspended;
                co_await async_poll(*events, ev);
                ++resumed;
            },
            report);
        std::thread runner([&] { io.run(); });
        for (int i = 0; i < 1000 && suspended < 2; ++i)
            std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(50ms); // into the reactor's wait
        io.stop();
        runner.join();
        EXPECT_EQ(frames_gone.load(), 0);
    }
    EXPECT_EQ(suspended.load(), 2);
    EXPECT_EQ(resumed.load(), 0);
    EXPECT_EQ(frames_gone.load(), 2) << "the suspended coroutines went with their io_context";
    EXPECT_TRUE(fd_open(fd));
    EXPECT_TRUE(fd_open(events->fd()));
    EXPECT_EQ(open_fds(), fds_before) << "a descriptor leaked, or one of rdmx's was closed";

    // The connection works on: a new io_context waits for it again.
    net::io_context io;
    std::size_t n = 0;
    completion buf[4];
    net::co_spawn(
        io, [&]() -> net::awaitable<void> { n = co_await async_poll(*p.server, buf); }, report);
    send_pattern(*p.client, cm, 2000, 9);
    io.run_for(10s);
    ASSERT_EQ(n, 1u);
    expect_pattern(buf[0], sm, 2000, 9);
}

TEST_P(asio_test, timeouts)
{
    auto p = connect_pair();
    side_memory cm(*client_dom_), sm(*server_dom_);
    post_slot(*p.server, sm, 0);
    auto events = event_queue::create();
    net::io_context io;
    bool finished = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            using clock = std::chrono::steady_clock;
            completion buf[4];
            // Nothing comes: the awaitable with a timeout returns 0 once it expired.
            auto t0 = clock::now();
            EXPECT_EQ(co_await async_poll(*p.server, buf, 100ms), 0u);
            EXPECT_GE(clock::now() - t0, 100ms);
            EXPECT_LT(clock::now() - t0, 5s);
            event ev[2];
            t0 = clock::now();
            EXPECT_EQ(co_await async_poll(*events, ev, 50ms), 0u);
            EXPECT_GE(clock::now() - t0, 50ms);

            // The token form: a timer that cancels the watch.
            {
                rdmx::asio::completion_watch w(co_await net::this_coro::executor, *p.server);
                net::steady_timer timer(w.get_executor(), 50ms);
                timer.async_wait([&w](boost::system::error_code ec) {
                    if (!ec)
                        w.cancel();
                });
                boost::system::error_code ec;
                auto n = co_await w.async_poll(buf, net::redirect_error(net::use_awaitable, ec));
                EXPECT_EQ(ec, net::error::operation_aborted);
                EXPECT_EQ(n, 0u);
            }

            // Something comes before the timeout: it is returned at once.
            send_pattern(*p.client, cm, 4096, 10);
            t0 = clock::now();
            auto n = co_await async_poll(*p.server, buf, 10s);
            EXPECT_LT(clock::now() - t0, 9s);
            EXPECT_EQ(n, 1u);
            if (n == 1)
                expect_pattern(buf[0], sm, 4096, 10);
            finished = true;
        },
        report);
    io.run_for(60s);
    EXPECT_TRUE(finished);
}

TEST_P(asio_test, listener_requests_through_the_io_context)
{
    ASSERT_GE(listener_->fd(), 0) << "a listener without a descriptor";
    constexpr int n = 3;
    net::io_context io; // the server's one thread: this one
    std::vector<std::string> pdata;
    std::vector<std::unique_ptr<connection>> accepted, clients(n);
    // Nothing pending: the awaitable with a timeout returns nullptr.
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            EXPECT_EQ(co_await rdmx::asio::async_get_request(*listener_, 50ms), nullptr);
        },
        report);
    io.run_for(10s);

    std::thread connector([&] {
        for (int k = 0; k < n; ++k)
            clients[k] = client_dom_->connect(server_address(), {}, as_bytes("client " + std::to_string(k)));
    });
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            for (int k = 0; k < n - 1; ++k) {
                auto req = co_await rdmx::asio::async_get_request(*listener_, 20s);
                if (!req) {
                    ADD_FAILURE() << "no request within 20 s";
                    co_return;
                }
                pdata.push_back(unpadded(req->private_data()));
                accepted.push_back(req->accept());
            }
            // The token form, with a watch that stays registered.
            rdmx::asio::listener_watch w(co_await net::this_coro::executor, *listener_);
            auto req = co_await w.async_get_request(net::use_awaitable);
            pdata.push_back(unpadded(req->private_data()));
            accepted.push_back(req->accept());
        },
        report);
    io.restart();
    io.run_for(60s);
    connector.join();
    EXPECT_EQ(pdata, (std::vector<std::string>{"client 0", "client 1", "client 2"}));
    ASSERT_EQ(accepted.size(), std::size_t{n});
    for (int k = 0; k < n; ++k) {
        EXPECT_EQ(accepted[k]->state(), connection_state::established);
        ASSERT_TRUE(clients[k]);
        EXPECT_EQ(clients[k]->state(), connection_state::established);
    }
}

TEST_P(asio_test, shared_completion_queue_through_the_io_context)
{
    std::shared_ptr<completion_queue> cq;
    try {
        cq = server_dom_->create_completion_queue({});
    } catch (const rdmx::error& e) {
        if (e.code() == errc::not_supported)
            FAIL() << "no shared completion queues: " << e.what();
        throw;
    }
    constexpr int n = 3;
    std::vector<std::unique_ptr<side_memory>> smem, cmem;
    std::vector<std::unique_ptr<connection>> servers, clients;
    for (int i = 0; i < n; ++i) {
        smem.push_back(std::make_unique<side_memory>(*server_dom_));
        cmem.push_back(std::make_unique<side_memory>(*client_dom_));
        connection_options o;
        o.send_cq = cq;
        o.recv_cq = cq;
        o.context = 100 + static_cast<std::uint64_t>(i);
        auto accepted = std::async(std::launch::async, [&] {
            auto req = listener_->get_request(10s);
            if (!req)
                throw std::runtime_error("no connection request within 10 s");
            return req->accept(o);
        });
        clients.push_back(client_dom_->connect(server_address()));
        servers.push_back(accepted.get());
        post_slot(*servers[i], *smem[i], 0);
    }
    auto len = [](int i) { return static_cast<std::uint32_t>(500 + 1000 * i); };
    for (int i = 0; i < n; ++i)
        send_pattern(*clients[i], *cmem[i], len(i), 20 + static_cast<std::uint32_t>(i));

    net::io_context io;
    int received = 0;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            completion out[8];
            while (received < n) {
                auto got = co_await async_poll(*cq, out, 10s);
                if (got == 0) {
                    ADD_FAILURE() << "no completion within 10 s";
                    co_return;
                }
                for (const completion& x : std::span(out, got)) {
                    if (x.context < 100 || x.context >= 100 + n) {
                        ADD_FAILURE() << "completion of an unknown connection, context " << x.context;
                        co_return;
                    }
                    int i = static_cast<int>(x.context - 100);
                    EXPECT_EQ(x.conn, servers[i].get());
                    expect_pattern(x, *smem[i], len(i), 20 + static_cast<std::uint32_t>(i));
                    ++received;
                }
            }
        },
        report);
    io.run_for(60s);
    EXPECT_EQ(received, n);
}

TEST_P(asio_test, accept_and_connection_events_without_a_blocked_thread)
{
    // The server's one thread takes the request, accepts without waiting (its receive posted
    // before the client may send), and learns from its event queue that the connection is
    // up and, later, that the client disconnected.
    ASSERT_GE(listener_->fd(), 0) << "a listener without a descriptor";
    auto events = event_queue::create();
    side_memory cm(*client_dom_), sm(*server_dom_);
    std::unique_ptr<connection> client, server;
    std::atomic<bool> disconnect_now{false}, not_built{false};
    bool finished = false;
    net::io_context io;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            auto req = co_await rdmx::asio::async_get_request(*listener_, 20s);
            if (!req) {
                ADD_FAILURE() << "no request within 20 s";
                co_return;
            }
            connection_options o;
            o.events = events;
            o.context = 7;
            sge slot{sm.mr.get(), 0, slot_size};
            recv_request first{.wr_id = 0, .local = {&slot, 1}};
            try {
                server = req->start_accept(o, {}, {&first, 1});
            } catch (const rdmx::error& e) {
                if (e.code() != errc::not_supported)
                    throw;
                not_built = true;
                co_return;
            }
            event ev[4];
            auto n = co_await async_poll(*events, ev, 20s);
            if (n != 1) {
                ADD_FAILURE() << "no established event within 20 s";
                co_return;
            }
            EXPECT_EQ(ev[0].type, event_type::established);
            EXPECT_EQ(ev[0].conn, server.get());
            EXPECT_EQ(ev[0].context, 7u);
            completion buf[4];
            n = co_await async_poll(*server, buf, 20s); // the client sends once connected
            if (n != 1) {
                ADD_FAILURE() << "no message within 20 s";
                co_return;
            }
            expect_pattern(buf[0], sm, 3000, 30);
            disconnect_now = true;
            n = co_await async_poll(*events, ev, 20s);
            if (n != 1) {
                ADD_FAILURE() << "no disconnected event within 20 s";
                co_return;
            }
            EXPECT_EQ(ev[0].type, event_type::disconnected);
            EXPECT_TRUE(ev[0].by_peer);
            EXPECT_EQ(ev[0].conn, server.get());
            finished = true;
        },
        report);
    std::thread client_thread([&] {
        try {
            client = client_dom_->connect(server_address());
            send_pattern(*client, cm, 3000, 30);
            while (!disconnect_now)
                std::this_thread::sleep_for(1ms);
            client->disconnect();
        } catch (const std::exception& e) {
            if (!not_built)
                ADD_FAILURE() << "client: " << e.what();
        }
    });
    io.run_for(60s);
    disconnect_now = true; // lets the client thread go in any case
    client_thread.join();
    EXPECT_FALSE(not_built && !server) << "start_accept is not supported";
    EXPECT_TRUE(finished);
}

// The events of an event_queue through an io_context. The backends' events (connection
// established, disconnected, ...) come from the connection management; here they are
// pushed as a backend pushes them.
TEST(asio_events, watch_and_awaitable_take_queued_events)
{
    auto q = event_queue::create();
    auto& impl = rdmx::detail::impl(*q);
    net::io_context io;
    std::vector<std::uint64_t> seen;
    {
        rdmx::asio::event_watch w(io, *q);
        event out[2];
        std::function<void(boost::system::error_code, std::size_t)> on_events =
            [&](boost::system::error_code ec, std::size_t n) {
                ASSERT_FALSE(ec) << ec.message();
                ASSERT_GT(n, 0u);
                for (std::size_t i = 0; i < n; ++i)
                    seen.push_back(out[i].context);
                if (seen.size() < 5)
                    w.async_poll(out, on_events);
            };
        w.async_poll(out, on_events);
        // Pushed from another thread, as the backends do, some while the wait sleeps.
        std::thread pusher([&] {
            for (std::uint64_t k = 0; k < 5; ++k) {
                event ev;
                ev.type = event_type::disconnected;
                ev.context = k;
                impl.push(ev);
                if (k % 2 == 0)
                    std::this_thread::sleep_for(20ms);
            }
        });
        io.run_for(10s);
        pusher.join();
    }
    EXPECT_EQ(seen, (std::vector<std::uint64_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(q->poll(std::span<event>()), 0u);

    // The awaitable: three queued, taken two and one, then a timeout.
    for (std::uint64_t k = 10; k < 13; ++k) {
        event ev;
        ev.context = k;
        impl.push(ev);
    }
    std::vector<std::uint64_t> got;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            event ev[2];
            for (int i = 0; i < 2; ++i) {
                auto n = co_await async_poll(*q, ev);
                for (std::size_t j = 0; j < n; ++j)
                    got.push_back(ev[j].context);
            }
            EXPECT_EQ(co_await async_poll(*q, ev, 20ms), 0u);
        },
        report);
    io.restart();
    io.run_for(10s);
    EXPECT_EQ(got, (std::vector<std::uint64_t>{10, 11, 12}));
}

INSTANTIATE_TEST_SUITE_P(backends, asio_test, testing::ValuesIn(selected_backends()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(asio_test);

} // namespace
} // namespace rdmx::test
