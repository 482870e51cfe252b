// Application shapes: programs written the way real servers and clients are written, run
// long enough that a rare failure shows. Targets that (a) busy-poll, (b) sleep in epoll on
// completion_fd() after request_notify(), (c) sleep in connection::wait(), (d) never call
// anything (one-sided traffic only); initiators that write or read 4 KiB .. 4 MiB, each
// transfer followed by a send that the target answers, with 1 and 8 concurrent clients
// (a thread and a connection each); and clients killed in the middle of a transfer. Every
// byte is checked against a pattern that differs per round and per client, and every wait
// has a deadline: a stall fails the test, it never hangs it.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/test_data.hpp"
#include "common/test_util.hpp"

namespace rdmx::test
{
namespace
{

using clock = std::chrono::steady_clock;

// Transfer+send rounds per shape, over all its clients. On TCP enough that a failure in
// one round of a hundred shows in nearly every run (0.99^400 < 2 %). Soft-RoCE in the test
// guest runs under emulation, where every byte costs many times what it costs here: fewer
// rounds there keep the verbs run's added time within a few minutes (a 1-in-100 failure
// then shows in about two runs of three; the TCP run is the sensitive one).
// RDMX_SHAPES_ROUNDS overrides both.
constexpr std::size_t tcp_rounds = 400;
constexpr std::size_t verbs_rounds = 96;

// 4 KiB .. 4 MiB, with sizes on both sides of the TCP engine's thresholds (its 1 KiB
// receive stage, the 64 KiB .. 256 KiB receive low-water marks, its 1 MiB transmit
// budget). Multiples of 8: the patterns are made of 64-bit words.
constexpr std::size_t sizes[] = {4u << 10,   32u << 10,  64u << 10,  100u << 10, 128u << 10,
                                 200u << 10, 256u << 10, 320u << 10, 1u << 20,   4u << 20};
constexpr std::size_t max_size = 4u << 20;
constexpr std::size_t offset_span = 64u << 10; ///< transfers start at a per-round offset below this
constexpr std::size_t region_size = max_size + offset_span;
// Rounds a client has in flight: the next transfer is on its way while the target handles
// the previous round's send. Each has its own half of the target region and its own buffer.
constexpr std::size_t window = 2;
// Receives posted per side, one per round in flight; the initiator's answers have wr_ids
// from answer_wr (below them: 4 x round + 1 for the transfer, + 2 for the send).
constexpr std::size_t recv_slots = window;
constexpr std::uint64_t answer_wr = std::uint64_t{1} << 60;
// Longer than the dead-peer bound of the default options (ack_timeout 500 ms x 8): a
// stalled transfer shows as the error it ends in rather than as this test's timeout.
constexpr auto round_timeout = std::chrono::seconds(30);

enum class target_mode {
    busy,  ///< (a) one thread polls every connection in a loop
    epoll, ///< (b) one thread sleeps in epoll_wait on every completion_fd() after request_notify()
    wait,  ///< (c) a thread per connection sleeps in connection::wait()
    idle,  ///< (d) the target application never calls the connection
};
enum class op_kind { write, read };

/// What the initiator's send tells the target about the transfer before it.
struct message {
    std::uint64_t round, size, offset, seed;
    std::uint32_t op, client;
};
/// The target's answer: 0, or 1 + the offset of the first wrong byte it found.
struct answer {
    std::uint64_t round, bad;
};

/// Completions of one connection, fetched the way the shape's application fetches them.
class completion_source
{
public:
    completion_source(connection& c, target_mode m) : c_(c), m_(m)
    {
        if (m_ != target_mode::epoll)
            return;
        ep_ = ::epoll_create1(EPOLL_CLOEXEC);
        epoll_event ev{};
        ev.events = EPOLLIN;
        if (ep_ < 0 || ::epoll_ctl(ep_, EPOLL_CTL_ADD, c.completion_fd(), &ev) != 0)
            ADD_FAILURE() << "epoll: " << std::strerror(errno);
    }
    ~completion_source()
    {
        if (ep_ >= 0)
            ::close(ep_);
    }
    completion_source(const completion_source&) = delete;
    completion_source& operator=(const completion_source&) = delete;

