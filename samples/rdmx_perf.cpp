// rdmx_perf: a perftest-style benchmark (ib_send_lat, ib_write_bw, ...) for both rdmx
// backends, server and client in one binary.
//
//   rdmx_perf --server tcp://0.0.0.0:18515                      # one side
//   rdmx_perf tcp://127.0.0.1:18515 -t write_bw -s 64K -s 1M    # the other
//   rdmx_perf rdma://192.168.77.1:18515 -t send_lat -a --json   # sweep 2 B .. 8 MiB
//
// The client drives everything: it tells the server the test and each message size over a
// second, small control connection (so control messages never land in the receives of
// the measured one), and measures on its side. As perftest does, latency tests report
// half the round trip for send and write, and the whole round trip for read, and signal
// one send or write in --signal-every (perftest's --cq-mod, default 100), waiting only for
// those completions; bandwidth tests signal the same way.
//
// Tests
//   send_lat      ping-pong of sends; each side posts the next receive before it sends
//   write_lat     ping-pong of RDMA writes; each side spins on the last byte of its buffer
//                 and, in polling mode, polls its completions meanwhile (as ucx_perftest's
//                 put_lat progresses its worker): on TCP that lets the spinning thread
//                 serve the incoming write itself (--spin-only: memory only, as perftest)
//   read_lat      one RDMA read at a time
//   send_bw       a window of sends; the server keeps receives posted
//   write_bw      a window of RDMA writes to the server's buffer
//   read_bw       a window of RDMA reads from the server's buffer
//   write_imm_bw  a window of RDMA writes with immediate (each consumes a server receive)
//
// Atomics (docs/atomics.md; 8 B each, -s is 8 or absent), on an 8-byte counter at the
// server: every fetch_add adds 1 and every compare_swap swaps k for k + 1, so that the
// client, the only one changing it, knows each old value and checks every one it is given.
//   fetch_add_lat     one fetch-and-add at a time (as ib_atomic_lat, ucx_perftest ucp_fadd)
//   compare_swap_lat  one compare-and-swap at a time (ib_atomic_lat -A CMP_AND_SWAP, ucp_cswap)
//   fetch_add_bw      a window of --depth fetch-and-adds, --outs of them executing at the
//                     server at once (as ib_atomic_bw -t DEPTH -o OUTS, ucp_fadd -O DEPTH)
//   compare_swap_bw   the same with compare-and-swaps (RC order: each one's compare holds)
// As perftest's atomic and read latencies, the latency is the whole round trip. The server
// sleeps meanwhile, as perftest's; --target-poll makes it busy-poll its connection, as
// ucx_perftest's responder progresses its worker (on TCP its thread then serves them).
//
// Memory windows against a region per object (docs/memory-windows.md, issue 19): what a
// server pays to hand a peer access to one object of -s bytes out of its pool, one at a
// time, the whole operation per sample; the report adds the rate (ops_per_s: operations
// over the measured time). The object is the client's own memory: nothing crosses the
// measured connection in the first two, as a bind and a registration are local.
//   register        register_memory over the object + destroying the region (ibv_reg_mr +
//                   ibv_dereg_mr: the region-key-per-object server's cost)
//   window_bind     post_bind_window over the object in the pool, registered once, and its
//                   completion, then post_invalidate_window and its completion
//   window_send     the object store's round trip (samples/object_store_client.cpp): an
//                   unsignalled bind in front of a send carrying the window's descriptor;
//                   the server answers with a send that revokes it (post_send_invalidate)
//   window_send_local  the same, but the server's reply is a plain send and the client
//                   revokes the window itself (an unsignalled post_invalidate_window after
//                   the reply): what the peer's send-with-invalidate costs or saves
//   register_send   the same round trip with a region per object: register, send its
//                   descriptor, the server answers with a plain send, destroy the region
//   register_send_bind  register_send plus window_send_local's window posts (an unsignalled
//                   bind before the registration, an unsignalled invalidate after the
//                   reply) of a window that is never sent: what those post() calls cost
//
// Many connections (as perftest's -q N, fabtests' fi_multi_ep): -q N on both sides opens N
// measured connections; the bandwidth tests keep a window of --depth on each, -n
// iterations each, served on each side by one thread that polls either N per-connection
// completion queues in turn or, with --shared-cq (both sides), one completion queue they
// all report to. The report adds each side's CPU time per message (getrusage).
#include <CLI/CLI.hpp>

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <rdmx/gpu.hpp>
#include <rdmx/rdmx.hpp>

namespace
{

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// The latency tests' per-iteration timestamp: the cycle counter where there is one, as
/// perftest's get_cycles(). In a QEMU guest a steady_clock read costs about 190 ns and an
/// rdtsc about 40 ns, once per round trip. Ticks become time by a calibration against
/// steady_clock over the whole run (tick_rate), so no CPU frequency is assumed.
std::uint64_t ticks() noexcept
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#else
    return static_cast<std::uint64_t>(clock_type::now().time_since_epoch().count());
#endif
}

/// Microseconds per tick between two (steady_clock, ticks()) readings.
struct tick_rate {
    clock_type::time_point t0 = clock_type::now();
    std::uint64_t k0 = ticks();
    /// Spans at least 10 ms, waiting if need be: a short run's few clock reads (or a
    /// preemption between two of them) must not skew it.
    double us_per_tick() const
    {
        while (clock_type::now() - t0 < 10ms) {
        }
        std::uint64_t k1 = ticks();
        std::chrono::duration<double, std::micro> us = clock_type::now() - t0;
        return k1 > k0 ? us.count() / static_cast<double>(k1 - k0) : 0.0;
    }
};

enum class test : std::uint32_t {
    send_lat,
    write_lat,
    read_lat,
    send_bw,
    write_bw,
    read_bw,
    write_imm_bw,
    fetch_add_lat,
    compare_swap_lat,
    fetch_add_bw,
    compare_swap_bw,
    register_region,
    window_bind,
    window_send,
    window_send_local,
    register_send,
    register_send_bind
};
const std::vector<std::pair<std::string, test>> test_names = {
    {"send_lat", test::send_lat},
    {"write_lat", test::write_lat},
    {"read_lat", test::read_lat},
    {"send_bw", test::send_bw},
    {"write_bw", test::write_bw},
    {"read_bw", test::read_bw},
    {"write_imm_bw", test::write_imm_bw},
    {"fetch_add_lat", test::fetch_add_lat},
    {"compare_swap_lat", test::compare_swap_lat},
    {"fetch_add_bw", test::fetch_add_bw},
    {"compare_swap_bw", test::compare_swap_bw},
    {"register", test::register_region},
    {"window_bind", test::window_bind},
    {"window_send", test::window_send},
    {"window_send_local", test::window_send_local},
    {"register_send", test::register_send},
    {"register_send_bind", test::register_send_bind}};
const char* name_of(test t)
{
    for (auto& [n, v] : test_names)
        if (v == t)
            return n.c_str();
    return "?";
}
/// The window-or-region tests: one operation at a time, sampled as the latency tests.
bool is_object(test t)
{
    return t == test::register_region || t == test::window_bind || t == test::window_send ||
           t == test::window_send_local || t == test::register_send || t == test::register_send_bind;
}
bool is_latency(test t)
{
    return t == test::send_lat || t == test::write_lat || t == test::read_lat || t == test::fetch_add_lat ||
           t == test::compare_swap_lat || is_object(t);
}
/// The tests that bind windows over the pool (registered with access::bind_window for them).
bool uses_windows(test t)
{
    return t == test::window_bind || t == test::window_send || t == test::window_send_local ||
           t == test::register_send_bind;
}
bool is_atomic(test t)
{
    return t == test::fetch_add_lat || t == test::compare_swap_lat || t == test::fetch_add_bw ||
           t == test::compare_swap_bw;
}
/// The tests whose buffers this process never reads or writes itself: the ones --cuda allows.
bool is_bandwidth(test t)
{
    return t == test::send_bw || t == test::write_bw || t == test::read_bw || t == test::write_imm_bw;
}
/// The size of an atomic's operand and of its old value.
constexpr std::size_t atomic_size = 8;
/// As perftest's --cq-mod: request k of total is signalled if it is one in `every`, or the last.
bool signal_at(std::uint64_t k, std::uint64_t total, std::uint32_t every)
{
    return (k + 1) % every == 0 || k + 1 == total;
}

/// What the client asks of the server: one control message, copied as bytes.
struct control {
    enum kind_t : std::uint32_t { hello, ready, start, bye } kind = hello;
    test t = test::send_lat;
    std::uint64_t size = 0;   ///< start: message size; hello: the largest size of the run
    std::uint64_t iters = 0;  ///< start: measured iterations
    std::uint64_t warmup = 0; ///< start: iterations before measuring
    std::uint32_t inline_max = 0;
    std::uint32_t event = 0;             ///< the server waits in event mode too
    std::uint32_t spin_only = 0;         ///< write_lat: the server spins on memory without polling
    std::uint32_t signal_every = 1;      ///< latency: the server's sends / writes, as the client's
    std::uint32_t atomics = 0;           ///< hello: the server's buffer takes atomics (remote_atomic)
    std::uint32_t target_poll = 0;       ///< hello: atomics: the server busy-polls while they run
    std::uint64_t cpu_ns = 0;            ///< -q N, the server's ready after a test: its CPU time in it
    rdmx::remote_buffer::bytes region{}; ///< hello / ready: the sender's data buffer
};

