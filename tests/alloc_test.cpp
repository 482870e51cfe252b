// The hot path allocates nothing: global operator new is replaced by a counting version,
// and after a warm-up many operations of every kind (send/recv, write, write_imm, read,
// atomics, windows, endpoints; small and large; single requests and post lists; polling
// and event mode) must leave the count at zero. It counts every thread while the window is
// open, so the TCP backend's engine threads (they carry the data) are held to the same
// promise as the caller. This is a count, never a timing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/test_util.hpp"

namespace
{

std::atomic<bool> counting{false};
std::atomic<std::uint64_t> allocations{0};
std::atomic<std::size_t> last_size{0};
// The first failure inside the window, kept without allocating and reported after it.
std::error_code first_error;
std::uint64_t first_error_wr_id = 0;

void* counted_alloc(std::size_t size, std::size_t align)
{
    if (counting.load(std::memory_order_relaxed)) {
        allocations.fetch_add(1, std::memory_order_relaxed);
        last_size.store(size, std::memory_order_relaxed);
    }
    if (size == 0)
        size = 1;
    void* p = align <= alignof(std::max_align_t)
                  ? std::malloc(size)
                  : std::aligned_alloc(align, (size + align - 1) / align * align);
    return p;
}

// Out of line: GCC would otherwise see free() applied to what operator new returned
// (after inlining) and warn about a mismatch that is, here, by design.
[[gnu::noinline]] void release(void* p) noexcept
{
    std::free(p);
}

} // namespace