    /// Up to out.size() completions; 0 once `deadline` has passed.
    std::size_t next(std::span<completion> out, clock::time_point deadline)
    {
        for (;;) {
            if (std::size_t n = c_.poll(out))
                return n;
            auto now = clock::now();
            if (now >= deadline)
                return 0;
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) + 1ms;
            switch (m_) {
            case target_mode::busy:
            case target_mode::idle: std::this_thread::yield(); break;
            case target_mode::wait:
                if (std::size_t n = c_.wait(out, left))
                    return n;
                break;
            case target_mode::epoll: {
                if (auto ec = c_.request_notify()) {
                    ADD_FAILURE() << "request_notify: " << ec.message();
                    return 0;
                }
                // A completion that came before the arming raises no event.
                if (std::size_t n = c_.poll(out))
                    return n;
                epoll_event ev;
                if (::epoll_wait(ep_, &ev, 1, static_cast<int>(left.count())) > 0)
                    c_.ack_notify();
                break;
            }
            }
        }
    }

private:
    connection& c_;
    target_mode m_;
    int ep_ = -1;
};

/// The victim's last word: "E" and why, then exit.
[[noreturn]] void victim_fails(int ready_fd, const std::string& why)
{
    std::string m = "E" + why;
    [[maybe_unused]] auto n = ::write(ready_fd, m.data(), m.size());
    ::_exit(3);
}

/// A client process that keeps a 4 MiB write and a 4 MiB read in flight at the target's
/// region (the accept's private data) until it is killed. Tells `ready_fd` "R" once data
/// moves, or "E" and what failed. Runs in a forked child: it touches none of the parent's
/// objects, uses no stdio, and ends with _exit.
[[noreturn]] void victim_main(const std::string& local, const std::string& target,
                              const connection_options& opts, std::size_t index, int ready_fd)
{
    ::prctl(PR_SET_PDEATHSIG, SIGKILL); // never outlive the test
    ::alarm(120);                       // nor run on if the test forgot it
    try {
        auto dom = domain::open(local);
        std::vector<std::byte> buf(2 * max_size);
        auto mr = dom->register_memory(buf.data(), buf.size(), access::local_write);
        auto c = dom->connect(target, opts, as_bytes("victim " + std::to_string(index)));
        auto pd = c->peer_private_data();
        auto rb = remote_buffer::parse(pd.first(std::min(pd.size(), remote_buffer::wire_size)));
        if (!rb)
            victim_fails(ready_fd, "the accept's private data is not a remote_buffer");
        sge w{mr.get(), 0, max_size}, r{mr.get(), max_size, max_size};
        if (auto ec = c->post_write({&w, 1}, *rb, 1))
            victim_fails(ready_fd, "post_write: " + ec.message());
        if (auto ec = c->post_read({&r, 1}, *rb, 2))
            victim_fails(ready_fd, "post_read: " + ec.message());
        bool told = false;
        completion cs[4];
        // A write and a read in flight, then both again once both are done, after a pause
        // of 1 ms. Without it the target's side never runs out of requests of this peer:
        // Linux 6.1's rxe runs a QP's task as long as it has work, in a softirq
        // of whichever CPU scheduled it, and a peer that reposts at once on the other vCPU
        // kept one vCPU there for 22 s and more (a soft lockup; the target and the other
        // client starved). Later kernels bound those runs (rxe_task.c, RXE_MAX_ITERATIONS).
        for (int done = 0;;) {
            for (std::size_t n = c->poll(cs), k = 0; k < n; ++k, ++done) {
                if (cs[k].status)
                    victim_fails(ready_fd,
                                 "wr_id " + std::to_string(cs[k].wr_id) + ": " + cs[k].status.message());
                if (!told) {
                    char x = 'R';
                    told = ::write(ready_fd, &x, 1) == 1;
                }
            }
            if (done < 2)
                continue;
            done = 0;
            std::this_thread::sleep_for(1ms);
            std::error_code ec = c->post_write({&w, 1}, *rb, 1);
            if (!ec)
                ec = c->post_read({&r, 1}, *rb, 2);
            if (ec)
                victim_fails(ready_fd, "post: " + ec.message());
        }
    } catch (const std::exception& e) {
        victim_fails(ready_fd, e.what());
    }
}

constexpr const char* victim_env = "RDMX_SHAPES_VICTIM"; ///< "index ready_fd local_address target"

// A victim is this test binary run again (fork and exec) with RDMX_SHAPES_VICTIM set: it
// becomes the victim here, before main(). A fork alone would not do: the child would share
// rdma_cm's device contexts, opened by the parent, and the kernel refuses verbs commands
// on them from another process (EACCES).
[[maybe_unused]] const bool victim_process = [] {
    const char* v = std::getenv(victim_env);
    if (!v)
        return false;
    std::size_t index = 0;
    int fd = -1;
    char local[256] = {}, target[256] = {};
    if (std::sscanf(v, "%zu %d %255s %255s", &index, &fd, local, target) != 4)
        ::_exit(126);
    victim_main(local, target, {}, index, fd);
}();

/// Kills and reaps the children still alive when a test ends early.
struct reaper {
    std::vector<pid_t> pids;
    ~reaper()
    {
        for (pid_t p : pids)
            if (p > 0) {
                ::kill(p, SIGKILL);
                ::waitpid(p, nullptr, 0);
            }
    }
};

class shapes : public pair_fixture
{
protected:
    /// One client's connection and memory, both ends.
    struct lane {
        std::size_t client = 0;
        std::unique_ptr<connection> client_conn, target_conn;
        // Target side: the region the client writes and reads (one half per round in
        // flight), and its message slots.
        std::vector<std::byte> region, inbox, answers;
        std::unique_ptr<memory_region> region_mr, inbox_mr, answers_mr;
        std::uint64_t region_seed[window] = {}; ///< read shapes: half h holds fill_words(region_seed[h])
        // Initiator side: one buffer per round in flight (the write's source, the read's sink).
        std::vector<std::byte> buf, notes, replies;
        std::unique_ptr<memory_region> buf_mr, notes_mr, replies_mr;
        remote_buffer remote{}; ///< the target region, as the accept's private data said
        // Results.
        std::atomic<std::size_t> rounds_done{0};
        std::uint64_t last_offset = 0, last_size = 0, last_seed = 0;
    };