struct options {
    std::string address;
    bool server = false;
    test t = test::send_lat;
    std::vector<std::string> sizes;
    bool sweep = false;
    std::size_t max_size = 8 << 20;
    std::uint64_t iters = 1000;
    std::uint64_t warmup = 100;
    std::uint32_t depth = 128;
    std::uint32_t post_list = 1;
    std::uint32_t outs = 16;          ///< connection_options::max_rd_atomic (perftest's -o, --outs)
    std::uint32_t signal_every = 100; ///< perftest's default CQ moderation (--cq-mod 100)
    std::uint32_t inline_max = 64;
    bool event = false;
    bool spin_only = false;
    bool target_poll = false; ///< atomics: the server busy-polls its connection meanwhile
    std::string cpus;
    bool json = false;
    int timeout_ms = 10000;
    std::uint32_t takeover_check_us = 1000; ///< connection_options::tcp.takeover_check
    std::string congestion;                 ///< connection_options::tcp.congestion
    std::uint32_t qps = 1;                  ///< measured connections (-q)
    bool shared_cq = false;                 ///< -q N: one completion queue for all of them
    bool cuda = false;                      ///< this side's buffer in CUDA device memory
    bool allocate = false;                  ///< this side's buffer from domain::allocate_memory
};

/// --cuda with a test that would touch the buffer with the CPU: refused, naming why.
void check_cuda(const options& o, test t)
{
    if (o.cuda && !is_bandwidth(t))
        throw std::invalid_argument(std::string("--cuda: ") + name_of(t) +
                                    " touches its buffer with the CPU; device memory serves the bandwidth "
                                    "tests only (send_bw, write_bw, write_imm_bw, read_bw)");
}

std::size_t parse_size(const std::string& s)
{
    std::size_t pos = 0;
    unsigned long long v = std::stoull(s, &pos);
    std::string unit = s.substr(pos);
    if (unit == "K" || unit == "k" || unit == "KiB")
        v <<= 10;
    else if (unit == "M" || unit == "m" || unit == "MiB")
        v <<= 20;
    else if (!unit.empty() && unit != "B")
        throw std::invalid_argument("bad size '" + s + "' (use e.g. 8, 64K, 1M)");
    return static_cast<std::size_t>(v);
}

/// Pins this process (and so the threads it creates later, such as the TCP backend's
/// engine) to the CPUs of a taskset-style list: "0", "1,3", "0-1".
void pin_cpus(const std::string& list)
{
    if (list.empty())
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    std::size_t i = 0;
    while (i < list.size()) {
        std::size_t used = 0;
        int lo = std::stoi(list.substr(i), &used);
        int hi = lo;
        i += used;
        if (i < list.size() && list[i] == '-') {
            hi = std::stoi(list.substr(i + 1), &used);
            i += used + 1;
        }
        for (int c = lo; c <= hi; ++c)
            CPU_SET(c, &set);
        if (i < list.size() && list[i] == ',')
            ++i;
    }
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        throw std::runtime_error("sched_setaffinity(" + list + "): " + std::strerror(errno));
}

double cpu_seconds()
{
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru); // the whole process: the TCP engine's thread included
    auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec * 1e-6; };
    return sec(ru.ru_utime) + sec(ru.ru_stime);
}

/// One connection's completion source: busy polling, or sleeping in connection::wait().
class poller
{
public:
    poller(rdmx::connection& c, bool event, std::chrono::milliseconds timeout)
        : c_(c), event_(event), timeout_(timeout)
    {
    }
    /// Up to out.size() completions; throws on an error completion or when nothing
    /// arrives within the timeout (the peer died or the test hung).
    std::size_t get(std::span<rdmx::completion> out)
    {
        clock_type::time_point deadline{};
        for (std::uint32_t spins = 1;; ++spins) {
            if (std::size_t n = event_ ? checked(out, c_.wait(out, 100ms)) : try_get(out))
                return n;
            // The clock only now and then, and not before the first wait: in an emulated
            // guest a clock read costs as much as a poll, and a completion that is already
            // there (the common case in a ping-pong) must not wait behind one. The timeout
            // thus starts at the first look at the clock: 1024 polls or one wait late.
            if (event_ || spins % 1024 == 0) {
                auto now = clock_type::now();
                if (deadline == clock_type::time_point{})
                    deadline = now + timeout_;
                else if (now > deadline)
                    throw std::runtime_error("no completion within the timeout (peer gone?)");
            }
        }
    }
    /// What one poll finds (possibly nothing); throws on an error completion.
    std::size_t try_get(std::span<rdmx::completion> out) { return checked(out, c_.poll(out)); }
    /// Exactly one completion.
    rdmx::completion one()
    {
        rdmx::completion wc;
        get({&wc, 1});
        return wc;
    }

private:
    static std::size_t checked(std::span<const rdmx::completion> out, std::size_t n)
    {
        for (std::size_t i = 0; i < n; ++i)
            if (out[i].status)
                throw std::runtime_error("completion of wr_id " + std::to_string(out[i].wr_id) + ": " +
                                         out[i].status.message());
        return n;
    }

    rdmx::connection& c_;
    bool event_;
    std::chrono::milliseconds timeout_;
};

void check(std::error_code ec, const char* what)
{
    if (ec)
        throw std::runtime_error(std::string(what) + ": " + ec.message());
}

/// Everything one side needs: the measured connection, the control connection, and the
/// registered buffers. The data buffer has two halves, each the largest message size rounded
/// up to whole pages: the first is what the peer writes into or reads from, the second is
/// this side's source or sink.
struct session {
    std::unique_ptr<rdmx::domain> dom;
    std::unique_ptr<rdmx::connection> data, ctl;
    /// -q N: the measured connections (`data` stays empty), and their shared completion
    /// queue with --shared-cq. Declared before `conns`: the queue outlives them anyway.
    std::shared_ptr<rdmx::completion_queue> cq;
    std::vector<std::unique_ptr<rdmx::connection>> conns;
    /// Page-aligned and page-padded, as perftest's buffers: what the peer writes shares no
    /// page with the heap objects this process touches on every operation.
    struct page_buffer {
        struct free_deleter {
            void operator()(std::byte* p) const { std::free(p); }
        };
        static constexpr std::size_t page = 4096;
        /// `size` rounded up to whole pages.
        static constexpr std::size_t padded(std::size_t size) { return (size + page - 1) / page * page; }

        std::unique_ptr<std::byte[], free_deleter> p;
        std::size_t n = 0;
        void assign(std::size_t size)
        {
            p.reset(static_cast<std::byte*>(std::aligned_alloc(page, padded(size))));
            if (!p)
                throw std::bad_alloc();
            std::memset(p.get(), 0, padded(size));
            n = size;
        }
        std::byte* data() const { return p.get(); }
        std::size_t size() const { return n; }
    };
    page_buffer buf;
    std::byte* base = nullptr; ///< buf's bytes, or the region's own (allocate)
    /// --cuda: the buffer in device memory instead (buf then stays empty).
    std::unique_ptr<rdmx::gpu::device_buffer> device_buf;
    bool cuda = false;
    bool allocate = false; ///< the buffer is domain::allocate_memory's (--allocate)
    std::vector<std::byte> ctl_buf;
    std::unique_ptr<rdmx::memory_region> mr, ctl_mr;
    rdmx::remote_buffer peer{}; ///< the first half of the peer's buffer
    /// Where the second half starts. As perftest's halves, a page apart at least, so that
    /// at 2 B the two do not share a cache line: the peer's writes land from the other CPU.
    std::size_t half = 0;
    std::chrono::milliseconds timeout{10000};

    /// The atomic tests' counter at the server (the first 8 bytes of its buffer): what the
    /// client knows it holds between tests (it starts at 0 and only the client changes it).
    std::uint64_t counter = 0;

    std::byte* target() { return base; } // host memory only (not with --cuda)
    std::byte* source() { return base + half; }