// Every replaceable form, so that no allocation slips past through a variant. The matching
// deletes free with std::free, as libstdc++'s own do.
void* operator new(std::size_t n)
{
    if (void* p = counted_alloc(n, 0))
        return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n)
{
    return ::operator new(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept
{
    return counted_alloc(n, 0);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept
{
    return counted_alloc(n, 0);
}
void* operator new(std::size_t n, std::align_val_t a)
{
    if (void* p = counted_alloc(n, static_cast<std::size_t>(a)))
        return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a)
{
    return ::operator new(n, a);
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept
{
    return counted_alloc(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept
{
    return counted_alloc(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept
{
    release(p);
}
void operator delete[](void* p) noexcept
{
    release(p);
}
void operator delete(void* p, std::size_t) noexcept
{
    release(p);
}
void operator delete[](void* p, std::size_t) noexcept
{
    release(p);
}
void operator delete(void* p, std::align_val_t) noexcept
{
    release(p);
}
void operator delete[](void* p, std::align_val_t) noexcept
{
    release(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept
{
    release(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept
{
    release(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept
{
    release(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept
{
    release(p);
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept
{
    release(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept
{
    release(p);
}

namespace rdmx::test
{
namespace
{

bool failed(std::error_code ec) noexcept
{
    if (ec && !first_error)
        first_error = ec;
    return static_cast<bool>(ec);
}

class allocation : public pair_fixture
{
};

/// Polls until `n` completions arrived (busy, or in event mode with wait()); false on an
/// error completion or after 30 s. Fixed arrays only: it runs inside the counted window.
bool drain(connection& c, std::size_t n, bool event_mode = false)
{
    completion wc[32];
    auto deadline = std::chrono::steady_clock::now() + 30s;
    while (n > 0) {
        std::span<completion> out{wc, std::min<std::size_t>(32, n)};
        std::size_t got = event_mode ? c.wait(out, 100ms) : c.poll(out);
        for (std::size_t i = 0; i < got; ++i)
            if (wc[i].status) {
                first_error = wc[i].status;
                first_error_wr_id = wc[i].wr_id;
                return false;
            }
        n -= got;
        if (got == 0 && std::chrono::steady_clock::now() > deadline) {
            first_error = errc::timed_out;
            return false;
        }
    }
    return true;
}

/// One round of every operation kind. Returns false (never throws, never allocates) if
/// any post or completion failed.
struct workload {
    connection& client;
    connection& server;
    memory_region& src;                  ///< client: source of sends and writes, sink of reads
    memory_region& dst;                  ///< server: receive buffers and one-sided target
    std::size_t large;                   ///< bytes of the large transfers
    bool inline_ok;                      ///< the connection allows 8-byte inline sends
    bool imm_ok = true;                  ///< the device has write with immediate (not iWARP: sends instead)
    shared_receive_queue* srq = nullptr; ///< the server's receives go here (connection_options::srq)

    static constexpr std::size_t list = 8; ///< post-list length
    static constexpr std::size_t small = 8;

    bool round(bool event_mode)
    {
        remote_buffer target = dst.remote();
        // Receives for everything that consumes one this round: list small sends, list
        // small write_imm, one large send, one large write_imm.
        constexpr std::size_t nrecv = 2 * list + 2;
        sge rs[nrecv];
        recv_request rr[nrecv];
        for (std::size_t i = 0; i < nrecv; ++i) {
            rs[i] = {&dst, 0, large};
            rr[i] = {.wr_id = 1000 + i, .local = {&rs[i], 1}};
        }
        if (failed(srq ? srq->post_recv(rr) : server.post_recv(rr)))
            return false;

        // Small: post lists of sends (inline), writes, write_imms and reads, the last one
        // of each list signalled (selective signalling).
        sge ss[list];
        work_request w[list];
        const opcode ops[] = {opcode::send, opcode::write, imm_ok ? opcode::write_with_imm : opcode::send,
                              opcode::read};
        std::size_t client_completions = 0;
        for (opcode op : ops) {
            for (std::size_t i = 0; i < list; ++i) {
                ss[i] = {&src, i * small, small};
                w[i] = {.opcode = op,
                        .wr_id = i,
                        .local = {&ss[i], 1},
                        .remote = *target.slice(i * small, small),
                        .flags = i + 1 == list ? send_flags::signaled : send_flags::none,
                        .imm = static_cast<std::uint32_t>(i)};
                if (op == opcode::send && inline_ok)
                    w[i].flags = w[i].flags | send_flags::inline_data;
            }
            if (failed(client.post(w)))
                return false;
            ++client_completions;
        }
        // Large: one of each, all signalled, as single posts.
        sge ls{&src, 0, large};
        if (failed(client.post_send({&ls, 1}, 1)) || failed(client.post_write({&ls, 1}, target, 2)) ||
            failed(imm_ok ? client.post_write_imm({&ls, 1}, target, 7, 3) : client.post_send({&ls, 1}, 3)) ||
            failed(client.post_read({&ls, 1}, target, 4)))
            return false;
        client_completions += 4;
        return drain(client, client_completions, event_mode) && drain(server, nrecv, event_mode);
    }
};

TEST_P(allocation, steady_state_data_path_allocates_nothing)
{
    connection_options opts;
    opts.send_queue_depth = 64;
    opts.recv_queue_depth = 64;
    auto p = connect_pair(opts);
    // Soft-RoCE in an emulated guest moves ~25 MB/s: keep its large transfers and rounds
    // small enough for a few seconds. On TCP 4 MiB exceeds the per-post send budget (1 MiB)
    // and the socket buffer, so the engine's hand-over path is exercised too.
    const bool tcp = tcp_engine(b_);
    const std::size_t large = tcp ? (4u << 20) : (256u << 10);
    const int rounds = tcp ? 100 : 20;
    std::vector<std::byte> a(large), b(large);
    auto src = client_dom_->register_memory(a.data(), a.size(), access::local_write);
    auto dst = server_dom_->register_memory(b.data(), b.size(),
                                            access::local_write | access::remote_write | access::remote_read);
    workload wl{*p.client,
                *p.server,
                *src,
                *dst,
                large,
                p.client->limits().max_inline >= workload::small,
                server_dom_->limits().write_with_imm};

    // Warm-up: first use of rings, reactor registrations, asio's per-thread handler caches.
    for (int i = 0; i < 5; ++i)
        ASSERT_TRUE(wl.round(i % 2 == 1)) << "warm-up round " << i << " failed: " << first_error.message()
                                          << " (wr_id " << first_error_wr_id << ")";

    allocations = 0;
    counting = true;
    bool ok = true;
    int done = 0;
    for (; done < rounds && ok; ++done)
        ok = wl.round(done % 2 == 1); // odd rounds in event mode (connection::wait)
    counting = false;

    ASSERT_TRUE(ok) << "round " << done << " failed: " << first_error.message() << " (wr_id "
                    << first_error_wr_id << ")";
    EXPECT_EQ(allocations.load(), 0u)
        << "heap allocations in " << rounds << " rounds of steady-state operations (last size "
        << last_size.load() << " B)";
}

/// drain() for a shared completion queue: `n` completions, each of one of `conns`.
bool drain(completion_queue& q, std::size_t n, bool event_mode, connection* const* conns, std::size_t nconns)
{
    completion wc[32];
    auto deadline = std::chrono::steady_clock::now() + 30s;
    while (n > 0) {
        std::span<completion> out{wc, std::min<std::size_t>(32, n)};
        std::size_t got = event_mode ? q.wait(out, 100ms) : q.poll(out);
        for (std::size_t i = 0; i < got; ++i) {
            bool known = false;
            for (std::size_t k = 0; k < nconns; ++k)
                known = known || (wc[i].conn == conns[k] && wc[i].context == k + 1);
            if (wc[i].status || !known) {
                first_error = wc[i].status ? wc[i].status : make_error_code(errc::invalid_argument);
                first_error_wr_id = wc[i].wr_id;
                return false;
            }
        }
        n -= got;
        if (got == 0 && std::chrono::steady_clock::now() > deadline) {
            first_error = errc::timed_out;
            return false;
        }
    }
    return true;
}

// Polling a shared completion queue (and routing each completion to its connection's
// accounting) allocates nothing either, busy or in event mode.
TEST_P(allocation, polling_a_shared_completion_queue_allocates_nothing)
{
    constexpr std::size_t nconn = 2, msgs = 8, size = 256;
    auto cq = server_dom_->create_completion_queue({.depth = 256});
    std::unique_ptr<connection> client[nconn], server[nconn];
    for (std::size_t i = 0; i < nconn; ++i) {
        connection_options sopts;
        sopts.send_queue_depth = sopts.recv_queue_depth = 32;
        sopts.send_cq = sopts.recv_cq = cq;
        sopts.context = i + 1;
        connection_options copts;
        copts.send_queue_depth = copts.recv_queue_depth = 32;
        auto accepted = std::async(std::launch::async, [&] {
            auto req = listener_->get_request(10s);
            return req ? req->accept(sopts) : nullptr;
        });
        client[i] = client_dom_->connect(server_address(), copts);
        server[i] = accepted.get();
        ASSERT_NE(server[i], nullptr);
    }
    connection* conns[nconn] = {server[0].get(), server[1].get()};
    std::vector<std::byte> a(msgs * size), b(nconn * msgs * size), c(nconn * size);
    auto amr = client_dom_->register_memory(a.data(), a.size(), access::local_write);
    auto bmr = server_dom_->register_memory(b.data(), b.size(), access::local_write);
    auto cmr = client_dom_->register_memory(c.data(), c.size(), access::local_write | access::remote_write);

    auto round = [&](bool event_mode) {
        for (std::size_t i = 0; i < nconn; ++i) {
            sge rs[msgs];
            recv_request rr[msgs];
            for (std::size_t k = 0; k < msgs; ++k) {
                rs[k] = {bmr.get(), (i * msgs + k) * size, size};
                rr[k] = {.wr_id = k, .local = {&rs[k], 1}};
            }
            if (failed(server[i]->post_recv(rr)))
                return false;
        }
        for (std::size_t i = 0; i < nconn; ++i)
            for (std::size_t k = 0; k < msgs; ++k) {
                sge ss{amr.get(), k * size, size};
                if (failed(client[i]->post_send({&ss, 1}, k)))
                    return false;
            }
        if (!drain(*cq, nconn * msgs, event_mode, conns, nconn))
            return false;
        for (std::size_t i = 0; i < nconn; ++i) {
            sge ws{bmr.get(), 0, size};
            if (failed(server[i]->post_write({&ws, 1}, *cmr->remote().slice(i * size, size), 100)))
                return false;
        }
        if (!drain(*cq, nconn, event_mode, conns, nconn))
            return false;
        for (std::size_t i = 0; i < nconn; ++i)
            if (!drain(*client[i], msgs, event_mode))
                return false;
        return true;
    };
    for (int i = 0; i < 4; ++i)
        ASSERT_TRUE(round(i % 2 == 1)) << "warm-up round " << i << " failed: " << first_error.message()
                                       << " (wr_id " << first_error_wr_id << ")";
    allocations = 0;
    counting = true;
    bool ok = true;
    int done = 0;
    for (; done < 20 && ok; ++done)
        ok = round(done % 2 == 1);
    counting = false;
    ASSERT_TRUE(ok) << "round " << done << " failed: " << first_error.message() << " (wr_id "
                    << first_error_wr_id << ")";
    EXPECT_EQ(allocations.load(), 0u)
        << "heap allocations polling a shared queue (last size " << last_size.load() << " B)";
}

TEST_P(allocation, shared_receive_queue_data_path_allocates_nothing)
{
    std::shared_ptr<shared_receive_queue> q;
    try {
        q = server_dom_->create_shared_receive_queue({.depth = 64, .max_sge = 1, .events = {}, .context = 0});
    } catch (const error& e) {
        if (e.code() != errc::not_supported)
            throw;
        GTEST_SKIP() << "no shared receive queues: " << e.what();
    }
    connection_options copts, sopts;
    copts.send_queue_depth = sopts.send_queue_depth = 64;
    sopts.srq = q;
    auto accepted = std::async(std::launch::async, [&] {
        auto req = listener_->get_request(10s);
        if (!req)
            throw std::runtime_error("no connection request within 10 s");
        return req->accept(sopts);
    });
    auto client = client_dom_->connect(server_address(), copts);
    auto server = accepted.get();
    const bool tcp = tcp_engine(b_);
    const std::size_t large = tcp ? (1u << 20) : (256u << 10);
    const int rounds = tcp ? 50 : 10;
    std::vector<std::byte> a(large), b(large);
    auto src = client_dom_->register_memory(a.data(), a.size(), access::local_write);
    auto dst = server_dom_->register_memory(b.data(), b.size(),
                                            access::local_write | access::remote_write | access::remote_read);
    workload wl{*client,
                *server,
                *src,
                *dst,
                large,
                client->limits().max_inline >= workload::small,
                server_dom_->limits().write_with_imm,
                q.get()};
    for (int i = 0; i < 5; ++i)
        ASSERT_TRUE(wl.round(i % 2 == 1)) << "warm-up round " << i << " failed: " << first_error.message()
                                          << " (wr_id " << first_error_wr_id << ")";
    allocations = 0;
    counting = true;
    bool ok = true;
    int done = 0;
    for (; done < rounds && ok; ++done)
        ok = wl.round(done % 2 == 1);
    counting = false;
    ASSERT_TRUE(ok) << "round " << done << " failed: " << first_error.message() << " (wr_id "
                    << first_error_wr_id << ")";
    EXPECT_EQ(allocations.load(), 0u)
        << "heap allocations in " << rounds << " rounds on a shared receive queue (last size "
        << last_size.load() << " B)";
}

// Atomics (fetch_add, compare_swap): single posts and lists, busy and in event mode,
// allocate nothing either (their operands and old values travel in fixed slots).
TEST_P(allocation, atomics_allocate_nothing)
{
    if (!client_dom_->limits().atomics || !server_dom_->limits().atomics)
        GTEST_SKIP() << "device " << client_dom_->limits().device_name
                     << ": no atomics (atomic_cap = IBV_ATOMIC_NONE)";
    auto p = connect_pair();
    constexpr std::size_t list = 8;
    std::vector<std::uint64_t> target(2, 0), old(list, 0);
    auto tmr = server_dom_->register_memory(target.data(), 16, access::remote_atomic);
    auto lmr = client_dom_->register_memory(old.data(), list * 8, access::local_write);
    const remote_buffer counter = tmr->remote(0, 8), word = tmr->remote(8, 8);
    std::uint64_t adds = 0;
    auto round = [&](bool event_mode) {
        sge s[list];
        work_request w[list];
        for (std::size_t i = 0; i < list; ++i) {
            s[i] = {lmr.get(), i * 8, 8};
            const bool cas = i % 2 == 1;
            w[i] = {.opcode = cas ? opcode::compare_swap : opcode::fetch_add,
                    .wr_id = i,
                    .local = {&s[i], 1},
                    .remote = cas ? word : counter,
                    .flags = i + 1 == list ? send_flags::signaled : send_flags::none,
                    .compare_add = cas ? 0u : 1u,
                    .swap = 0};
        }
        if (failed(p.client->post(w)) || !drain(*p.client, 1, event_mode))
            return false;
        if (failed(p.client->post_fetch_add(s[0], counter, 1, 100)) ||
            failed(p.client->post_compare_swap(s[1], word, 0, 0, 101)) || !drain(*p.client, 2, event_mode))
            return false;
        adds += list / 2 + 1;
        return true;
    };
    for (int i = 0; i < 4; ++i)
        ASSERT_TRUE(round(i % 2 == 1)) << "warm-up round " << i << " failed: " << first_error.message()
                                       << " (wr_id " << first_error_wr_id << ")";
    allocations = 0;
    counting = true;
    bool ok = true;
    int done = 0;
    for (; done < 50 && ok; ++done)
        ok = round(done % 2 == 1);
    counting = false;
    ASSERT_TRUE(ok) << "round " << done << " failed: " << first_error.message() << " (wr_id "
                    << first_error_wr_id << ")";
    EXPECT_EQ(allocations.load(), 0u)
        << "heap allocations in atomics (last size " << last_size.load() << " B)";
    EXPECT_EQ(std::atomic_ref<std::uint64_t>(target[0]).load(), adds);
    EXPECT_EQ(std::atomic_ref<std::uint64_t>(target[1]).load(), 0u);
}

// Memory windows (docs/memory-windows.md): bind, invalidate, rebind, accesses through the
// window and the peer's send_with_invalidate allocate nothing once the window exists.
TEST_P(allocation, memory_windows_allocate_nothing)
{
    if (!client_dom_->limits().memory_windows || !server_dom_->limits().memory_windows)
        GTEST_SKIP() << "device " << client_dom_->limits().device_name
                     << ": no memory windows (device_limits::memory_windows is false)";
    auto p = connect_pair();
    std::vector<std::byte> pool(4096), src(64, std::byte{3}), inbox(64);
    auto pmr = server_dom_->register_memory(pool.data(), pool.size(),
                                            access::remote_read | access::remote_write | access::bind_window);
    auto imr = server_dom_->register_memory(inbox.data(), inbox.size(), access::local_write);
    auto smr = client_dom_->register_memory(src.data(), src.size(), access::local_write);
    auto w = server_dom_->allocate_window();
    auto v = server_dom_->allocate_window();
    std::uint64_t slot = 0;
    auto round = [&](bool event_mode) {
        slot = (slot + 1) % 32;
        sge s{smr.get(), 0, 64}, in{imr.get(), 0, 64};
        if (failed(p.server->post_bind_window(*w, *pmr, slot * 64, 64, access::remote_write, 1)) ||
            failed(p.server->post_bind_window(*v, *pmr, slot * 64, 128, access::remote_read, 2)) ||
            !drain(*p.server, 2, event_mode))
            return false;
        if (failed(p.client->post_write({&s, 1}, w->remote(), 3)) ||
            failed(p.client->post_read({&s, 1}, *v->remote().slice(64, 64), 4)) ||
            !drain(*p.client, 2, event_mode))
            return false;
        if (failed(p.server->post_recv({&in, 1}, 5)) ||
            failed(p.client->post_send_invalidate({&s, 1}, w->remote().key, 6)) ||
            !drain(*p.client, 1, event_mode) || !drain(*p.server, 1, event_mode))
            return false;
        return !failed(p.server->post_invalidate_window(*v, 7)) && drain(*p.server, 1, event_mode);
    };
    for (int i = 0; i < 4; ++i)
        ASSERT_TRUE(round(i % 2 == 1)) << "warm-up round " << i << " failed: " << first_error.message()
                                       << " (wr_id " << first_error_wr_id << ")";
    allocations = 0;
    counting = true;
    bool ok = true;
    int done = 0;
    for (; done < 50 && ok; ++done)
        ok = round(done % 2 == 1);
    counting = false;
    ASSERT_TRUE(ok) << "round " << done << " failed: " << first_error.message() << " (wr_id "
                    << first_error_wr_id << ")";
    EXPECT_EQ(allocations.load(), 0u)
        << "heap allocations with memory windows (last size " << last_size.load() << " B)";
}

// Endpoints (rdmx/endpoint.hpp, docs/endpoints.md): once a peer is connected, tagged
// messages, eager and rendezvous, directed and from any peer, and write and read by peer
// handle allocate nothing, busy and in event mode (every pool was sized at open).
TEST_P(allocation, endpoint_data_path_allocates_nothing)
{
    endpoint_options o;
    o.receive_buffers = 64;
    o.unexpected_limit = 48;
    o.completion_queue_depth = 1024;
    auto a = endpoint::open(*client_dom_, address(b_, 0), o);
    auto b = endpoint::open(*server_dom_, address(b_, 0), o);
    const rdmx::peer to_b = a->insert(b->address());
    const rdmx::peer to_a = b->insert(a->address());
    constexpr std::size_t small = 64, eager = 4, large = 64u << 10; // large: past eager_limit
    std::vector<std::byte> am(2 * large), bm(2 * large);
    constexpr access rw = access::local_write | access::remote_read | access::remote_write;
    auto amr = client_dom_->register_memory(am.data(), am.size(), rw);
    auto bmr = server_dom_->register_memory(bm.data(), bm.size(), rw);
    const remote_buffer b_remote = bmr->remote(large, large);
    auto round = [&](bool event_mode) {
        sge er[eager], es[eager];
        for (std::size_t i = 0; i < eager; ++i) {
            er[i] = {bmr.get(), i * small, small};
            es[i] = {amr.get(), i * small, small};
            if (failed(b->recv(to_a, 1, 0, {&er[i], 1}, i)))
                return false;
        }
        sge lr{bmr.get(), 0, large}, ls{amr.get(), 0, large};
        if (failed(b->recv(any_peer, 2, 0, {&lr, 1}, 10)))
            return false;
        for (std::size_t i = 0; i < eager; ++i)
            if (failed(a->send(to_b, 1, {&es[i], 1}, i)))
                return false;
        sge ws{amr.get(), large, small}, rs{amr.get(), large + small, small};
        if (failed(a->send(to_b, 2, {&ls, 1}, 10)) || failed(a->write(to_b, {&ws, 1}, b_remote, 11)) ||
            failed(a->read(to_b, {&rs, 1}, b_remote, 12)))
            return false;
        std::size_t a_left = eager + 3, b_left = eager + 1;
        endpoint_completion out[16];
        auto deadline = std::chrono::steady_clock::now() + 30s;
        while (a_left + b_left > 0) {
            for (auto [ep, left] : {std::pair{a.get(), &a_left}, std::pair{b.get(), &b_left}}) {
                std::size_t got = event_mode && *left > 0 ? ep->wait(out, 10ms) : ep->poll(out);
                for (std::size_t i = 0; i < got; ++i)
                    if (failed(out[i].status)) {
                        first_error_wr_id = out[i].context;
                        return false;
                    }
                *left -= std::min(*left, got);
            }
            if (std::chrono::steady_clock::now() > deadline) {
                first_error = errc::timed_out;
                return false;
            }
        }
        return true;
    };
    for (int i = 0; i < 5; ++i)
        ASSERT_TRUE(round(i % 2 == 1)) << "warm-up round " << i << " failed: " << first_error.message()
                                       << " (context " << first_error_wr_id << ")";
    const int rounds = tcp_engine(b_) ? 50 : 10;
    allocations = 0;
    counting = true;
    bool ok = true;
    int done = 0;
    for (; done < rounds && ok; ++done)
        ok = round(done % 2 == 1);
    counting = false;
    ASSERT_TRUE(ok) << "round " << done << " failed: " << first_error.message() << " (context "
                    << first_error_wr_id << ")";
    EXPECT_EQ(allocations.load(), 0u)
        << "heap allocations in " << rounds << " endpoint rounds (last size " << last_size.load() << " B)";
}

INSTANTIATE_TEST_SUITE_P(backends, allocation, testing::ValuesIn(selected_backends()), param_name);

} // namespace
} // namespace rdmx::test