    std::size_t rounds() const
    {
        return env_or("RDMX_SHAPES_ROUNDS", tcp_engine(b_) ? tcp_rounds : verbs_rounds);
    }

    /// Connects `n` clients, one at a time, each told its target region by the accept's
    /// private data (as a server would hand out a descriptor).
    std::vector<std::unique_ptr<lane>> make_lanes(std::size_t n, std::uint64_t tag,
                                                  const connection_options& opts = {})
    {
        std::vector<std::unique_ptr<lane>> lanes;
        for (std::size_t i = 0; i < n; ++i) {
            auto l = std::make_unique<lane>();
            l->client = i;
            l->region.resize(window * region_size);
            for (std::size_t h = 0; h < window; ++h) {
                l->region_seed[h] = mix(tag << 40 ^ i << 32 ^ (0xffffff00u + h));
                fill_words(l->region.data() + h * region_size, region_size, l->region_seed[h]);
            }
            l->region_mr = server_dom_->register_memory(l->region.data(), l->region.size(),
                                                        access::remote_write | access::remote_read);
            l->inbox.resize(recv_slots * sizeof(message));
            l->inbox_mr = server_dom_->register_memory(l->inbox.data(), l->inbox.size(), access::local_write);
            l->answers.resize(recv_slots * sizeof(answer));
            l->answers_mr = server_dom_->register_memory(l->answers.data(), l->answers.size(), access::none);
            l->buf.resize(window * max_size);
            l->notes.resize(window * sizeof(message));
            l->replies.resize(recv_slots * sizeof(answer));
            l->buf_mr = client_dom_->register_memory(l->buf.data(), l->buf.size(), access::local_write);
            l->notes_mr = client_dom_->register_memory(l->notes.data(), l->notes.size(), access::none);
            l->replies_mr =
                client_dom_->register_memory(l->replies.data(), l->replies.size(), access::local_write);
            auto wire = l->region_mr->remote().serialize();
            auto accepted = std::async(std::launch::async, [&] {
                auto req = listener_->get_request(10s);
                if (!req)
                    throw std::runtime_error("no connection request within 10 s");
                return req->accept(opts, wire);
            });
            l->client_conn = client_dom_->connect(server_address(), opts);
            l->target_conn = accepted.get();
            auto pd = l->client_conn->peer_private_data();
            auto rb = remote_buffer::parse(pd.first(std::min(pd.size(), remote_buffer::wire_size)));
            if (!rb)
                throw std::runtime_error("the accept's private data is not a remote_buffer");
            l->remote = *rb;
            for (std::size_t s = 0; s < recv_slots; ++s) {
                sge in{l->inbox_mr.get(), s * sizeof(message), sizeof(message)};
                if (auto ec = l->target_conn->post_recv({&in, 1}, s))
                    throw std::system_error(ec, "post_recv");
                sge rp{l->replies_mr.get(), s * sizeof(answer), sizeof(answer)};
                if (auto ec = l->client_conn->post_recv({&rp, 1}, answer_wr + s))
                    throw std::system_error(ec, "post_recv");
            }
            lanes.push_back(std::move(l));
        }
        return lanes;
    }

    /// The target's part for one completion of lane l: checks a written region against
    /// what the message says, answers, and reposts the receive. False on a failure.
    static bool serve(lane& l, const completion& c)
    {
        if (c.status) {
            ADD_FAILURE() << "target, client " << l.client << ", wr_id " << c.wr_id << ": "
                          << c.status.message();
            return false;
        }
        if (c.opcode == opcode::send)
            return true; // an answer went out
        if (c.opcode != opcode::recv || c.wr_id >= recv_slots || c.byte_len != sizeof(message)) {
            ADD_FAILURE() << "target, client " << l.client << ": unexpected completion "
                          << to_string(c.opcode) << " wr_id " << c.wr_id << " byte_len " << c.byte_len;
            return false;
        }
        std::size_t slot = c.wr_id;
        message m;
        std::memcpy(&m, l.inbox.data() + slot * sizeof m, sizeof m);
        answer a{m.round, 0};
        if (m.op == static_cast<std::uint32_t>(op_kind::write)) {
            // The send came after the write on the same connection: the bytes are in place.
            // (The next round's write goes to the other half of the region.)
            if (m.offset + m.size > l.region.size())
                a.bad = 1;
            else if (auto at = first_wrong_word(l.region.data() + m.offset, m.size, m.seed))
                a.bad = 1 + *at;
        }
        std::memcpy(l.answers.data() + slot * sizeof a, &a, sizeof a);
        sge in{l.inbox_mr.get(), slot * sizeof(message), sizeof(message)};
        sge out{l.answers_mr.get(), slot * sizeof(answer), sizeof(answer)};
        if (auto ec = l.target_conn->post_recv({&in, 1}, slot)) {
            ADD_FAILURE() << "target, client " << l.client << ": post_recv: " << ec.message();
            return false;
        }
        if (auto ec = l.target_conn->post_send({&out, 1}, 100 + slot)) {
            ADD_FAILURE() << "target, client " << l.client << ": post_send: " << ec.message();
            return false;
        }
        return true;
    }