    /// `atomics`: the peer may target the buffer with atomics too (only then: a device
    /// without atomics may refuse the right).
    /// `windows`: windows may be bound over it (access::bind_window, only then for the same reason).
    void register_buffers(std::size_t max, bool atomics, bool windows = false)
    {
        half = page_buffer::padded(max);
        auto rights = rdmx::access::local_write | rdmx::access::remote_write | rdmx::access::remote_read;
        if (atomics)
            rights = rights | rdmx::access::remote_atomic;
        if (windows)
            rights = rights | rdmx::access::bind_window;
        if (cuda) {
            device_buf = std::make_unique<rdmx::gpu::device_buffer>(2 * half);
            mr = dom->register_memory(device_buf->data(), 2 * half, rights, rdmx::memory_type::cuda);
            return;
        }
        if (allocate) {
            // Memory the domain allocates: over shm:// the peer maps it and copies itself.
            mr = dom->allocate_memory(2 * half, rights);
            base = mr->data();
            return;
        }
        buf.assign(2 * half);
        base = buf.data();
        mr = dom->register_memory(buf.data(), buf.size(), rights);
    }
    void setup_control()
    {
        ctl_buf.assign(2 * sizeof(control), std::byte{0}); // [0] receive, [1] send
        ctl_mr = dom->register_memory(ctl_buf.data(), ctl_buf.size(), rdmx::access::local_write);
        post_control_recv();
    }
    void post_control_recv()
    {
        rdmx::sge s{ctl_mr.get(), 0, sizeof(control)};
        check(ctl->post_recv({&s, 1}, 0), "post_recv (control)");
    }
    void send_control(const control& m)
    {
        std::memcpy(ctl_buf.data() + sizeof(control), &m, sizeof m);
        rdmx::sge s{ctl_mr.get(), sizeof(control), sizeof(control)};
        check(ctl->post_send({&s, 1}, 1), "post_send (control)");
    }
    /// Waits for the next control message (and the completion of our last one).
    control recv_control(std::chrono::milliseconds timeout)
    {
        poller p(*ctl, true, timeout);
        for (;;) {
            rdmx::completion wc = p.one();
            if (wc.opcode != rdmx::opcode::recv)
                continue; // our own send's completion
            control m;
            std::memcpy(&m, ctl_buf.data(), sizeof m);
            post_control_recv();
            return m;
        }
    }
    /// As recv_control, busy-polling the measured connection meanwhile (the server posts
    /// nothing there when it does this: a poll only progresses it), without a timeout of
    /// its own but the control wait's.
    control recv_control_polling(std::chrono::milliseconds timeout)
    {
        poller p(*ctl, false, timeout), measured(*data, false, timeout);
        rdmx::completion wc[4];
        auto deadline = clock_type::now() + timeout;
        for (std::uint32_t n = 1;; ++n) {
            measured.try_get(wc);
            for (std::size_t i = 0, got = p.try_get(wc); i < got; ++i) {
                if (wc[i].opcode != rdmx::opcode::recv)
                    continue; // our own send's completion
                control m;
                std::memcpy(&m, ctl_buf.data(), sizeof m);
                post_control_recv();
                return m;
            }
            if (n % 4096 == 0 && clock_type::now() > deadline)
                throw std::runtime_error("no control message within the timeout (client gone?)");
        }
    }
};

// ---------------------------------------------------------------------------------------
// Latency tests. `record` gets the time of each measured iteration.

/// Spins until the last byte of [p, p + size) reads `v` (the peer's RDMA write landed:
/// RC writes arrive in order, so the last byte is the last to change), calling `progress`
/// on each turn.
template <class Progress>
void spin_for(std::byte* p, std::size_t size, std::uint8_t v, std::chrono::milliseconds timeout,
              Progress&& progress)
{
    std::atomic_ref<std::byte> last(p[size - 1]);
    auto deadline = clock_type::now() + timeout;
    std::uint32_t n = 0;
    while (last.load(std::memory_order_acquire) != std::byte{v}) {
        progress();
        if (++n % 4096 == 0 && clock_type::now() > deadline)
            throw std::runtime_error("write_lat: the peer's write did not arrive (peer gone?)");
    }
}

/// Runs one side of a latency test; the client (`active`) measures. The server says
/// ready once its first receive is posted.
std::vector<double> run_latency(session& s, test t, std::size_t size, std::uint64_t warmup,
                                std::uint64_t iters, bool active, bool event, bool spin_only,
                                std::uint32_t inline_max, std::uint32_t signal_every)
{
    std::vector<double> samples; // in ticks until the loop ends, then in microseconds
    if (active)                  // the server does not measure
        samples.reserve(iters);
    poller p(*s.data, event, s.timeout);
    const std::uint64_t total = warmup + iters;
    const auto inl =
        size <= inline_max && t != test::read_lat ? rdmx::send_flags::inline_data : rdmx::send_flags::none;
    // As perftest (--cq-mod): sends and writes are signalled one in signal_every (and the
    // last), and only those completions are waited for; a read always is (its completion
    // is the measurement).
    auto signaled = [&](std::uint64_t i) { return t == test::read_lat || signal_at(i, total, signal_every); };
    auto flags = [&](std::uint64_t i) { return signaled(i) ? inl | rdmx::send_flags::signaled : inl; };
    rdmx::sge src{s.mr.get(), s.half, size}; // our source (or read sink)
    rdmx::sge dst{s.mr.get(), 0, size};      // where the peer's sends land
    rdmx::remote_buffer remote = *s.peer.slice(0, size);

    // Waits for `n` completions of any kind (sends, receives, reads), counting those that
    // progress() already found. One array for all the waits: a completion's error_code
    // costs a libstdc++ call to construct.
    int banked = 0;
    rdmx::completion wc[4];
    auto complete = [&](int n) {
        int take = std::min(n, banked);
        banked -= take;
        n -= take;
        while (n > 0)
            n -= static_cast<int>(p.get({wc, static_cast<std::size_t>(std::min(n, 4))}));
    };
    // write_lat, while spinning on memory: poll too (busy-polling mode, unless --spin-only).
    auto progress = [&] {
        if (event || spin_only)
            return;
        banked += static_cast<int>(p.try_get(wc));
    };

    if (t == test::send_lat)
        check(s.data->post_recv({&dst, 1}, 0), "post_recv");
    // A stale sequence byte from an earlier size must not look like this run's first one.
    std::atomic_ref<std::byte>(s.target()[size - 1]).store(std::byte{0});
    if (!active)
        s.send_control({.kind = control::ready});
    // One clock read per iteration, as perftest: the end of one is the start of the next.
    tick_rate rate;
    std::uint64_t t0 = ticks();
    for (std::uint64_t i = 0; i < total; ++i) {
        switch (t) {
        case test::send_lat:
            if (active) {
                check(s.data->post_send({&src, 1}, i, flags(i)), "post_send");
                complete(signaled(i) ? 2 : 1); // the peer's answer (and our send)
                if (i + 1 < total)
                    check(s.data->post_recv({&dst, 1}, i), "post_recv");
            } else {
                complete(1); // the ping; the next receive goes up before we answer
                if (i + 1 < total)
                    check(s.data->post_recv({&dst, 1}, i), "post_recv");
                check(s.data->post_send({&src, 1}, i, flags(i)), "post_send");
                if (signaled(i))
                    complete(1);
            }
            break;
        case test::write_lat: {
            auto seq = static_cast<std::uint8_t>(i % 255 + 1);
            if (!active)
                spin_for(s.target(), size, seq, s.timeout, progress);
            s.source()[size - 1] = std::byte{seq};
            check(s.data->post_write({&src, 1}, remote, i, flags(i)), "post_write");
            if (active)
                spin_for(s.target(), size, seq, s.timeout, progress);
            if (signaled(i))
                complete(1);
            break;
        }
        case test::read_lat:
            check(s.data->post_read({&src, 1}, remote, i, flags(i)), "post_read");
            complete(1);
            break;
        default: break;
        }
        if (active) {
            std::uint64_t t1 = ticks();
            if (i >= warmup)
                samples.push_back(static_cast<double>(t1 - t0));
            t0 = t1;
        }
    }
    if (samples.empty())
        return samples; // the server, which does not measure
    // As perftest: half the round trip for send and write, the whole of a read.
    const double scale = rate.us_per_tick() * (t == test::read_lat ? 1.0 : 0.5);
    for (double& x : samples)
        x *= scale;
    return samples;
}

// ---------------------------------------------------------------------------------------
// Bandwidth tests

struct bw_result {
    double seconds = 0, cpu = 0;
    std::uint64_t messages = 0;
};

