// Connection management under churn: connection ids created, connected, answered and
// destroyed while their events are in flight, and domains destroyed right afterwards.
// Before the rdma_cm channels were non-blocking, an event that rdma_destroy_id discarded
// between the event loop's poll() and its rdma_get_cm_event() left the loop thread asleep
// in the kernel, and destroying the domain then waited for it forever (issue 15, item 3).
// Part of the conformance binary, so that it runs on every backend and provider.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <optional>
#include <thread>

#include <rdmx/config.hpp>

#include "common/test_util.hpp"
#if RDMX_HAVE_RDMA
#include <arpa/inet.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>

#include <sys/wait.h>
#include <unistd.h>

#include "cm/connect_call.hpp"
#include "cm/event_loop.hpp"
#include "cm/private_data.hpp"
#endif

namespace rdmx::test
{
namespace
{

class cm_churn : public testing::TestWithParam<backend>
{
protected:
    void SetUp() override
    {
        if (GetParam() == backend::verbs && host_for(GetParam()).empty())
            GTEST_SKIP() << "verbs run needs RDMX_TEST_RDMA_ADDR (an IP on an RDMA device)";
    }
};

// Runs `f`, and aborts the whole binary with a message when it has not returned within
// `limit`: a thread that hangs in the kernel cannot be cancelled, and a suite that waits
// for it would hang too. Exceptions from `f` are rethrown here.
template <class F> void bounded(const char* what, std::chrono::seconds limit, F f)
{
    std::promise<void> done;
    auto fut = done.get_future();
    std::thread t([&] {
        try {
            f();
            done.set_value();
        } catch (...) {
            done.set_exception(std::current_exception());
        }
    });
    if (fut.wait_for(limit) != std::future_status::ready) {
        std::fprintf(stderr, "cm_churn: %s did not return within %lld s: hung\n", what,
                     static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::abort();
    }
    t.join();
    fut.get();
}

// What each client of a round is told by the server, by its index (in its private data).
enum class verdict { accept, reject, drop, unanswered };
constexpr verdict plan[] = {verdict::accept, verdict::accept,     verdict::reject,
                            verdict::drop,   verdict::unanswered, verdict::unanswered};
constexpr int clients = static_cast<int>(std::size(plan));

TEST_P(cm_churn, ids_destroyed_while_their_events_are_in_flight)
{
    const backend b = GetParam();
    connection_options opts;
    opts.timeout = 2s; // unanswered clients give up after this
    // Bounded in rounds and in time: enough rounds that a small window is hit now and
    // then, never more than about 20 s on a slow guest.
    const auto stop = std::chrono::steady_clock::now() + 20s;
    int rounds = 0, established = 0;
    for (; rounds < 12 && std::chrono::steady_clock::now() < stop; ++rounds) {
        std::unique_ptr<domain> server_dom, client_dom;
        bounded("domain::open", 30s, [&] {
            server_dom = domain::open(address(b, 0));
            client_dom = domain::open(address(b, 0));
        });
        auto lst = server_dom->listen(address(b, 0));
        const std::string target = address(b, lst->port());

        // Clients connect all at once; each keeps what it got.
        std::vector<std::unique_ptr<connection>> conns(clients);
        std::vector<std::optional<errc>> failed(clients);
        std::vector<std::thread> threads;
        for (int i = 0; i < clients; ++i)
            threads.emplace_back([&, i] {
                std::string pdata = "client " + std::to_string(i);
                try {
                    conns[i] = client_dom->connect(target, opts, as_bytes(pdata));
                } catch (const rdmx::error& e) {
                    // (an OS errno counts as some failure)
                    failed[i] = e.code().category() == rdmx::category() ? static_cast<errc>(e.code().value())
                                                                        : errc::completion_error;
                }
            });

        // The server answers by plan; unanswered requests stay alive past the listener.
        std::vector<std::unique_ptr<connection>> accepted;
        std::vector<std::unique_ptr<connection_request>> kept;
        int answered = 0;
        const auto answer_until = std::chrono::steady_clock::now() + 5s;
        while (answered < 4 && std::chrono::steady_clock::now() < answer_until) {
            auto req = lst->get_request(100ms);
            if (!req)
                continue;
            std::string who = as_string(req->private_data());
            int i = who.rfind("client ", 0) == 0 ? std::atoi(who.c_str() + 7) : -1;
            if (i < 0 || i >= clients) {
                ADD_FAILURE() << "request with private data '" << who << "'";
                continue;
            }
            switch (plan[i]) {
            case verdict::accept:
                accepted.push_back(req->accept(opts));
                ++answered;
                break;
            case verdict::reject:
                req->reject(as_bytes("no"));
                ++answered;
                break;
            case verdict::drop:
                req.reset();
                ++answered;
                break; // the destructor rejects
            case verdict::unanswered: kept.push_back(std::move(req)); break;
            }
        }
        // Requests may still be queued in the listener: destroy it with them.
        lst.reset();
        kept.clear();

        bounded("client connects", 3 * opts.timeout.count() * 1s + 10s, [&] {
            for (auto& t : threads)
                t.join();
        });
        for (int i = 0; i < clients; ++i) {
            if (plan[i] == verdict::accept) {
                EXPECT_NE(conns[i], nullptr) << "client " << i << " (accepted) failed";
            } else {
                EXPECT_EQ(conns[i], nullptr) << "client " << i << " connected without an accept";
                EXPECT_TRUE(failed[i].has_value());
            }
            if (plan[i] == verdict::reject || plan[i] == verdict::drop) {
                EXPECT_EQ(failed[i].value_or(errc{}), errc::rejected) << "client " << i;
            }
        }
        // Tear down while the DISCONNECTED events race their ids' destruction: the server
        // side disconnects, and the clients are destroyed at that very moment.
        for (auto& c : accepted)
            c->disconnect();
        for (auto& c : conns)
            if (c)
                ++established;
        bounded("destroying connections and domains", 30s, [&] {
            conns.clear();
            accepted.clear();
            client_dom.reset();
            server_dom.reset();
        });
    }
    EXPECT_GE(rounds, 2);
    EXPECT_EQ(established, rounds * 2);
}

#if RDMX_HAVE_RDMA
// The race of issue 15, item 3, made certain: the loop's poll() finds its channel readable,
// then (held there by the test hook) the only queued event goes with rdma_destroy_id, and
// only then does the loop read. A blocking channel would leave the loop thread asleep in
// rdma_get_cm_event(), and ~event_loop would wait for it forever.
std::mutex hook_mutex;
std::condition_variable hook_changed;
bool hook_polled = false, hook_release = false;

void hold_after_poll()
{
    std::unique_lock lock(hook_mutex);
    hook_polled = true;
    hook_changed.notify_all();
    hook_changed.wait_for(lock, 10s, [] { return hook_release; });
}

// Connections to a closed port, each destroyed a little later than the one before: some
// while their flow runs (verbs: resolving, or on iWARP while rdma_connect runs on its own
// thread and fails), some after the refusal was reported. Nothing of a destroyed one may
// run afterwards (a failing rdma_connect's report reached a destroyed connection once, when
// the destructor raced the step that started the call), and the domain closes.
TEST_P(cm_churn, connects_to_a_closed_port_destroyed_at_every_moment_of_their_flow)
{
    const backend b = GetParam();
    std::unique_ptr<domain> dom;
    bounded("domain::open", 30s, [&] { dom = domain::open(address(b, 0)); });
    std::uint16_t port;
    {
        auto lst = dom->listen(address(b, 0));
        port = lst->port();
    } // closed: connects are refused
    auto q = event_queue::create();
    connection_options o;
    o.events = q;
    o.timeout = 5s;
    int ended = 0, connecting = 0;
    const auto stop = std::chrono::steady_clock::now() + 20s;
    for (int i = 0; i < 240 && std::chrono::steady_clock::now() < stop; ++i) {
        auto c = dom->start_connect(address(b, port), o);
        std::this_thread::sleep_for(std::chrono::microseconds((i % 60) * 100)); // 0 to 6 ms
        if (c->state() == connection_state::connecting) {
            ++connecting;
        } else {
            ++ended;
            EXPECT_EQ(c->state(), connection_state::error);
            EXPECT_EQ(c->last_error(), errc::connection_refused) << c->last_error().message();
        }
        c.reset();
        event evs[8];
        while (q->poll(evs) != 0) {
        }
    }
    std::printf("[ cm_churn ] %s: %d destroyed while connecting, %d after the refusal\n", to_string(b),
                connecting, ended);
    EXPECT_GT(ended, 0) << "none was refused in 6 ms";
    bounded("closing the domain", 30s, [&] { dom.reset(); });
}

// The rdma_cm event loop is the verbs backend's: this suite exists only where verbs runs.
class cm_event_loop : public cm_churn
{
};

std::vector<backend> verbs_if_selected()
{
    std::vector<backend> v;
    for (backend b : selected_backends())
        if (b == backend::verbs)
            v.push_back(b);
    return v;
}

TEST_P(cm_event_loop, an_event_discarded_between_poll_and_read_does_not_stall_the_loop)
{
    auto dom = domain::open(address(backend::verbs, 0));
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    ASSERT_EQ(inet_pton(AF_INET, host_for(backend::verbs).c_str(), &dst.sin_addr), 1);
    for (int round = 0; round < 3; ++round) {
        hook_polled = hook_release = false;
        auto loop = std::make_unique<cm::event_loop>(dom->native_context());
        cm::cm_state st;
        rdma_cm_id* id = nullptr;
        ASSERT_EQ(rdma_create_id(loop->channel(), &id, nullptr, RDMA_PS_TCP), 0) << std::strerror(errno);
        loop->attach(id, &st);
        cm::set_after_poll_hook(hold_after_poll);
        ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0)
            << std::strerror(errno);
        {
            std::unique_lock lock(hook_mutex);
            ASSERT_TRUE(hook_changed.wait_for(lock, 10s, [] { return hook_polled; }))
                << "the loop never saw ADDR_RESOLVED";
        }
        cm::set_after_poll_hook(nullptr);
        // The event is queued, announced and not yet read: destroying the id discards it.
        loop->detach(id);
        rdma_destroy_id(id);
        {
            std::lock_guard lock(hook_mutex);
            hook_release = true;
        }
        hook_changed.notify_all();
        std::this_thread::sleep_for(50ms); // the loop reads the now empty channel
        bounded("~event_loop after a discarded event", 10s, [&] { loop.reset(); });
        EXPECT_EQ(st.resolved, cm::resolve_step::none) << "the discarded event was handled";
    }
}

// An address in the guest's /24 that nothing answers, given a neighbour entry so that the
// SYN (rxe: the CM request) is sent, and eth0 silenced (netem drops everything it sends; the
// guest's own connections go over lo, rxe's by its loopback) until off() or destruction.
struct silenced_host {
    const std::string nobody = "192.168.77.99";
    bool on = false;
    bool start()
    {
        on = sh("ip neigh replace " + nobody + " lladdr 02:00:00:00:00:99 dev eth0 nud permanent") == 0 &&
             sh("tc qdisc add dev eth0 root netem loss 100%") == 0;
        return on;
    }
    void off()
    {
        if (std::exchange(on, false))
            sh("tc qdisc del dev eth0 root 2>/dev/null");
    }
    ~silenced_host()
    {
        off();
        sh("ip neigh del " + nobody + " dev eth0 2>/dev/null");
    }
};

bool in_a_guest_as_root()
{
    return std::getenv("RDMX_GUEST_IP") && ::geteuid() == 0;
}

/// Both ends of a connection from `dom` to its own listener `lst` (accepted on a thread,
/// 10 s to connect); a failure to connect is reported as `what` and leaves `live` empty.
struct own_pair {
    std::unique_ptr<connection> live, served;
};
own_pair connect_to_own_listener(domain& dom, listener& lst, const char* what)
{
    own_pair p;
    std::thread server([&] {
        if (auto req = lst.get_request(20s))
            p.served = req->accept({});
    });
    try {
        connection_options o;
        o.timeout = 10s;
        p.live = dom.connect(address(backend::verbs, lst.port()), o);
    } catch (const error& e) {
        ADD_FAILURE() << what << ": " << e.what();
    }
    server.join();
    return p;
}

/// Waits (up to 60 s) until no rdma_connect waits in the kernel.
void wait_until_no_connect_call()
{
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (cm::connect_call::in_flight() != 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(50ms);
}

// siw makes the TCP connection inside rdma_connect, blocking: to a host that never answers
// the SYN, the call returns only when the kernel gives up (about 127 s). The domain's other
// connections go on meanwhile, the unanswered one fails at its own deadline, and destroying
// it returns at once; once the host answers (here: a reset), what the call held is freed.
// In a guest only: it silences eth0's outgoing traffic for a while (the guest's own
// connections go over lo, rxe's by its loopback) and gives an unused address a neighbour
// entry, so that the SYN (rxe: the CM request) is sent and lost.
TEST_P(cm_event_loop, a_host_that_never_answers_stalls_no_other_connection)
{
    if (!in_a_guest_as_root())
        GTEST_SKIP() << "needs a QEMU guest of tests/guest/ (RDMX_GUEST_IP, root), whose eth0 it may silence";
    silenced_host silence;
    const std::string& nobody = silence.nobody;
    ASSERT_TRUE(silence.start());

    auto dom = domain::open(address(backend::verbs, 0));
    const bool iwarp = dom->native_context()->device->transport_type == IBV_TRANSPORT_IWARP;
    auto lst = dom->listen(address(backend::verbs, 0));
    auto q = event_queue::create();
    connection_options o;
    o.events = q;
    o.timeout = 2s;
    const auto t0 = std::chrono::steady_clock::now();
    auto stuck = dom->start_connect(address(backend::verbs, nobody, 4791), o);
    std::this_thread::sleep_for(300ms); // its rdma_connect sits in the kernel by now (siw)
    if (iwarp) {
        EXPECT_GE(cm::connect_call::in_flight(), 1u) << "rdma_connect returned: the SYN was answered";
    }

    // Another connection of the same domain, to its own listener, meanwhile.
    auto [live, served] = connect_to_own_listener(*dom, *lst, "the other connection");
    ASSERT_TRUE(live && served);
    EXPECT_EQ(live->state(), connection_state::established);
    EXPECT_EQ(stuck->state(), connection_state::connecting) << "the lost SYN ended before its deadline";

    // The unanswered one fails by its deadline (not the kernel's ~127 s) and goes at once.
    event ev;
    ASSERT_EQ(q->wait({&ev, 1}, 20s), 1u) << "no event for the unanswered connection";
    EXPECT_EQ(ev.type, event_type::error);
    EXPECT_EQ(ev.cause, errc::timed_out) << ev.cause.message();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
    if (iwarp) {
        EXPECT_GE(cm::connect_call::in_flight(), 1u) << "rdma_connect returned: the SYN was answered";
    }
    const auto t1 = std::chrono::steady_clock::now();
    stuck.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t1, 5s);
    live.reset();
    served.reset();

    // The host answers the next SYN (QEMU's restricted network: a reset): the call returns
    // and the reaper destroys what the connection left.
    silence.off();
    wait_until_no_connect_call();
    EXPECT_EQ(cm::connect_call::in_flight(), 0u) << "rdma_connect still waits after the host answered";
    bounded("closing the domain", 30s, [&] { dom.reset(); });
}

// iWARP: at most connect_call's bound of rdma_connect calls wait in the kernel at once (a
// thread each); one more fails no_resources rather than starting a thread without end. The
// threads that made the calls serve the next ones instead of new threads.
TEST_P(cm_event_loop, iwarp_connects_past_the_bound_fail_and_their_threads_serve_the_next)
{
    if (!in_a_guest_as_root())
        GTEST_SKIP() << "needs a QEMU guest of tests/guest/ (RDMX_GUEST_IP, root), whose eth0 it may silence";
    auto dom = domain::open(address(backend::verbs, 0));
    if (dom->native_context()->device->transport_type != IBV_TRANSPORT_IWARP)
        GTEST_SKIP()
            << "RoCE and InfiniBand call rdma_connect on the event loop (it does not block): no bound";
    wait_until_no_connect_call(); // an earlier test's call
    ASSERT_EQ(cm::connect_call::in_flight(), 0u);
    struct restore_bound {
        ~restore_bound() { cm::connect_call::set_max_in_flight(cm::connect_call::default_max_in_flight); }
    } restore;
    cm::connect_call::set_max_in_flight(2);
    silenced_host silence;
    ASSERT_TRUE(silence.start());

    auto q = event_queue::create();
    connection_options o;
    o.events = q;
    o.timeout = 30s;
    auto a = dom->start_connect(address(backend::verbs, silence.nobody, 4791), o);
    auto b = dom->start_connect(address(backend::verbs, silence.nobody, 4792), o);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (cm::connect_call::in_flight() < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
    ASSERT_EQ(cm::connect_call::in_flight(), 2u)
        << "the two connects to a silent host are not both in the kernel";
    EXPECT_GE(cm::connect_call::threads(), 2u);

    auto c = dom->start_connect(address(backend::verbs, silence.nobody, 4793), o);
    event ev;
    ASSERT_EQ(q->wait({&ev, 1}, 10s), 1u) << "the third connect neither failed nor waited in the kernel";
    EXPECT_EQ(ev.conn, c.get());
    EXPECT_EQ(ev.type, event_type::error);
    EXPECT_EQ(ev.cause, errc::no_resources) << ev.cause.message();
    EXPECT_EQ(c->state(), connection_state::error);
    EXPECT_EQ(a->state(), connection_state::connecting);
    EXPECT_EQ(b->state(), connection_state::connecting);
    EXPECT_EQ(cm::connect_call::in_flight(), 2u);
    a.reset();
    b.reset();
    c.reset();

    // The host answers the next SYN: both calls return, their threads wait for more.
    silence.off();
    wait_until_no_connect_call();
    ASSERT_EQ(cm::connect_call::in_flight(), 0u) << "rdma_connect still waits after the host answered";
    const unsigned idle = cm::connect_call::threads();
    EXPECT_GE(idle, 1u) << "the call threads ended at once (they wait connect_call::idle_timeout)";
    auto lst = dom->listen(address(backend::verbs, 0));
    auto [live, served] = connect_to_own_listener(*dom, *lst, "after the silent host");
    ASSERT_TRUE(live && served);
    EXPECT_EQ(live->state(), connection_state::established);
    // Its rdma_connect ran on a thread that was waiting (one may have ended meanwhile).
    EXPECT_LE(cm::connect_call::threads(), idle) << "a new thread while " << idle << " waited";
    // A forked child has none of those threads: its pool starts empty (a call there would
    // otherwise wait for a thread that does not exist).
    const unsigned parents = cm::connect_call::threads();
    EXPECT_GE(parents, 1u);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << std::strerror(errno);
    if (child == 0)
        ::_exit(cm::connect_call::threads() == 0 ? 0 : 1);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the child counts the parent's " << parents << " pool threads as its own";
    live.reset();
    served.reset();
    bounded("closing the domain", 30s, [&] { dom.reset(); });
}

INSTANTIATE_TEST_SUITE_P(backends, cm_event_loop, testing::ValuesIn(verbs_if_selected()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(cm_event_loop);

// The private data trailer (docs/wire-format.md section 10): the user's bytes come back
// exactly and the goodbye target whole; what lacks the trailer is a peer that is not
// rdmx, all of whose bytes are the user's and which has no goodbye.
TEST(cm_private_data, the_trailer_round_trips_and_foreign_data_is_all_the_users)
{
    std::array<std::byte, cm::accept_wire_size> wire;
    std::vector<std::byte> user(cm::accept_wire_size - cm::trailer_size);
    for (std::size_t i = 0; i < user.size(); ++i)
        user[i] = static_cast<std::byte>(i * 7 + 1);
    const cm::goodbye_target own{0x89abcdefu, 0x0123456789abcdefull};
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, user.size()}) {
        cm::encode_private_data({user.data(), n}, own, wire);
        for (std::size_t i = n; i < wire.size() - cm::trailer_size; ++i)
            EXPECT_EQ(wire[i], std::byte{0}) << "padding at " << i;
        EXPECT_EQ(wire[wire.size() - 16], std::byte{'r'});
        EXPECT_EQ(wire[wire.size() - 15], std::byte{'x'});
        EXPECT_EQ(wire[wire.size() - 8], std::byte{0xef}) << "addr, little endian";
        EXPECT_EQ(wire[wire.size() - 1], std::byte{0x01}) << "addr, little endian";
        EXPECT_EQ(wire[wire.size() - 12], std::byte{0xef}) << "rkey, little endian";
        const auto d = cm::decode_private_data(wire);
        ASSERT_EQ(d.user.size(), n);
        EXPECT_TRUE(std::equal(d.user.begin(), d.user.end(), user.begin()));
        ASSERT_TRUE(d.peer);
        EXPECT_EQ(d.peer->rkey, own.rkey);
        EXPECT_EQ(d.peer->addr, own.addr);
    }
    // Another implementation's: padded with zeros (IB CM), exact (iWARP), short, or with a
    // length that does not fit, or another version.
    std::vector<std::byte> foreign(cm::connect_wire_size, std::byte{0});
    foreign[0] = std::byte{'h'};
    for (std::size_t len : {cm::connect_wire_size, std::size_t{1}, std::size_t{0}}) {
        const auto d = cm::decode_private_data({foreign.data(), len});
        EXPECT_EQ(d.user.size(), len);
        EXPECT_FALSE(d.peer);
    }
    cm::encode_private_data({user.data(), 3}, own, wire);
    wire[wire.size() - 13] = std::byte{200}; // user length beyond the room
    EXPECT_FALSE(cm::decode_private_data(wire).peer);
    EXPECT_EQ(cm::decode_private_data(wire).user.size(), wire.size());
    wire[wire.size() - 13] = std::byte{3};
    wire[wire.size() - 14] = std::byte{2}; // version 2
    EXPECT_FALSE(cm::decode_private_data(wire).peer);
}
#endif

INSTANTIATE_TEST_SUITE_P(backends, cm_churn, testing::ValuesIn(selected_backends()), param_name);

} // namespace
} // namespace rdmx::test