    /// Serves every lane in `mode` (busy, epoll or wait) until `stop`.
    static std::vector<std::thread> start_target(std::vector<lane*> lanes, target_mode mode,
                                                 const std::atomic<bool>& stop)
    {
        std::vector<std::thread> threads;
        if (mode == target_mode::wait) {
            for (lane* l : lanes)
                threads.emplace_back([l, &stop] {
                    completion cs[8];
                    bool ok = true;
                    while (!stop.load() && ok)
                        for (std::size_t n = l->target_conn->wait(cs, 50ms), k = 0; k < n && ok; ++k)
                            ok = serve(*l, cs[k]);
                });
            return threads;
        }
        threads.emplace_back([lanes, mode, &stop] {
            int ep = -1;
            if (mode == target_mode::epoll) {
                ep = ::epoll_create1(EPOLL_CLOEXEC);
                for (std::size_t i = 0; i < lanes.size(); ++i) {
                    epoll_event ev{};
                    ev.events = EPOLLIN;
                    ev.data.u64 = i;
                    if (ep < 0 || ::epoll_ctl(ep, EPOLL_CTL_ADD, lanes[i]->target_conn->completion_fd(), &ev))
                        ADD_FAILURE() << "epoll: " << std::strerror(errno);
                }
            }
            std::vector<bool> ok(lanes.size(), true);
            completion cs[8];
            auto drain = [&] {
                std::size_t got = 0;
                for (std::size_t i = 0; i < lanes.size(); ++i)
                    for (std::size_t n = ok[i] ? lanes[i]->target_conn->poll(cs) : 0, k = 0; k < n;
                         ++k, ++got)
                        ok[i] = ok[i] && serve(*lanes[i], cs[k]);
                return got;
            };
            while (!stop.load()) {
                if (drain() > 0)
                    continue;
                if (mode == target_mode::busy) {
                    std::this_thread::yield();
                    continue;
                }
                for (lane* l : lanes)
                    if (auto ec = l->target_conn->request_notify())
                        ADD_FAILURE() << "request_notify: " << ec.message();
                if (drain() > 0) // completions that came before the arming raise no event
                    continue;
                epoll_event evs[16];
                int n = ::epoll_wait(ep, evs, 16, 50);
                for (int k = 0; k < n; ++k)
                    lanes[evs[k].data.u64]->target_conn->ack_notify();
            }
            if (ep >= 0)
                ::close(ep);
        });
        return threads;
    }

    /// Round r of a client: its size, where in the target region, and its pattern.
    struct round_plan {
        std::size_t size, offset; ///< offset: into the target region (its half for this round)
        std::uint64_t seed;
    };
    static round_plan plan(const lane& l, std::size_t r, std::uint64_t tag)
    {
        std::size_t half = r % window;
        return {sizes[(r + l.client) % std::size(sizes)],
                half * region_size + 8 * ((r * 2654435761u + l.client * 40503u) % (offset_span / 8)),
                mix(tag << 40 ^ l.client << 32 ^ r)};
    }

    /// One initiator for the idle target (d): `rounds` writes, each read back into a buffer
    /// poisoned for the round and compared; no send (nobody would receive it).
    static void run_idle_client(lane& l, std::size_t rounds, std::uint64_t tag)
    {
        completion_source src(*l.client_conn, target_mode::wait);
        completion cs[4];
        for (std::size_t r = 0; r < rounds; ++r) {
            const round_plan p = plan(l, r, tag);
            remote_buffer at = l.remote;
            at.addr += p.offset;
            at.length = p.size;
            fill_words(l.buf.data(), p.size, p.seed);
            fill_words(l.buf.data() + max_size, p.size, ~p.seed);
            sge s{l.buf_mr.get(), 0, p.size}, d{l.buf_mr.get(), max_size, p.size};
            for (int step = 0; step < 2; ++step) {
                std::error_code ec = step == 0 ? l.client_conn->post_write({&s, 1}, at, 1)
                                               : l.client_conn->post_read({&d, 1}, at, 2);
                std::size_t got = ec ? 0 : src.next({cs, 1}, clock::now() + round_timeout);
                if (ec || got == 0 || cs[0].status) {
                    ADD_FAILURE() << "client " << l.client << ", round " << r << ", " << p.size << " bytes, "
                                  << (step == 0 ? "write" : "read-back") << ": "
                                  << (ec         ? ec.message()
                                      : got == 0 ? "no completion"
                                                 : cs[0].status.message());
                    return;
                }
            }
            if (auto bad = first_wrong_word(l.buf.data() + max_size, p.size, p.seed)) {
                ADD_FAILURE() << "client " << l.client << ", round " << r << ", " << p.size
                              << " bytes: read-back differs at byte " << *bad;
                return;
            }
            l.last_offset = p.offset;
            l.last_size = p.size;
            l.last_seed = p.seed;
            l.rounds_done = r + 1;
        }
    }