/// The client's side of a bandwidth test: keeps up to `depth` requests outstanding,
/// posted in lists of `post_list`, every `signal_every`-th one signalled (and the last).
bw_result run_bw_client(session& s, test t, std::size_t size, std::uint64_t warmup, std::uint64_t iters,
                        std::uint32_t depth, std::uint32_t post_list, std::uint32_t signal_every,
                        std::uint32_t inline_max, bool event)
{
    poller p(*s.data, event, s.timeout);
    const std::uint64_t total = warmup + iters;
    const rdmx::opcode op = t == test::send_bw    ? rdmx::opcode::send
                            : t == test::read_bw  ? rdmx::opcode::read
                            : t == test::write_bw ? rdmx::opcode::write
                                                  : rdmx::opcode::write_with_imm;
    const bool use_inline = size <= inline_max && op != rdmx::opcode::read;
    rdmx::sge src{s.mr.get(), s.half, size};
    rdmx::remote_buffer remote = *s.peer.slice(0, size);
    std::vector<rdmx::work_request> list(post_list);
    std::vector<rdmx::completion> wc(64);

    std::uint64_t posted = 0, completed = 0, measured_from = 0;
    clock_type::time_point t0 = clock_type::now();
    double cpu0 = cpu_seconds();
    bool measuring = warmup == 0;
    while (completed < total) {
        // Fill the window. A request is done when a signalled one at or after it completes.
        while (posted < total && posted - completed + post_list <= depth) {
            std::size_t n = std::min<std::uint64_t>(post_list, total - posted);
            for (std::size_t j = 0; j < n; ++j) {
                std::uint64_t k = posted + j;
                bool signal = signal_at(k, total, signal_every);
                list[j] = {.opcode = op,
                           .wr_id = k,
                           .local = {&src, 1},
                           .remote = remote,
                           .flags = signal ? rdmx::send_flags::signaled : rdmx::send_flags::none,
                           .imm = static_cast<std::uint32_t>(k)};
                if (use_inline)
                    list[j].flags = list[j].flags | rdmx::send_flags::inline_data;
            }
            std::size_t done = 0;
            auto ec = s.data->post({list.data(), n}, &done);
            posted += done;
            if (ec == rdmx::errc::would_block)
                break; // the send queue is full after all: poll first
            check(ec, "post");
        }
        std::size_t got = p.get(wc);
        for (std::size_t i = 0; i < got; ++i)
            completed = std::max(completed, wc[i].wr_id + 1);
        if (!measuring && completed >= warmup) {
            measuring = true;
            measured_from = completed;
            t0 = clock_type::now();
            cpu0 = cpu_seconds();
        }
    }
    std::chrono::duration<double> dt = clock_type::now() - t0;
    return {dt.count(), cpu_seconds() - cpu0, total - measured_from};
}