    /// One initiator: `rounds` transfers (and while `more` is set, more), each followed by
    /// a send that the target answers, with up to `window` rounds in flight: the next
    /// round's transfer is on its way while the target handles a send.
    static void run_client(lane& l, op_kind op, target_mode mode, std::size_t rounds, std::uint64_t tag,
                           const std::atomic<bool>* more = nullptr)
    {
        completion_source src(*l.client_conn, mode);
        completion cs[8];
        struct in_flight {
            round_plan p{};
            bool transfer = false, sent = false, answered = false;
            std::uint64_t bad = 0;
        } win[window];
        auto fail = [&](std::size_t r, const std::string& what) {
            ADD_FAILURE() << "client " << l.client << ", round " << r << ", " << win[r % window].p.size
                          << " bytes: " << what;
        };
        std::size_t posted = 0, done = 0;
        auto deadline = clock::now() + round_timeout;
        for (;;) {
            const bool go_on = more && more->load();
            while ((posted < rounds || go_on) && posted - done < window) {
                const std::size_t r = posted;
                in_flight& f = win[r % window];
                f = {plan(l, r, tag)};
                std::byte* local = l.buf.data() + (r % window) * max_size;
                remote_buffer at = l.remote;
                at.addr += f.p.offset;
                at.length = f.p.size;
                sge b{l.buf_mr.get(), (r % window) * max_size, f.p.size};
                std::error_code ec;
                if (op == op_kind::write) {
                    fill_words(local, f.p.size, f.p.seed);
                    ec = l.client_conn->post_write({&b, 1}, at, r * 4 + 1);
                } else {
                    fill_words(local, f.p.size, ~f.p.seed); // poisoned for this round
                    ec = l.client_conn->post_read({&b, 1}, at, r * 4 + 1);
                }
                message m{r,
                          f.p.size,
                          f.p.offset,
                          f.p.seed,
                          static_cast<std::uint32_t>(op),
                          static_cast<std::uint32_t>(l.client)};
                std::memcpy(l.notes.data() + (r % window) * sizeof m, &m, sizeof m);
                sge n{l.notes_mr.get(), (r % window) * sizeof m, sizeof m};
                if (!ec)
                    ec = l.client_conn->post_send({&n, 1}, r * 4 + 2);
                if (ec)
                    return fail(r, std::string("post: ") + ec.message());
                ++posted;
            }
            if (done == posted)
                return;
            std::size_t got = src.next(cs, deadline);
            if (got == 0)
                return fail(done, "no completion within " + std::to_string(round_timeout.count()) + " s");
            for (std::size_t k = 0; k < got; ++k) {
                const completion& c = cs[k];
                if (c.status)
                    return fail(done, "wr_id " + std::to_string(c.wr_id) + ": " + c.status.message());
                if (c.wr_id >= answer_wr) {
                    answer a;
                    std::memcpy(&a, l.replies.data() + (c.wr_id - answer_wr) * sizeof a, sizeof a);
                    if (a.round < done || a.round >= posted || win[a.round % window].answered)
                        return fail(done, "unexpected answer for round " + std::to_string(a.round));
                    win[a.round % window].answered = true;
                    win[a.round % window].bad = a.bad;
                    sge rp{l.replies_mr.get(), (c.wr_id - answer_wr) * sizeof(answer), sizeof(answer)};
                    if (auto ec = l.client_conn->post_recv({&rp, 1}, c.wr_id))
                        return fail(done, "post_recv: " + ec.message());
                } else {
                    std::size_t r = c.wr_id / 4;
                    if (r < done || r >= posted)
                        return fail(done, "completion for round " + std::to_string(r));
                    (c.wr_id % 4 == 1 ? win[r % window].transfer : win[r % window].sent) = true;
                }
            }
            // Rounds end in order (completions and answers come in order).
            while (done < posted) {
                in_flight& f = win[done % window];
                if (!(f.transfer && f.sent && f.answered))
                    break;
                if (f.bad)
                    return fail(done, "the target found the written bytes wrong at byte " +
                                          std::to_string(f.bad - 1));
                if (op == op_kind::read) {
                    std::size_t half = done % window;
                    if (auto bad =
                            first_wrong_word(l.buf.data() + half * max_size, f.p.size, l.region_seed[half],
                                             (f.p.offset - half * region_size) / 8))
                        return fail(done, "read data differs at byte " + std::to_string(*bad));
                }
                ++done;
                l.rounds_done = done;
                deadline = clock::now() + round_timeout;
            }
        }
    }

    void run_shape(target_mode mode, op_kind op, std::size_t clients)
    {
        const std::uint64_t tag =
            1 + static_cast<std::uint64_t>(mode) * 16 + static_cast<std::uint64_t>(op) * 4 + (clients > 1);
        const std::size_t per_client = std::max<std::size_t>(1, rounds() / clients);
        auto lanes = make_lanes(clients, tag);
        std::atomic<bool> stop{false};
        std::vector<lane*> ptrs;
        for (auto& l : lanes)
            ptrs.push_back(l.get());
        std::vector<std::thread> target;
        if (mode != target_mode::idle)
            target = start_target(ptrs, mode, stop);
        std::vector<std::thread> initiators;
        for (auto& l : lanes)
            initiators.emplace_back([&, lp = l.get()] {
                if (mode == target_mode::idle)
                    run_idle_client(*lp, per_client, tag);
                else
                    run_client(*lp, op, mode, per_client, tag);
            });
        for (auto& t : initiators)
            t.join();
        stop = true;
        for (auto& t : target)
            t.join();
        std::size_t done = 0;
        for (auto& l : lanes) {
            done += l->rounds_done;
            EXPECT_EQ(l->rounds_done, per_client) << "client " << l->client << " stopped early";
            if (mode == target_mode::idle && l->rounds_done == per_client) {
                // The target itself finds the last round's bytes in its memory.
                EXPECT_EQ(first_wrong_word(l->region.data() + l->last_offset, l->last_size, l->last_seed),
                          std::nullopt)
                    << "client " << l->client << ": the target's memory lacks the last write";
            }
        }
        std::printf("[ shapes   ] %s: %zu of %zu rounds completed and verified\n", to_string(b_), done,
                    per_client * clients);
    }
};

TEST_P(shapes, busy_target_write_then_send_1_client)
{
    run_shape(target_mode::busy, op_kind::write, 1);
}
TEST_P(shapes, busy_target_write_then_send_8_clients)
{
    run_shape(target_mode::busy, op_kind::write, 8);
}
TEST_P(shapes, busy_target_read_then_send_1_client)
{
    run_shape(target_mode::busy, op_kind::read, 1);
}
TEST_P(shapes, busy_target_read_then_send_8_clients)
{
    run_shape(target_mode::busy, op_kind::read, 8);
}
TEST_P(shapes, epoll_target_write_then_send_1_client)
{
    run_shape(target_mode::epoll, op_kind::write, 1);
}
TEST_P(shapes, epoll_target_write_then_send_8_clients)
{
    run_shape(target_mode::epoll, op_kind::write, 8);
}
TEST_P(shapes, epoll_target_read_then_send_1_client)
{
    run_shape(target_mode::epoll, op_kind::read, 1);
}
TEST_P(shapes, epoll_target_read_then_send_8_clients)
{
    run_shape(target_mode::epoll, op_kind::read, 8);
}
TEST_P(shapes, wait_target_write_then_send_1_client)
{
    run_shape(target_mode::wait, op_kind::write, 1);
}
TEST_P(shapes, wait_target_write_then_send_8_clients)
{
    run_shape(target_mode::wait, op_kind::write, 8);
}
TEST_P(shapes, wait_target_read_then_send_1_client)
{
    run_shape(target_mode::wait, op_kind::read, 1);
}
TEST_P(shapes, wait_target_read_then_send_8_clients)
{
    run_shape(target_mode::wait, op_kind::read, 8);
}
TEST_P(shapes, idle_target_write_and_read_back_1_client)
{
    run_shape(target_mode::idle, op_kind::write, 1);
}
TEST_P(shapes, idle_target_write_and_read_back_8_clients)
{
    run_shape(target_mode::idle, op_kind::write, 8);
}

TEST_P(shapes, clients_killed_mid_transfer_leave_the_target_serving)
{
    // Clients in processes of their own, killed (SIGKILL) while 4 MiB writes and reads of
    // theirs are in flight, one after the other, while another client goes on writing,
    // sending and checking. The target (an epoll loop, as a server is written) must keep
    // serving that client, and its connections to the dead ones must end, with their work
    // completed in error, within the dead-peer bound.
    constexpr std::size_t victims = 2;
    connection_options opts; // the target's, and its other client's
    opts.ack_timeout = 200ms;
    // The bound the options promise (connection_options::ack_timeout), at least 1 s on TCP;
    // three times it leaves room for a loaded machine, and for rxe under emulation.
    const auto bound = 3 * std::max<clock::duration>(opts.ack_timeout * (opts.retry_count + 1), 1s);
    // A slice of its own for each victim: two peers writing the same bytes at once would
    // be a race in the target's memory (ThreadSanitizer sees the two receives).
    std::vector<std::byte> victim_region(victims * max_size);
    auto victim_mr = server_dom_->register_memory(victim_region.data(), victim_region.size(),
                                                  access::remote_write | access::remote_read);
    auto slice = [&](std::size_t i) {
        remote_buffer rb = victim_mr->remote();
        rb.addr += i * max_size;
        rb.length = max_size;
        return rb.serialize();
    };

    // The victims: this binary again (see victim_process), each told its part in its
    // environment, built here: between fork and exec only async-signal-safe calls.
    const std::string local = address(b_, 0), target = server_address();
    reaper kids;
    std::vector<int> ready;
    for (std::size_t i = 0; i < victims; ++i) {
        int fds[2];
        ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
        std::vector<std::string> env{std::string(victim_env) + "=" + std::to_string(i) + " " +
                                     std::to_string(fds[1]) + " " + local + " " + target};
        for (char** e = environ; *e; ++e)
            env.emplace_back(*e);
        std::vector<char*> envp;
        for (auto& e : env)
            envp.push_back(e.data());
        envp.push_back(nullptr);
        char arg0[] = "shapes-victim";
        char* argv[] = {arg0, nullptr};
        pid_t pid = ::fork();
        ASSERT_GE(pid, 0) << "fork: " << std::strerror(errno);
        if (pid == 0) {
            ::close(fds[0]);
            ::fcntl(fds[1], F_SETFD, 0); // the write end survives the exec
            ::execve("/proc/self/exe", argv, envp.data());
            ::_exit(127);
        }
        ::close(fds[1]);
        kids.pids.push_back(pid);
        ready.push_back(fds[0]);
    }
    struct fd_closer {
        std::vector<int>& fds;
        ~fd_closer()
        {
            for (int fd : fds)
                ::close(fd);
        }
    } close_ready{ready};

    // They connect in any order: each says which it is.
    std::vector<std::unique_ptr<connection>> victim_conns(victims);
    for (std::size_t i = 0; i < victims; ++i) {
        auto req = listener_->get_request(30s);
        ASSERT_NE(req, nullptr) << "the client processes did not connect";
        std::string who = as_string(req->private_data());
        std::size_t k = who.starts_with("victim ") ? std::strtoul(who.c_str() + 7, nullptr, 10) : victims;
        ASSERT_TRUE(k < victims && !victim_conns[k]) << "unexpected connection request: " << who;
        victim_conns[k] = req->accept(opts, slice(k));
    }
    const std::uint64_t tag = 0x7f;
    auto lanes = make_lanes(1, tag, opts);
    lane& healthy = *lanes[0];
    // Each victim connection holds a receive: its end completes it (flushed).
    std::vector<std::byte> victim_inbox(victims * 64);
    auto victim_inbox_mr =
        server_dom_->register_memory(victim_inbox.data(), victim_inbox.size(), access::local_write);
    std::vector<std::byte> probe(8);
    auto probe_mr = server_dom_->register_memory(probe.data(), probe.size(), access::none);
    for (std::size_t i = 0; i < victims; ++i) {
        sge in{victim_inbox_mr.get(), i * 64, 64};
        ASSERT_FALSE(victim_conns[i]->post_recv({&in, 1}, 1));
    }

    // The target: one epoll loop over all connections. After a victim is killed it also
    // sends it a message, so that the death is noticed even where no disconnect arrives
    // (a peer gone silent is found by the send's retries).
    struct victim_state {
        std::atomic<bool> killed{false};
        bool probed = false;
        int outstanding = 1, done = 0, errors = 0;
        std::atomic<bool> ended{false};
        std::string what;
    };
    std::vector<victim_state> vs(victims);
    std::atomic<bool> stop{false};
    std::thread server([&] {
        int ep = ::epoll_create1(EPOLL_CLOEXEC);
        std::vector<connection*> conns{healthy.target_conn.get()};
        for (auto& c : victim_conns)
            conns.push_back(c.get());
        for (std::size_t i = 0; i < conns.size(); ++i) {
            epoll_event ev{};
            ev.events = EPOLLIN;
            ev.data.u64 = i;
            if (ep < 0 || ::epoll_ctl(ep, EPOLL_CTL_ADD, conns[i]->completion_fd(), &ev))
                ADD_FAILURE() << "epoll: " << std::strerror(errno);
        }
        bool healthy_ok = true;
        completion cs[8];
        auto drain = [&] {
            std::size_t got = 0;
            for (std::size_t n = healthy_ok ? conns[0]->poll(cs) : 0, k = 0; k < n; ++k, ++got)
                healthy_ok = healthy_ok && serve(healthy, cs[k]);
            for (std::size_t i = 0; i < victims; ++i) {
                victim_state& v = vs[i];
                if (v.killed && !v.probed) {
                    v.probed = true;
                    sge p{probe_mr.get(), 0, 8};
                    if (!conns[1 + i]->post_send({&p, 1}, 2))
                        ++v.outstanding;
                }
                for (std::size_t n = conns[1 + i]->poll(cs), k = 0; k < n; ++k, ++got) {
                    if (!v.killed)
                        ADD_FAILURE() << "victim " << i
                                      << ": completion before it was killed: " << cs[k].status.message();
                    ++v.done;
                    if (cs[k].status)
                        ++v.errors;
                    v.what += std::string(v.what.empty() ? "" : ", ") + std::to_string(cs[k].wr_id) + ": " +
                              (cs[k].status ? cs[k].status.message() : "success");
                }
                // Every request completed, at least one in error. The probe itself may
                // succeed: on iWARP a send completes once it has left (siw), so only the
                // receive's flush shows the death there.
                if (v.probed && !v.ended && v.done == v.outstanding && v.errors > 0 &&
                    conns[1 + i]->state() != connection_state::established)
                    v.ended = true;
            }
            return got;
        };
        while (!stop.load()) {
            if (drain() > 0)
                continue;
            for (connection* c : conns)
                if (auto ec = c->request_notify())
                    ADD_FAILURE() << "request_notify: " << ec.message();
            if (drain() > 0)
                continue;
            epoll_event evs[8];
            int n = ::epoll_wait(ep, evs, 8, 10);
            for (int k = 0; k < n; ++k)
                conns[evs[k].data.u64]->ack_notify();
        }
        ::close(ep);
    });
    std::atomic<bool> more{true}, client_over{false};
    std::thread client([&] {
        run_client(healthy, op_kind::write, target_mode::epoll, 1, tag, &more);
        client_over = true;
    });

    const auto overall = clock::now() + 120s;
    auto wait_for = [&](auto&& pred, clock::time_point until) {
        while (!pred() && clock::now() < until)
            std::this_thread::sleep_for(1ms);
        return pred();
    };
    EXPECT_TRUE(wait_for([&] { return healthy.rounds_done > 0; }, overall))
        << "the healthy client never got going";
    for (std::size_t i = 0; i < victims; ++i) {
        pollfd pfd{ready[i], POLLIN, 0};
        char said[256] = {};
        if (::poll(&pfd, 1, 30000) != 1 || ::read(ready[i], said, sizeof said - 1) < 1 || said[0] != 'R') {
            ::kill(kids.pids[i], SIGKILL);
            ::waitpid(kids.pids[i], nullptr, 0);
            kids.pids[i] = -1;
            ADD_FAILURE() << "victim " << i
                          << " moved no data: " << (said[0] == 'E' ? said + 1 : "no word from it");
            break;
        }
        // A moment into its stream of 4 MiB transfers: one is on its way for sure.
        std::this_thread::sleep_for(std::chrono::milliseconds(1 + 3 * i));
        const std::size_t rounds_before = healthy.rounds_done;
        vs[i].killed = true;
        ASSERT_EQ(::kill(kids.pids[i], SIGKILL), 0);
        const auto killed_at = clock::now();
        int status = 0;
        ASSERT_EQ(::waitpid(kids.pids[i], &status, 0), kids.pids[i]);
        kids.pids[i] = -1;
        EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
            << "victim " << i << " ended before it was killed: "
            << (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status)) : "signal");
        EXPECT_TRUE(wait_for([&] { return vs[i].ended.load(); }, killed_at + bound))
            << "victim " << i << ": the target's connection did not end within "
            << std::chrono::duration_cast<std::chrono::milliseconds>(bound).count() << " ms of the kill";
        // Meanwhile, and after, the other client is served.
        EXPECT_TRUE(
            wait_for([&] { return client_over || healthy.rounds_done >= rounds_before + 10; }, overall) &&
            !client_over)
            << "the healthy client stalled after victim " << i << " was killed";
    }
    more = false;
    client.join();
    stop = true;
    server.join();
    for (std::size_t i = 0; i < victims; ++i) {
        auto st = victim_conns[i]->state();
        EXPECT_TRUE(st == connection_state::error || st == connection_state::disconnected)
            << "victim " << i << ": " << to_string(st);
        EXPECT_TRUE(vs[i].ended) << "victim " << i << ": completions " << vs[i].what;
    }
    EXPECT_GT(healthy.rounds_done, 0u);
    std::printf("[ shapes   ] %s: %zu clients killed; the other client did %zu verified rounds meanwhile\n",
                to_string(b_), victims, healthy.rounds_done.load());
}

INSTANTIATE_TEST_SUITE_P(backends, shapes, testing::ValuesIn(selected_backends()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(shapes);

} // namespace
} // namespace rdmx::test