/// The server's side of send_bw / write_imm_bw: keeps receives posted until `total` arrived.
void run_bw_receiver(session& s, test t, std::size_t size, std::uint64_t total, bool event)
{
    poller p(*s.data, event, s.timeout);
    const std::uint64_t depth = s.data->limits().recv_queue_depth;
    // write_imm needs only the receive slot: its payload goes to the target address.
    rdmx::sge dst{s.mr.get(), 0, t == test::send_bw ? size : 0};
    std::vector<rdmx::recv_request> rr(depth, rdmx::recv_request{.wr_id = 0, .local = {&dst, 1}});
    std::uint64_t posted = std::min(depth, total), received = 0;
    check(s.data->post_recv({rr.data(), posted}), "post_recv");
    s.send_control({.kind = control::ready}); // the client may start
    std::vector<rdmx::completion> wc(64);
    while (received < total) {
        std::size_t got = p.get(wc);
        received += got;
        std::uint64_t more = std::min<std::uint64_t>(got, total - posted);
        if (more > 0) {
            check(s.data->post_recv({rr.data(), more}), "post_recv");
            posted += more;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Atomic tests: the client alone; the server's transport serves them.

/// The old value in the 8-byte sink at `offset` of the client's source half.
std::uint64_t old_value(const session& s, std::size_t offset)
{
    std::uint64_t v = 0;
    std::memcpy(&v, s.base + s.half + offset, sizeof v);
    return v;
}

/// Throws unless atomic number k of a test returned what the counter held before it.
void check_old(const session& s, test t, std::size_t offset, std::uint64_t k)
{
    std::uint64_t got = old_value(s, offset), want = s.counter + k;
    if (got != want)
        throw std::runtime_error(std::string(name_of(t)) + ": atomic " + std::to_string(k) + " returned " +
                                 std::to_string(got) + ", the counter held " + std::to_string(want));
}

/// Atomic k: fetch_add adds 1, compare_swap swaps counter + k for counter + k + 1 (which
/// holds: RC executes a connection's atomics in posting order).
rdmx::work_request atomic_request(const session& s, test t, std::uint64_t k, const rdmx::sge& sink,
                                  const rdmx::remote_buffer& remote, rdmx::send_flags flags)
{
    bool add = t == test::fetch_add_lat || t == test::fetch_add_bw;
    return {.opcode = add ? rdmx::opcode::fetch_add : rdmx::opcode::compare_swap,
            .wr_id = k,
            .local = {&sink, 1},
            .remote = remote,
            .flags = flags,
            .compare_add = add ? 1 : s.counter + k,
            .swap = s.counter + k + 1};
}

/// fetch_add_lat, compare_swap_lat: one atomic at a time, each signalled (its completion
/// is the measurement, as a read's), the whole round trip per sample.
std::vector<double> run_atomic_latency(session& s, test t, std::uint64_t warmup, std::uint64_t iters,
                                       bool event)
{
    std::vector<double> samples;
    samples.reserve(iters);
    poller p(*s.data, event, s.timeout);
    const std::uint64_t total = warmup + iters;
    rdmx::sge sink{s.mr.get(), s.half, atomic_size};
    rdmx::remote_buffer remote = *s.peer.slice(0, atomic_size);
    tick_rate rate;
    std::uint64_t t0 = ticks();
    for (std::uint64_t i = 0; i < total; ++i) {
        rdmx::work_request wr = atomic_request(s, t, i, sink, remote, rdmx::send_flags::signaled);
        check(s.data->post({&wr, 1}), name_of(t));
        p.one();
        check_old(s, t, 0, i); // a few nanoseconds; one clock read per iteration, as perftest
        std::uint64_t t1 = ticks();
        if (i >= warmup)
            samples.push_back(static_cast<double>(t1 - t0));
        t0 = t1;
    }
    s.counter += total;
    const double scale = rate.us_per_tick();
    for (double& x : samples)
        x *= scale;
    return samples;
}

/// fetch_add_bw, compare_swap_bw: up to `depth` atomics outstanding, posted in lists of
/// `post_list`, one in `signal_every` signalled (and the last). Each window slot has its own
/// 8-byte sink, so a signalled atomic's old value is still there when its completion is
/// polled (the next atomic of that slot waits for it) and is checked.
bw_result run_atomic_bw(session& s, test t, std::uint64_t warmup, std::uint64_t iters, std::uint32_t depth,
                        std::uint32_t post_list, std::uint32_t signal_every, bool event)
{
    poller p(*s.data, event, s.timeout);
    const std::uint64_t total = warmup + iters;
    rdmx::remote_buffer remote = *s.peer.slice(0, atomic_size);
    std::vector<rdmx::sge> sinks(depth);
    for (std::uint32_t j = 0; j < depth; ++j)
        sinks[j] = {s.mr.get(), s.half + j * atomic_size, atomic_size};
    std::vector<rdmx::work_request> list(post_list);
    std::vector<rdmx::completion> wc(64);

    std::uint64_t posted = 0, completed = 0, measured_from = 0;
    clock_type::time_point t0 = clock_type::now();
    double cpu0 = cpu_seconds();
    bool measuring = warmup == 0;
    while (completed < total) {
        while (posted < total && posted - completed + post_list <= depth) {
            std::size_t n = std::min<std::uint64_t>(post_list, total - posted);
            for (std::size_t j = 0; j < n; ++j) {
                std::uint64_t k = posted + j;
                list[j] = atomic_request(s, t, k, sinks[k % depth], remote,
                                         signal_at(k, total, signal_every) ? rdmx::send_flags::signaled
                                                                           : rdmx::send_flags::none);
            }
            std::size_t done = 0;
            auto ec = s.data->post({list.data(), n}, &done);
            posted += done;
            if (ec == rdmx::errc::would_block)
                break;
            check(ec, name_of(t));
        }
        std::size_t got = p.get(wc);
        for (std::size_t i = 0; i < got; ++i) {
            check_old(s, t, (wc[i].wr_id % depth) * atomic_size, wc[i].wr_id);
            completed = std::max(completed, wc[i].wr_id + 1);
        }
        if (!measuring && completed >= warmup) {
            measuring = true;
            measured_from = completed;
            t0 = clock_type::now();
            cpu0 = cpu_seconds();
        }
    }
    std::chrono::duration<double> dt = clock_type::now() - t0;
    s.counter += total;
    return {dt.count(), cpu_seconds() - cpu0, total - measured_from};
}

// ---------------------------------------------------------------------------------------
// Memory windows against a region per object: the object is [source(), + size) of the
// client's buffer (the pool, registered once), handed out with these rights.

constexpr rdmx::access object_rights = rdmx::access::remote_read | rdmx::access::remote_write;
/// window_send, register_send: where the request (the object's descriptor) is sent from and
/// the reply lands, in the first half of either side's buffer.
constexpr std::size_t request_offset = 0, reply_offset = 256;
constexpr std::size_t reply_size = 8;
static_assert(sizeof(rdmx::remote_buffer::bytes) <= reply_offset);

/// The samples of one operation per iteration, ticks into microseconds.
struct object_samples {
    std::vector<double> us;
    tick_rate rate;
    std::uint64_t t0 = ticks();
    explicit object_samples(std::uint64_t iters) { us.reserve(iters); }
    void tick(std::uint64_t i, std::uint64_t warmup)
    {
        std::uint64_t t1 = ticks();
        if (i >= warmup)
            us.push_back(static_cast<double>(t1 - t0));
        t0 = t1;
    }
    std::vector<double> done()
    {
        const double scale = rate.us_per_tick();
        for (double& x : us)
            x *= scale;
        return std::move(us);
    }
};

/// Throws unless `wc` has the opcode `want` (the window tests know what completes next).
void expect(const rdmx::completion& wc, rdmx::opcode want, test t)
{
    if (wc.opcode != want)
        throw std::runtime_error(std::string(name_of(t)) + ": completion of wr_id " +
                                 std::to_string(wc.wr_id) + " has opcode " +
                                 std::to_string(static_cast<int>(wc.opcode)) + ", expected " +
                                 std::to_string(static_cast<int>(want)));
}

/// register, window_bind: the client alone, nothing on the wire.
std::vector<double> run_object_local(session& s, test t, std::size_t size, std::uint64_t warmup,
                                     std::uint64_t iters, bool event)
{
    const std::uint64_t total = warmup + iters;
    std::unique_ptr<rdmx::memory_window> w;
    if (t == test::window_bind)
        w = s.dom->allocate_window();
    poller p(*s.data, event, s.timeout);
    object_samples smp(iters);
    for (std::uint64_t i = 0; i < total; ++i) {
        if (t == test::register_region) {
            auto r = s.dom->register_memory(s.source(), size, object_rights);
            if (r->remote(0, size).length != size)
                throw std::runtime_error("register: the region's descriptor does not cover the object");
            r.reset(); // ibv_dereg_mr
        } else {
            check(s.data->post_bind_window(*w, *s.mr, s.half, size, object_rights, 2 * i),
                  "post_bind_window");
            expect(p.one(), rdmx::opcode::bind_window, t);
            check(s.data->post_invalidate_window(*w, 2 * i + 1), "post_invalidate_window");
            expect(p.one(), rdmx::opcode::invalidate_window, t);
        }
        smp.tick(i, warmup);
    }
    return smp.done();
}

/// window_send, window_send_local, register_send, the client: per iteration the object's descriptor goes to
/// the server in a send (behind an unsignalled bind, or after a registration), and the
/// server's reply (revoking the window, or not) ends it (and the region goes). The whole
/// round trip per sample.
std::vector<double> run_object_client(session& s, test t, std::size_t size, std::uint64_t warmup,
                                      std::uint64_t iters, bool event)
{
    const std::uint64_t total = warmup + iters;
    std::unique_ptr<rdmx::memory_window> w;
    if (uses_windows(t))
        w = s.dom->allocate_window();
    const bool send_window = t == test::window_send || t == test::window_send_local;
    poller p(*s.data, event, s.timeout);
    rdmx::sge req{s.mr.get(), request_offset, sizeof(rdmx::remote_buffer::bytes)};
    rdmx::sge rep{s.mr.get(), reply_offset, reply_size};
    rdmx::completion wc[4];
    object_samples smp(iters);
    for (std::uint64_t i = 0; i < total; ++i) {
        std::unique_ptr<rdmx::memory_region> r;
        rdmx::remote_buffer d;
        check(s.data->post_recv({&rep, 1}, i), "post_recv");
        if (w) // Unsignalled, as the object-store client's: the send behind it completes it.
            check(s.data->post_bind_window(*w, *s.mr, s.half, size, object_rights, i, rdmx::send_flags::none),
                  "post_bind_window");
        if (send_window) {
            d = w->remote();
        } else {
            r = s.dom->register_memory(s.source(), size, object_rights);
            d = r->remote(0, size);
        }
        auto bytes = d.serialize();
        std::memcpy(s.base + request_offset, bytes.data(), bytes.size());
        check(s.data->post_send({&req, 1}, i), "post_send");
        bool sent = false, answered = false;
        while (!sent || !answered)
            for (std::size_t k = 0, n = p.get(wc); k < n; ++k) {
                if (wc[k].opcode == rdmx::opcode::send) {
                    sent = true;
                    continue;
                }
                expect(wc[k], rdmx::opcode::recv, t);
                if (t == test::window_send && (!wc[k].with_invalidate || wc[k].invalidated_key != d.key))
                    throw std::runtime_error("window_send: the reply did not revoke the window");
                if (t != test::window_send && wc[k].with_invalidate)
                    throw std::runtime_error(std::string(name_of(t)) + ": the reply revoked a window");
                answered = true;
            }
        // Unsignalled too: the next request's send completes it, before the next bind runs.
        // The last one is waited for: the window must not go with it still queued.
        if (t == test::window_send_local || t == test::register_send_bind) {
            const bool last = i + 1 == total;
            check(s.data->post_invalidate_window(*w, i,
                                                 last ? rdmx::send_flags::signaled : rdmx::send_flags::none),
                  "post_invalidate_window");
            if (last)
                expect(p.one(), rdmx::opcode::invalidate_window, t);
        }
        r.reset(); // register_send: the server is done with the object
        smp.tick(i, warmup);
    }
    return smp.done();
}

/// window_send, register_send, the server: answers each request, revoking the window it
/// names (window_send) or not; says ready once its first receive is posted.
void run_object_server(session& s, test t, std::uint64_t total, bool event)
{
    poller p(*s.data, event, s.timeout);
    rdmx::sge req{s.mr.get(), request_offset, sizeof(rdmx::remote_buffer::bytes)};
    rdmx::sge rep{s.mr.get(), s.half, reply_size};
    check(s.data->post_recv({&req, 1}, 0), "post_recv");
    s.send_control({.kind = control::ready});
    rdmx::completion wc[4];
    std::uint64_t answered = 0, sends_done = 0;
    while (answered < total || sends_done < total)
        for (std::size_t k = 0, n = p.get(wc); k < n; ++k) {
            if (wc[k].opcode != rdmx::opcode::recv) {
                ++sends_done;
                continue;
            }
            auto d =
                rdmx::remote_buffer::parse({s.base + request_offset, sizeof(rdmx::remote_buffer::bytes)});
            if (!d)
                throw std::runtime_error(std::string(name_of(t)) + ": the request holds no descriptor");
            if (++answered < total)
                check(s.data->post_recv({&req, 1}, answered), "post_recv");
            check(t == test::window_send ? s.data->post_send_invalidate({&rep, 1}, d->key, answered)
                                         : s.data->post_send({&rep, 1}, answered),
                  t == test::window_send ? "post_send_invalidate" : "post_send");
        }
}

// ---------------------------------------------------------------------------------------
// Many connections (-q N): N measured connections, one thread per side.

/// The completions of N connections: one shared completion queue (each completion names
/// its connection in `context`), or the N connections' own queues polled in turn.
class multi_poller
{
public:
    multi_poller(std::vector<std::unique_ptr<rdmx::connection>>& conns, rdmx::completion_queue* cq,
                 bool event, std::chrono::milliseconds timeout)
        : conns_(conns), cq_(cq), event_(event), timeout_(timeout)
    {
    }
    std::size_t get(std::span<rdmx::completion> out)
    {
        clock_type::time_point deadline{};
        for (std::uint32_t spins = 1;; ++spins) {
            if (std::size_t n = try_get(out))
                return n;
            if (event_ || spins % 1024 == 0) {
                auto now = clock_type::now();
                if (deadline == clock_type::time_point{})
                    deadline = now + timeout_;
                else if (now > deadline)
                    throw std::runtime_error("no completion within the timeout (peer gone?)");
            }
        }
    }

private:
    std::size_t try_get(std::span<rdmx::completion> out)
    {
        std::size_t n = 0;
        if (cq_) {
            n = event_ ? cq_->wait(out, 100ms) : cq_->poll(out);
        } else {
            // One look at each connection, starting after the last that had something.
            for (std::size_t k = 0; k < conns_.size() && n == 0; ++k) {
                std::size_t i = next_;
                next_ = (next_ + 1) % conns_.size();
                n = conns_[i]->poll(out);
                for (std::size_t j = 0; j < n; ++j)
                    out[j].context = i;
            }
        }
        for (std::size_t i = 0; i < n; ++i)
            if (out[i].status)
                throw std::runtime_error("completion of wr_id " + std::to_string(out[i].wr_id) +
                                         " (connection " + std::to_string(out[i].context) +
                                         "): " + out[i].status.message());
        return n;
    }

    std::vector<std::unique_ptr<rdmx::connection>>& conns_;
    rdmx::completion_queue* cq_;
    bool event_;
    std::chrono::milliseconds timeout_;
    std::size_t next_ = 0;
};

/// The client's side of a bandwidth test on N connections: a window of `depth` on each,
/// `warmup + iters` requests each; the measurement starts once every connection is past
/// its warm-up.
bw_result run_multi_bw_client(session& s, test t, std::size_t size, std::uint64_t warmup, std::uint64_t iters,
                              const options& o)
{
    multi_poller p(s.conns, s.cq.get(), o.event, s.timeout);
    const std::size_t n_conns = s.conns.size();
    const std::uint64_t total = warmup + iters;
    const rdmx::opcode op = t == test::send_bw    ? rdmx::opcode::send
                            : t == test::read_bw  ? rdmx::opcode::read
                            : t == test::write_bw ? rdmx::opcode::write
                                                  : rdmx::opcode::write_with_imm;
    const bool use_inline = size <= o.inline_max && op != rdmx::opcode::read;
    rdmx::sge src{s.mr.get(), s.half, size};
    rdmx::remote_buffer remote = *s.peer.slice(0, size);
    std::vector<rdmx::work_request> list(o.post_list);
    std::vector<rdmx::completion> wc(64);
    std::vector<std::uint64_t> posted(n_conns, 0), completed(n_conns, 0);
    std::uint64_t done_all = 0, warm = 0, measured_from = 0;

    clock_type::time_point t0 = clock_type::now();
    double cpu0 = cpu_seconds();
    bool measuring = warmup == 0;
    while (done_all < total * n_conns) {
        for (std::size_t c = 0; c < n_conns; ++c) {
            while (posted[c] < total && posted[c] - completed[c] + o.post_list <= o.depth) {
                std::size_t n = std::min<std::uint64_t>(o.post_list, total - posted[c]);
                for (std::size_t j = 0; j < n; ++j) {
                    std::uint64_t k = posted[c] + j;
                    list[j] = {.opcode = op,
                               .wr_id = k,
                               .local = {&src, 1},
                               .remote = remote,
                               .flags = signal_at(k, total, o.signal_every) ? rdmx::send_flags::signaled
                                                                            : rdmx::send_flags::none,
                               .imm = static_cast<std::uint32_t>(k)};
                    if (use_inline)
                        list[j].flags = list[j].flags | rdmx::send_flags::inline_data;
                }
                std::size_t done = 0;
                auto ec = s.conns[c]->post({list.data(), n}, &done);
                posted[c] += done;
                if (ec == rdmx::errc::would_block)
                    break;
                check(ec, "post");
            }
        }
        std::size_t got = p.get(wc);
        for (std::size_t i = 0; i < got; ++i) {
            std::size_t c = wc[i].context;
            std::uint64_t now_done = std::max(completed[c], wc[i].wr_id + 1);
            done_all += now_done - completed[c];
            if (completed[c] < warmup && now_done >= warmup)
                ++warm;
            completed[c] = now_done;
        }
        if (!measuring && warm == n_conns) {
            measuring = true;
            measured_from = done_all;
            t0 = clock_type::now();
            cpu0 = cpu_seconds();
        }
    }
    std::chrono::duration<double> dt = clock_type::now() - t0;
    return {dt.count(), cpu_seconds() - cpu0, total * n_conns - measured_from};
}

/// The server's side of send_bw / write_imm_bw on N connections: keeps receives posted on
/// each until `total` arrived on each; returns its CPU seconds.
double run_multi_receiver(session& s, test t, std::size_t size, std::uint64_t total, const options& o)
{
    multi_poller p(s.conns, s.cq.get(), o.event, s.timeout);
    const std::size_t n_conns = s.conns.size();
    const std::uint64_t depth = s.conns[0]->limits().recv_queue_depth;
    rdmx::sge dst{s.mr.get(), 0, t == test::send_bw ? size : 0};
    std::vector<rdmx::recv_request> rr(depth, rdmx::recv_request{.wr_id = 0, .local = {&dst, 1}});
    std::vector<std::uint64_t> posted(n_conns, std::min(depth, total));
    for (auto& c : s.conns)
        check(c->post_recv({rr.data(), posted[0]}), "post_recv");
    double cpu0 = cpu_seconds();
    s.send_control({.kind = control::ready});
    std::vector<rdmx::completion> wc(64);
    std::uint64_t received = 0;
    while (received < total * n_conns) {
        std::size_t got = p.get(wc);
        received += got;
        for (std::size_t i = 0; i < got; ++i) {
            std::size_t c = wc[i].context;
            if (posted[c] < total) {
                check(s.conns[c]->post_recv({rr.data(), 1}), "post_recv");
                ++posted[c];
            }
        }
    }
    return cpu_seconds() - cpu0;
}

// ---------------------------------------------------------------------------------------
// Reporting

struct result {
    test t;
    std::size_t size;
    std::uint64_t iters;
    std::vector<double> lat; ///< latency tests: microseconds, sorted
    bw_result bw;
    double server_cpu = 0; ///< -q N: the server's CPU seconds in the test (0: it had nothing to do)
};

/// -q N: the report gains the connections, the queues and each side's CPU per message.
bool multi(const options& o)
{
    return o.qps > 1 || o.shared_cq;
}

double percentile(const std::vector<double>& v, double q)
{
    if (v.empty())
        return 0;
    auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

/// The reads and atomics a measured connection lets execute at once (-o, clamped by the device).
std::uint32_t max_rd_atomic(const session& s, const options& o)
{
    return s.data            ? s.data->limits().max_rd_atomic
           : s.conns.empty() ? o.outs
                             : s.conns[0]->limits().max_rd_atomic;
}

void print_header(test t, const session& s, const options& o)
{
    std::printf("---------------------------------------------------------------------------------------\n");
    std::printf(" rdmx_perf %s   backend %s (device %s)   %s mode\n", name_of(t),
                rdmx::to_string(s.dom->backend()), s.dom->limits().device_name.c_str(),
                o.event ? "event" : "polling");
    std::printf(" depth %u   post list %u   signal every %u   inline up to %u B   outs %u   cpus %s\n",
                o.depth, o.post_list, o.signal_every, o.inline_max, max_rd_atomic(s, o),
                o.cpus.empty() ? "any" : o.cpus.c_str());
    if (multi(o))
        std::printf(" connections %u   completion queues %s\n", o.qps,
                    o.shared_cq ? "one shared" : "one per connection");
    std::printf("---------------------------------------------------------------------------------------\n");
    if (multi(o))
        std::printf(" %10s %12s %14s %14s %16s %14s %14s\n", "#bytes", "#iterations", "BW[MB/s]",
                    "MsgRate[Mpps]", "CPU[s/GB]", "CPU[us/msg]", "srvCPU[us/msg]");
    else if (is_latency(t))
        std::printf(" %10s %12s %12s %14s %12s %12s\n", "#bytes", "#iterations", "t_min[us]", "t_median[us]",
                    "t_p99[us]", "t_max[us]");
    else
        std::printf(" %10s %12s %14s %14s %16s\n", "#bytes", "#iterations", "BW[MB/s]", "MsgRate[Mpps]",
                    "CPU[s/GB]");
}

void print_row(const result& r, const options& o)
{
    if (multi(o)) {
        double bytes = static_cast<double>(r.bw.messages) * static_cast<double>(r.size);
        double msgs = static_cast<double>(r.bw.messages);
        std::printf(" %10zu %12llu %14.2f %14.4f %16.3f %14.3f %14.3f\n", r.size,
                    static_cast<unsigned long long>(r.iters), bytes / r.bw.seconds / 1e6,
                    msgs / r.bw.seconds / 1e6, r.bw.cpu / (bytes / 1e9), r.bw.cpu / msgs * 1e6,
                    r.server_cpu / msgs * 1e6);
    } else if (is_latency(r.t)) {
        std::printf(" %10zu %12llu %12.2f %14.2f %12.2f %12.2f\n", r.size,
                    static_cast<unsigned long long>(r.iters), r.lat.front(), percentile(r.lat, 0.5),
                    percentile(r.lat, 0.99), r.lat.back());
    } else {
        double bytes = static_cast<double>(r.bw.messages) * static_cast<double>(r.size);
        std::printf(" %10zu %12llu %14.2f %14.4f %16.3f\n", r.size, static_cast<unsigned long long>(r.iters),
                    bytes / r.bw.seconds / 1e6, static_cast<double>(r.bw.messages) / r.bw.seconds / 1e6,
                    r.bw.cpu / (bytes / 1e9));
    }
    std::fflush(stdout);
}

void print_json(const std::vector<result>& rs, const session& s, const options& o)
{
    std::printf("{\"tool\": \"rdmx_perf\", \"backend\": \"%s\", \"device\": \"%s\", \"mode\": \"%s\", "
                "\"depth\": %u, \"post_list\": %u, \"signal_every\": %u, \"inline\": %u, \"outs\": %u, "
                "\"cpus\": \"%s\", "
                "\"units\": {\"latency\": \"us\", \"bandwidth\": \"MB/s (1e6 B/s)\", \"cpu\": \"s per GB "
                "(1e9 B)\"},\n"
                " \"results\": [\n",
                rdmx::to_string(s.dom->backend()), s.dom->limits().device_name.c_str(),
                o.event ? "event" : "polling", o.depth, o.post_list, o.signal_every, o.inline_max,
                max_rd_atomic(s, o), o.cpus.c_str());
    for (std::size_t i = 0; i < rs.size(); ++i) {
        const result& r = rs[i];
        std::printf("  {\"test\": \"%s\", \"size\": %zu, \"iterations\": %llu, ", name_of(r.t), r.size,
                    static_cast<unsigned long long>(r.iters));
        if (multi(o)) {
            double bytes = static_cast<double>(r.bw.messages) * static_cast<double>(r.size);
            double msgs = static_cast<double>(r.bw.messages);
            std::printf("\"connections\": %u, \"shared_cq\": %s, \"mb_per_s\": %.2f, \"msg_per_s\": %.0f, "
                        "\"cpu_s_per_gb\": %.4f, \"cpu_us_per_msg\": %.4f, \"server_cpu_us_per_msg\": %.4f, "
                        "\"seconds\": %.6f}",
                        o.qps, o.shared_cq ? "true" : "false", bytes / r.bw.seconds / 1e6,
                        msgs / r.bw.seconds, r.bw.cpu / (bytes / 1e9), r.bw.cpu / msgs * 1e6,
                        r.server_cpu / msgs * 1e6, r.bw.seconds);
        } else if (is_latency(r.t)) {
            // The mean too: fi_pingpong reports only that (its time over its transfers).
            const double sum = std::accumulate(r.lat.begin(), r.lat.end(), 0.0);
            std::printf("\"min_us\": %.3f, \"median_us\": %.3f, \"mean_us\": %.3f, \"p99_us\": %.3f, "
                        "\"max_us\": %.3f",
                        r.lat.front(), percentile(r.lat, 0.5), sum / static_cast<double>(r.lat.size()),
                        percentile(r.lat, 0.99), r.lat.back());
            // The window tests' rate: their operations over the measured time (samples are
            // back to back, so their sum is that time).
            if (is_object(r.t))
                std::printf(", \"ops_per_s\": %.0f",
                            sum > 0 ? static_cast<double>(r.lat.size()) / (sum * 1e-6) : 0.0);
            std::printf("}");
        } else {
            double bytes = static_cast<double>(r.bw.messages) * static_cast<double>(r.size);
            std::printf("\"mb_per_s\": %.2f, \"msg_per_s\": %.0f, \"cpu_s_per_gb\": %.4f, \"seconds\": %.6f}",
                        bytes / r.bw.seconds / 1e6, static_cast<double>(r.bw.messages) / r.bw.seconds,
                        r.bw.cpu / (bytes / 1e9), r.bw.seconds);
        }
        std::printf("%s\n", i + 1 < rs.size() ? "," : "");
    }
    std::printf(" ]}\n");
}

rdmx::connection_options connection_opts(const options& o)
{
    rdmx::connection_options c;
    c.send_queue_depth = o.depth;
    // Receives: twice the sender's window, so that reposting never falls behind by a
    // whole window (the sender would see receiver-not-ready retries).
    c.recv_queue_depth = 2 * o.depth;
    c.max_inline = o.inline_max;
    c.max_rd_atomic = o.outs;
    c.timeout = std::chrono::milliseconds(o.timeout_ms);
    c.tcp.takeover_check = std::chrono::microseconds(o.takeover_check_us);
    c.tcp.congestion = o.congestion;
    return c;
}

/// -q N: the options of measured connection i, on the shared completion queue if there is one.
rdmx::connection_options multi_opts(const options& o, session& s, std::size_t i)
{
    rdmx::connection_options c = connection_opts(o);
    if (o.shared_cq && !s.cq)
        s.cq = s.dom->create_completion_queue(
            {.depth = o.qps * (c.send_queue_depth + 1 + c.recv_queue_depth)}); // + 1: the goodbye
    c.send_cq = s.cq;
    c.recv_cq = s.cq;
    c.context = i;
    return c;
}

// ---------------------------------------------------------------------------------------

int run_server(const options& o)
{
    session s;
    s.cuda = o.cuda;
    s.allocate = o.allocate;
    s.timeout = std::chrono::milliseconds(o.timeout_ms);
    s.dom = rdmx::domain::open(o.address);
    auto lst = s.dom->listen(o.address);
    std::fprintf(stderr, "rdmx_perf server: listening on %s (backend %s), port %u\n", o.address.c_str(),
                 rdmx::to_string(s.dom->backend()), lst->port());
    // The client connects twice: the measured connection first, then the control one.
    auto accept = [&](const rdmx::connection_options& co) {
        for (;;)
            if (auto req = lst->get_request(1s))
                return req->accept(co);
    };
    if (multi(o))
        for (std::uint32_t i = 0; i < o.qps; ++i)
            s.conns.push_back(accept(multi_opts(o, s, i)));
    else
        s.data = accept(connection_opts(o));
    s.ctl = accept(connection_opts(o));
    s.setup_control();
    bool event = false, spin_only = false, target_poll = false;
    std::optional<control> next; // the message a busy-polling wait already received
    for (;;) {
        control m = next ? *std::exchange(next, std::nullopt) : s.recv_control(std::chrono::hours(24));
        switch (m.kind) {
        case control::hello: {
            s.register_buffers(m.size, m.atomics != 0);
            s.peer = *rdmx::remote_buffer::parse(m.region);
            event = m.event != 0;
            spin_only = m.spin_only != 0;
            target_poll = m.target_poll != 0;
            control r{.kind = control::ready};
            r.region = s.mr->remote(0, m.size).serialize();
            s.send_control(r);
            break;
        }
        case control::start: {
            check_cuda(o, m.t);
            // Receives must be posted before the client starts: the test functions say
            // ready once they are.
            const std::uint64_t total = m.warmup + m.iters;
            if (multi(o)) {
                // Receives first (the test says ready); then the CPU it took, for the report.
                double cpu = m.t == test::send_bw || m.t == test::write_imm_bw
                                 ? run_multi_receiver(s, m.t, m.size, total, o)
                                 : (s.send_control({.kind = control::ready}), 0.0);
                control done{.kind = control::ready};
                done.cpu_ns = static_cast<std::uint64_t>(cpu * 1e9);
                s.recv_control(s.timeout); // the client is done: its "start" of the report
                s.send_control(done);
            } else if (m.t == test::send_lat || m.t == test::write_lat)
                run_latency(s, m.t, m.size, m.warmup, m.iters, false, event, spin_only, m.inline_max,
                            std::max(1u, m.signal_every));
            else if (m.t == test::send_bw || m.t == test::write_imm_bw)
                run_bw_receiver(s, m.t, m.size, total, event);
            else if (m.t == test::window_send || m.t == test::window_send_local ||
                     m.t == test::register_send || m.t == test::register_send_bind)
                run_object_server(s, m.t, total, event);
            else if (is_atomic(m.t) && target_poll) {
                // On TCP this thread's polls then serve the atomics, as ucx_perftest's
                // responder progresses its worker (the engine thread otherwise).
                s.send_control({.kind = control::ready});
                next = s.recv_control_polling(std::chrono::hours(24));
            } else // write_bw, read_bw, read_lat, atomics: nothing to do, the transport serves them
                s.send_control({.kind = control::ready});
            break;
        }
        case control::bye: return 0;
        default: throw std::runtime_error("unexpected control message");
        }
    }
}

int run_client(const options& o)
{
    std::vector<std::size_t> sizes;
    if (o.sweep)
        for (std::size_t v = 2; v <= o.max_size; v *= 2)
            sizes.push_back(v);
    for (auto& str : o.sizes)
        sizes.push_back(parse_size(str));
    if (sizes.empty())
        sizes.push_back(is_atomic(o.t) ? atomic_size : is_object(o.t) ? 4096 : is_latency(o.t) ? 2 : 65536);
    std::size_t largest = *std::max_element(sizes.begin(), sizes.end());
    if (*std::min_element(sizes.begin(), sizes.end()) < 1)
        throw std::invalid_argument("sizes must be at least 1 byte");
    if (is_atomic(o.t) && (sizes.size() != 1 || sizes[0] != atomic_size))
        throw std::invalid_argument(std::string(name_of(o.t)) + ": atomics are 8 bytes (-s 8 or no -s)");

    check_cuda(o, o.t);
    session s;
    s.cuda = o.cuda;
    s.allocate = o.allocate;
    s.timeout = std::chrono::milliseconds(o.timeout_ms);
    s.dom = rdmx::domain::open(o.address);
    if (is_atomic(o.t) && !s.dom->limits().atomics) // siw: atomic_cap is IBV_ATOMIC_NONE
        throw std::runtime_error(std::string(name_of(o.t)) + ": device " + s.dom->limits().device_name +
                                 " has no atomics (device_limits::atomics)");
    if (uses_windows(o.t) && !s.dom->limits().memory_windows) // siw: no type 2 windows
        throw std::runtime_error(std::string(name_of(o.t)) + ": device " + s.dom->limits().device_name +
                                 " has no memory windows (device_limits::memory_windows)");
    auto co = connection_opts(o);
    if (multi(o))
        for (std::uint32_t i = 0; i < o.qps; ++i)
            s.conns.push_back(s.dom->connect(o.address, multi_opts(o, s, i)));
    else
        s.data = s.dom->connect(o.address, co);
    s.ctl = s.dom->connect(o.address, co);
    s.setup_control();
    // Atomics: the client's half holds a sink per window slot.
    if (is_atomic(o.t))
        largest = std::max<std::size_t>(largest, std::size_t{o.depth} * atomic_size);
    s.register_buffers(largest, is_atomic(o.t), uses_windows(o.t));

    control hello{.kind = control::hello,
                  .size = largest,
                  .event = o.event ? 1u : 0u,
                  .spin_only = o.spin_only ? 1u : 0u,
                  .atomics = is_atomic(o.t) ? 1u : 0u,
                  .target_poll = o.target_poll ? 1u : 0u};
    hello.region = s.mr->remote(0, largest).serialize();
    s.send_control(hello);
    control r = s.recv_control(s.timeout);
    s.peer = *rdmx::remote_buffer::parse(r.region);

    if (!o.json)
        print_header(o.t, s, o);
    std::vector<result> results;
    for (std::size_t size : sizes) {
        s.send_control({.kind = control::start,
                        .t = o.t,
                        .size = size,
                        .iters = o.iters,
                        .warmup = o.warmup,
                        .inline_max = o.inline_max,
                        .signal_every = o.signal_every});
        s.recv_control(s.timeout); // ready: the server's receives are posted
        result res{.t = o.t, .size = size, .iters = o.iters, .lat = {}, .bw = {}};
        if (multi(o)) {
            res.bw = run_multi_bw_client(s, o.t, size, o.warmup, o.iters, o);
            // Tell the server the test is over; it answers with its CPU time.
            s.send_control({.kind = control::start, .t = o.t, .size = size});
            res.server_cpu = static_cast<double>(s.recv_control(s.timeout).cpu_ns) * 1e-9;
        } else if (o.t == test::fetch_add_lat || o.t == test::compare_swap_lat) {
            res.lat = run_atomic_latency(s, o.t, o.warmup, o.iters, o.event);
            std::sort(res.lat.begin(), res.lat.end());
        } else if (o.t == test::fetch_add_bw || o.t == test::compare_swap_bw) {
            res.bw = run_atomic_bw(s, o.t, o.warmup, o.iters, o.depth, o.post_list, o.signal_every, o.event);
        } else if (o.t == test::register_region || o.t == test::window_bind) {
            res.lat = run_object_local(s, o.t, size, o.warmup, o.iters, o.event);
            std::sort(res.lat.begin(), res.lat.end());
        } else if (o.t == test::window_send || o.t == test::window_send_local || o.t == test::register_send ||
                   o.t == test::register_send_bind) {
            res.lat = run_object_client(s, o.t, size, o.warmup, o.iters, o.event);
            std::sort(res.lat.begin(), res.lat.end());
        } else if (is_latency(o.t)) {
            res.lat = run_latency(s, o.t, size, o.warmup, o.iters, true, o.event, o.spin_only, o.inline_max,
                                  o.signal_every);
            std::sort(res.lat.begin(), res.lat.end());
        } else {
            res.bw = run_bw_client(s, o.t, size, o.warmup, o.iters, o.depth, o.post_list, o.signal_every,
                                   o.inline_max, o.event);
        }
        if (!o.json)
            print_row(res, o);
        results.push_back(std::move(res));
    }
    s.send_control({.kind = control::bye});
    if (o.json)
        print_json(results, s, o);
    // Let the bye reach the server before the connection goes.
    poller(*s.ctl, true, s.timeout).one();
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"rdmx_perf: perftest-style latency and bandwidth tests for rdmx (verbs and TCP backends).\n"
                 "Start the server with --server, then the client with the same address."};
    options o;
    std::string test_name = "send_lat";
    app.add_option(
           "address", o.address,
           "rdma://IP:PORT, tcp://IP:PORT, shm://NAME:PORT or auto://IP:PORT (server: where to listen)")
        ->required();
    app.add_flag("--server", o.server, "serve one client run, then exit");
    std::vector<std::string> all_tests;
    for (auto& [n, v] : test_names)
        all_tests.push_back(n);
    app.add_option("-t,--test", test_name, "test to run")
        ->check(CLI::IsMember(all_tests))
        ->capture_default_str();
    app.add_option("-s,--size", o.sizes, "message size, repeatable (suffixes K, M): -s 8 -s 64K -s 1M");
    app.add_flag("-a,--all", o.sweep, "sweep sizes 2 B .. --max-size in powers of two");
    app.add_option("--max-size", o.max_size, "largest size of the sweep")->capture_default_str();
    app.add_option("-n,--iters", o.iters, "measured iterations per size")->capture_default_str();
    app.add_option("-w,--warmup", o.warmup, "iterations before measuring")->capture_default_str();
    app.add_option("-d,--depth", o.depth, "send queue depth = bandwidth window")
        ->capture_default_str()
        ->check(CLI::Range(1u, 16384u));
    app.add_option("-l,--post-list", o.post_list, "requests per post() call (one doorbell)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 1024u));
    app.add_option("-c,--signal-every", o.signal_every,
                   "signal one request in N (sends and writes, latency tests too; at most --depth; as "
                   "perftest's --cq-mod)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 16384u));
    app.add_option("-o,--outs", o.outs,
                   "reads and atomics executing at the peer at once, both sides (connection_options::"
                   "max_rd_atomic, clamped to the device's; as perftest's -o, --outs)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 65536u));
    app.add_option("-I,--inline", o.inline_max, "send payloads up to this size inline")
        ->capture_default_str();
    app.add_flag("-e,--event", o.event, "sleep on the completion channel instead of busy polling");
    app.add_flag(
        "--spin-only", o.spin_only,
        "write_lat: spin on memory without polling meanwhile (as perftest; default polls, as ucx_perftest)");
    app.add_flag("--target-poll", o.target_poll,
                 "atomics: the server busy-polls its connection while they run (as ucx_perftest's "
                 "responder; on TCP its thread then serves them; default: it sleeps, as perftest's)");
    app.add_option("--cpu", o.cpus, "pin to these CPUs (taskset list: 0 | 0,1 | 0-1)");
    app.add_flag(
        "--allocate", o.allocate,
        "this side's buffer from domain::allocate_memory (shm://: the peer maps it and copies itself)");
    app.add_flag("--cuda", o.cuda,
                 "this side's buffer in CUDA device memory (device 0; the bandwidth tests only)");
    app.add_flag("--json", o.json, "print one JSON document instead of the table");
    app.add_option("--timeout-ms", o.timeout_ms, "bound on connecting and on every wait")
        ->capture_default_str();
    app.add_option("--takeover-check-us", o.takeover_check_us,
                   "TCP: how often the engine checks that a busy-polling side still calls (each "
                   "check wakes it on that side's CPU; a longer one lowers the latency tail)")
        ->capture_default_str()
        ->check(CLI::Range(100u, 1000000u));
    app.add_option("--tcp-congestion", o.congestion,
                   "TCP: this side's congestion control (cubic, reno, bbr, ...; default: the "
                   "system's net.ipv4.tcp_congestion_control)");
    app.add_option("-q,--connections", o.qps,
                   "measured connections, both sides (as perftest -q); bandwidth tests only")
        ->capture_default_str()
        ->check(CLI::Range(1u, 65536u));
    app.add_flag("--shared-cq", o.shared_cq, "-q N: one completion queue for all of them (both sides)");
    CLI11_PARSE(app, argc, argv);
    for (auto& [n, v] : test_names)
        if (n == test_name)
            o.t = v;
    o.signal_every = std::min(o.signal_every, o.depth); // a full window must hold a signalled one
    // The server learns the test from its client (its -t is the default, send_lat).
    if (!o.server && multi(o) && (is_latency(o.t) || is_atomic(o.t))) {
        std::fprintf(stderr,
                     "rdmx_perf: -q and --shared-cq are for the send, write and read bandwidth tests\n");
        return 2;
    }
    if (multi(o) && o.event && !o.shared_cq) {
        std::fprintf(stderr, "rdmx_perf: -q N with -e needs --shared-cq (one fd to sleep on)\n");
        return 2;
    }
    if (o.post_list > o.depth) {
        std::fprintf(stderr, "rdmx_perf: --post-list must not exceed --depth\n");
        return 2;
    }
    try {
        pin_cpus(o.cpus);
        return o.server ? run_server(o) : run_client(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rdmx_perf %s: %s\n", o.server ? "server" : "client", e.what());
        return 1;
    }
}
