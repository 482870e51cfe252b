// Remote atomics (opcode::fetch_add, compare_swap; docs/atomics.md), on every backend: old
// values in order and in host byte order, exact sums under contention from several
// connections and threads, a compare-and-swap lock that excludes, failures that leave the
// target untouched, and the fence. A device without atomics (siw) skips them, naming the
// capability, and refuses them up front.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include "common/test_util.hpp"

namespace rdmx::test
{
namespace
{

/// The target words are read and written through std::atomic_ref: the TCP engine changes
/// them with CPU atomics on its own thread, and the test must not race with that.
std::uint64_t load(std::uint64_t& x)
{
    return std::atomic_ref<std::uint64_t>(x).load();
}
void store(std::uint64_t& x, std::uint64_t v)
{
    std::atomic_ref<std::uint64_t>(x).store(v);
}

constexpr std::uint64_t guard = 0x5a5a5a5a5a5a5a5aull;

class atomics : public pair_fixture
{
protected:
    /// True (and the test skipped) on a device without atomics.
    bool skip_without_atomics()
    {
        if (client_dom_->limits().atomics && server_dom_->limits().atomics)
            return false;
        EXPECT_FALSE(tcp_engine(b_)) << "the TCP backend always has atomics";
        return true;
    }

    /// Connects `n` pairs to the listener, one after the other.
    std::vector<pair> connect_pairs(std::size_t n, const connection_options& opts = {})
    {
        std::vector<pair> out;
        for (std::size_t i = 0; i < n; ++i)
            out.push_back(connect_pair(opts));
        return out;
    }

    /// One completion, expected successful, of `op` with byte_len 8.
    static void expect_atomic_ok(const completion& c, opcode op, std::uint64_t wr_id)
    {
        EXPECT_FALSE(c.status) << "wr_id " << c.wr_id << ": " << c.status.message();
        EXPECT_EQ(c.opcode, op) << to_string(c.opcode);
        EXPECT_EQ(c.byte_len, 8u);
        EXPECT_EQ(c.wr_id, wr_id);
    }

    /// One atomic on `c`, waited for (busy, bounded); the old value.
    static std::uint64_t one(connection& c, const work_request& wr, memory_region& sink, std::size_t at)
    {
        EXPECT_FALSE(c.post({&wr, 1}));
        auto cs = poll_n(c, 1);
        EXPECT_EQ(cs.size(), 1u);
        if (cs.size() == 1)
            expect_atomic_ok(cs[0], wr.opcode, wr.wr_id);
        std::uint64_t v;
        std::memcpy(&v, sink.data() + at, 8);
        return v;
    }
};

#define SKIP_WITHOUT_ATOMICS()                                                                               \
    do {                                                                                                     \
        if (skip_without_atomics())                                                                          \
            GTEST_SKIP() << "device " << server_dom_->limits().device_name                                   \
                         << ": no atomics (atomic_cap = IBV_ATOMIC_NONE)";                                   \
    } while (0)

TEST_P(atomics, devices_without_atomics_refuse_them_up_front)
{
    auto p = connect_pair();
    if (client_dom_->limits().atomics) {
        EXPECT_TRUE(server_dom_->limits().atomics);
        GTEST_SKIP() << "device " << client_dom_->limits().device_name << " has atomics";
    }
    EXPECT_FALSE(tcp_engine(b_));
    // A request valid in every other way: the device lacks the operation (siw:
    // atomic_cap = IBV_ATOMIC_NONE), so nothing is posted, not even the write before it.
    std::vector<std::uint64_t> local(2, guard), target(2, 7);
    auto lmr = client_dom_->register_memory(local.data(), 16, access::local_write);
    auto tmr = server_dom_->register_memory(target.data(), 16, access::remote_write | access::remote_read);
    sge s{lmr.get(), 0, 8};
    work_request wrs[2] = {
        {.opcode = opcode::write, .wr_id = 1, .local = {&s, 1}, .remote = tmr->remote(8, 8)},
        {.opcode = opcode::fetch_add,
         .wr_id = 2,
         .local = {&s, 1},
         .remote = tmr->remote(0, 8),
         .compare_add = 1},
    };
    std::size_t posted = 99;
    EXPECT_EQ(p.client->post(wrs, &posted), errc::not_supported);
    EXPECT_EQ(posted, 0u);
    EXPECT_EQ(p.client->post_fetch_add(s, tmr->remote(0, 8), 1, 3), errc::not_supported);
    EXPECT_EQ(p.client->post_compare_swap(s, tmr->remote(0, 8), 7, 8, 4), errc::not_supported);
    completion c[4];
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(p.client->poll(c), 0u);
    EXPECT_EQ(p.client->state(), connection_state::established);
    EXPECT_EQ(target, std::vector<std::uint64_t>(2, 7));
    EXPECT_EQ(local, std::vector<std::uint64_t>(2, guard));
}

TEST_P(atomics, fetch_add_returns_the_old_values_in_sequence_in_host_byte_order)
{
    SKIP_WITHOUT_ATOMICS();
    auto p = connect_pair();
    // Guard words on both sides of the target; the start value reads differently in either
    // byte order, so a big-endian result would show.
    constexpr std::uint64_t start = 0x0102030405060708ull;
    std::vector<std::uint64_t> target = {guard, start, guard};
    constexpr std::size_t n = 64;
    std::vector<std::uint64_t> old(n + 1, guard);
    auto tmr = server_dom_->register_memory(target.data(), target.size() * 8, access::remote_atomic);
    auto lmr = client_dom_->register_memory(old.data(), old.size() * 8, access::local_write);
    // Small and large addends: the sum wraps around 2^64 several times.
    std::vector<std::uint64_t> add(n);
    for (std::size_t i = 0; i < n; ++i)
        add[i] = i % 7 == 3 ? 0xfffffffffffffff0ull - i : i + 1;
    std::vector<sge> s(n);
    std::vector<work_request> wrs(n);
    for (std::size_t i = 0; i < n; ++i) {
        s[i] = {lmr.get(), i * 8, 8};
        wrs[i] = {.opcode = opcode::fetch_add,
                  .wr_id = 100 + i,
                  .local = {&s[i], 1},
                  .remote = tmr->remote(8, 8),
                  .compare_add = add[i]};
    }
    // As one list (beyond max_rd_atomic: the backends pace them).
    std::size_t posted = 0;
    ASSERT_FALSE(p.client->post(wrs, &posted));
    ASSERT_EQ(posted, n);
    auto cs = expect_ok(*p.client, n);
    ASSERT_EQ(cs.size(), n);
    std::uint64_t expect = start;
    for (std::size_t i = 0; i < n; ++i) {
        expect_atomic_ok(cs[i], opcode::fetch_add, 100 + i);
        EXPECT_EQ(old[i], expect) << "old value of fetch_add " << i << std::hex << " (0x" << old[i]
                                  << ", expected 0x" << expect << ")";
        expect += add[i];
    }
    EXPECT_EQ(old[0], start) << "the first old value is the start value, as a native integer";
    EXPECT_EQ(old[n], guard) << "a byte past the last result was written";
    EXPECT_EQ(load(target[1]), expect) << "the target holds the exact sum";
    EXPECT_EQ(load(target[0]), guard);
    EXPECT_EQ(load(target[2]), guard);
    // The same through the wrapper.
    sge last{lmr.get(), n * 8, 8};
    ASSERT_FALSE(p.client->post_fetch_add(last, tmr->remote(8, 8), 5, 7));
    cs = expect_ok(*p.client, 1);
    ASSERT_EQ(cs.size(), 1u);
    expect_atomic_ok(cs[0], opcode::fetch_add, 7);
    EXPECT_EQ(old[n], expect);
    EXPECT_EQ(load(target[1]), expect + 5);
    // The target is a native integer at its owner: what its CPU stores, the peer adds to.
    store(target[1], 1000);
    EXPECT_EQ(one(*p.client,
                  {.opcode = opcode::fetch_add,
                   .wr_id = 8,
                   .local = {&last, 1},
                   .remote = tmr->remote(8, 8),
                   .compare_add = 1},
                  *lmr, n * 8),
              1000u);
    EXPECT_EQ(load(target[1]), 1001u);
}

TEST_P(atomics, compare_swap_swaps_on_a_match_and_otherwise_returns_the_current_value)
{
    SKIP_WITHOUT_ATOMICS();
    auto p = connect_pair();
    constexpr std::uint64_t a = 0x1111222233334444ull, b = 0xaaaabbbbccccddddull, c = 0x99;
    std::vector<std::uint64_t> target = {guard, a, guard};
    std::vector<std::uint64_t> old(2, guard);
    auto tmr = server_dom_->register_memory(target.data(), target.size() * 8, access::remote_atomic);
    auto lmr = client_dom_->register_memory(old.data(), old.size() * 8, access::local_write);
    sge s0{lmr.get(), 0, 8}, s1{lmr.get(), 8, 8};
    // Match: a becomes b, and a comes back.
    ASSERT_FALSE(p.client->post_compare_swap(s0, tmr->remote(8, 8), a, b, 1));
    // No match (the target is b now): nothing changes, the current value comes back.
    ASSERT_FALSE(p.client->post_compare_swap(s1, tmr->remote(8, 8), a, c, 2));
    auto cs = expect_ok(*p.client, 2);
    ASSERT_EQ(cs.size(), 2u);
    expect_atomic_ok(cs[0], opcode::compare_swap, 1);
    expect_atomic_ok(cs[1], opcode::compare_swap, 2);
    EXPECT_EQ(old[0], a);
    EXPECT_EQ(old[1], b) << "a failed compare-and-swap returns the current value";
    EXPECT_EQ(load(target[1]), b) << "a failed compare-and-swap changed the target";
    EXPECT_EQ(load(target[0]), guard);
    EXPECT_EQ(load(target[2]), guard);
    // Compare with the current value: swapped.
    EXPECT_EQ(one(*p.client,
                  {.opcode = opcode::compare_swap,
                   .wr_id = 3,
                   .local = {&s0, 1},
                   .remote = tmr->remote(8, 8),
                   .compare_add = b,
                   .swap = c},
                  *lmr, 0),
              b);
    EXPECT_EQ(load(target[1]), c);
}

// Several connections, each driven by its own thread, add to one counter: none of the
// additions may be lost, and (adding 1 each time) the old values seen by all of them
// together are exactly 0 .. total - 1, each once.
TEST_P(atomics, connections_hammering_one_counter_end_at_the_exact_sum)
{
    SKIP_WITHOUT_ATOMICS();
    constexpr std::size_t nconn = 4, per_conn = 1000, window = 16;
    auto pairs = connect_pairs(nconn);
    std::vector<std::uint64_t> target = {guard, 0, guard};
    auto tmr = server_dom_->register_memory(target.data(), target.size() * 8, access::remote_atomic);
    std::vector<std::vector<std::uint64_t>> seen(nconn, std::vector<std::uint64_t>(per_conn, guard));
    std::vector<std::unique_ptr<memory_region>> lmr;
    for (auto& v : seen)
        lmr.push_back(client_dom_->register_memory(v.data(), v.size() * 8, access::local_write));
    const remote_buffer counter = tmr->remote(8, 8);
    std::atomic<std::size_t> errors{0};
    auto client = [&](std::size_t k) {
        connection& c = *pairs[k].client;
        connection& server = *pairs[k].server; // polled too: a busy target serves on this thread
        std::size_t posted = 0, done = 0;
        completion buf[window];
        auto deadline = std::chrono::steady_clock::now() + 120s;
        while (done < per_conn && std::chrono::steady_clock::now() < deadline) {
            while (posted < per_conn && posted - done < window) {
                sge s{lmr[k].get(), posted * 8, 8};
                if (c.post_fetch_add(s, counter, 1, posted))
                    break;
                ++posted;
            }
            std::size_t got = c.poll(buf);
            for (std::size_t i = 0; i < got; ++i)
                if (buf[i].status || buf[i].opcode != opcode::fetch_add || buf[i].wr_id != done + i)
                    ++errors;
            done += got;
            server.poll(buf);
        }
        if (done != per_conn)
            ++errors;
    };
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < nconn; ++k)
        threads.emplace_back(client, k);
    for (auto& t : threads)
        t.join();
    ASSERT_EQ(errors.load(), 0u) << "failed, unordered or missing completions";
    EXPECT_EQ(load(target[1]), nconn * per_conn) << "an addition was lost";
    EXPECT_EQ(load(target[0]), guard);
    EXPECT_EQ(load(target[2]), guard);
    std::vector<std::uint64_t> all;
    for (std::size_t k = 0; k < nconn; ++k) {
        // Each connection's own old values grow: its adds execute in its posting order.
        EXPECT_TRUE(std::is_sorted(seen[k].begin(), seen[k].end())) << "connection " << k;
        all.insert(all.end(), seen[k].begin(), seen[k].end());
    }
    std::sort(all.begin(), all.end());
    std::vector<std::uint64_t> want(nconn * per_conn);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(all, want) << "two additions saw the same old value";
}

// A spin lock taken with compare-and-swap by several connections at once. Inside it each
// holder does a non-atomic read-modify-write of a counter (RDMA read, then write), which
// loses updates unless the lock excludes, and checks an occupancy count (fetch-add) that
// must be 0 on entry; the unlock's compare-and-swap must find the holder's own id.
TEST_P(atomics, compare_swap_lock_excludes_under_contention)
{
    SKIP_WITHOUT_ATOMICS();
    constexpr std::size_t nconn = 4;
    const std::size_t rounds = tcp_engine(b_) ? 200 : 50;
    auto pairs = connect_pairs(nconn);
    // [0] lock (0 = free, else the holder's id), [1] occupancy, [2] counter.
    std::vector<std::uint64_t> shared = {0, 0, 0, guard};
    auto amr = server_dom_->register_memory(shared.data(), 16, access::remote_atomic);
    auto cmr = server_dom_->register_memory(shared.data() + 2, 8, access::remote_read | access::remote_write);
    std::vector<std::vector<std::uint64_t>> scratch(nconn, std::vector<std::uint64_t>(2));
    std::vector<std::unique_ptr<memory_region>> lmr;
    for (auto& v : scratch)
        lmr.push_back(client_dom_->register_memory(v.data(), 16, access::local_write));
    std::atomic<std::size_t> contended{0};
    std::vector<std::string> why(nconn);

    // One connection's rounds; false (and why[k] says why) on the first failure.
    auto client = [&](std::size_t k) -> bool {
        connection& c = *pairs[k].client;
        connection& server = *pairs[k].server;
        const std::uint64_t id = k + 1;
        sge s0{lmr[k].get(), 0, 8};
        auto value = [&] {
            std::uint64_t v;
            std::memcpy(&v, scratch[k].data(), 8);
            return v;
        };
        // One request, waited for; false (with a reason) on any failure.
        auto run = [&](const work_request& wr) {
            if (auto ec = c.post({&wr, 1})) {
                why[k] = "post: " + ec.message();
                return false;
            }
            completion cq[1];
            auto deadline = std::chrono::steady_clock::now() + 30s;
            while (c.poll(cq) == 0) {
                server.poll(cq);
                if (std::chrono::steady_clock::now() > deadline) {
                    why[k] = "no completion";
                    return false;
                }
            }
            if (cq[0].status) {
                why[k] = "completion: " + cq[0].status.message();
                return false;
            }
            return true;
        };
        auto fetch_add = [&](std::uint64_t v) {
            return run({.opcode = opcode::fetch_add,
                        .wr_id = 1,
                        .local = {&s0, 1},
                        .remote = amr->remote(8, 8),
                        .compare_add = v});
        };
        auto cas = [&](std::uint64_t cmp, std::uint64_t swp) {
            return run({.opcode = opcode::compare_swap,
                        .wr_id = 2,
                        .local = {&s0, 1},
                        .remote = amr->remote(0, 8),
                        .compare_add = cmp,
                        .swap = swp});
        };
        for (std::size_t r = 0; r < rounds; ++r) {
            for (;;) { // lock
                if (!cas(0, id))
                    return false;
                if (value() == 0)
                    break;
                if (value() > nconn) {
                    why[k] = "lock word holds " + std::to_string(value());
                    return false;
                }
                ++contended;
            }
            if (!fetch_add(1))
                return false;
            if (value() != 0) {
                why[k] = "entered while " + std::to_string(value()) + " others were inside";
                return false;
            }
            sge s{lmr[k].get(), 8, 8};
            if (!run({.opcode = opcode::read, .wr_id = 3, .local = {&s, 1}, .remote = cmr->remote()}))
                return false;
            ++scratch[k][1];
            if (!run({.opcode = opcode::write, .wr_id = 4, .local = {&s, 1}, .remote = cmr->remote()}))
                return false;
            if (!fetch_add(~std::uint64_t{0})) // - 1
                return false;
            if (value() != 1) {
                why[k] = "left while " + std::to_string(value()) + " were inside";
                return false;
            }
            if (!cas(id, 0)) // unlock
                return false;
            if (value() != id) {
                why[k] = "unlocked a lock held by " + std::to_string(value());
                return false;
            }
        }
        return true;
    };
    std::vector<std::thread> threads;
    std::vector<char> ok(nconn, 0);
    for (std::size_t k = 0; k < nconn; ++k)
        threads.emplace_back([&, k] { ok[k] = client(k); });
    for (auto& t : threads)
        t.join();
    for (std::size_t k = 0; k < nconn; ++k)
        ASSERT_TRUE(ok[k]) << "connection " << k << ": " << why[k];
    EXPECT_EQ(load(shared[0]), 0u) << "lock left taken";
    EXPECT_EQ(load(shared[1]), 0u) << "occupancy";
    EXPECT_EQ(load(shared[2]), nconn * rounds) << "a critical section overlapped another";
    EXPECT_EQ(load(shared[3]), guard);
    std::printf("[ atomics  ] %zu lock attempts found the lock taken\n", contended.load());
}

TEST_P(atomics, malformed_atomics_are_rejected_before_posting)
{
    SKIP_WITHOUT_ATOMICS();
    auto p = connect_pair();
    std::vector<std::uint64_t> target(4, 7), local(4, guard);
    auto tmr = server_dom_->register_memory(target.data(), 32, access::remote_atomic);
    auto lmr = client_dom_->register_memory(local.data(), 32, access::local_write);
    auto ro = client_dom_->register_memory(local.data(), 32, access::none);
    auto foreign = server_dom_->register_memory(local.data(), 32, access::local_write);
    const remote_buffer rb = tmr->remote(8, 8);
    auto fa = [&](const sge* s, std::size_t n, const remote_buffer& r, send_flags f = send_flags::signaled) {
        work_request wr{.opcode = opcode::fetch_add,
                        .wr_id = 1,
                        .local = {s, n},
                        .remote = r,
                        .flags = f,
                        .compare_add = 1};
        return p.client->post({&wr, 1});
    };
    sge ok{lmr.get(), 0, 8}, short_local{lmr.get(), 0, 4}, long_local{lmr.get(), 0, 16};
    sge halves[2] = {{lmr.get(), 0, 4}, {lmr.get(), 4, 4}};
    EXPECT_EQ(fa(&short_local, 1, rb), errc::invalid_argument) << "4-byte local";
    EXPECT_EQ(fa(&long_local, 1, rb), errc::invalid_argument) << "16-byte local";
    EXPECT_EQ(fa(halves, 2, rb), errc::invalid_argument) << "8 bytes in two SGEs";
    EXPECT_EQ(fa(&ok, 0, rb), errc::invalid_argument) << "no local SGE";
    EXPECT_EQ(fa(&ok, 1, tmr->remote(4, 8)), errc::invalid_argument) << "misaligned target";
    EXPECT_EQ(fa(&ok, 1, tmr->remote(9, 8)), errc::invalid_argument) << "misaligned target";
    EXPECT_EQ(fa(&ok, 1, tmr->remote(8, 4)), errc::invalid_argument) << "descriptor shorter than 8 bytes";
    EXPECT_EQ(fa(&ok, 1, rb, send_flags::signaled | send_flags::inline_data), errc::invalid_argument)
        << "inline";
    sge s_ro{ro.get(), 0, 8};
    EXPECT_EQ(fa(&s_ro, 1, rb), errc::local_protection)
        << "the old value lands in memory without local_write";
    sge s_foreign{foreign.get(), 0, 8};
    EXPECT_EQ(fa(&s_foreign, 1, rb), errc::invalid_argument) << "a region of another domain";
    sge past_end{lmr.get(), 28, 8};
    EXPECT_EQ(fa(&past_end, 1, rb), errc::invalid_argument) << "local range past the region";
    auto other_backend = rb;
    other_backend.backend = b_ == backend::verbs ? backend::tcp : backend::verbs;
    EXPECT_EQ(fa(&ok, 1, other_backend), errc::invalid_argument) << "a descriptor of the other backend";
    EXPECT_EQ(p.client->post_compare_swap(short_local, rb, 7, 8, 1), errc::invalid_argument);
    EXPECT_EQ(p.client->post_compare_swap(ok, tmr->remote(12, 8), 7, 8, 1), errc::invalid_argument);
    // In a list: the valid ones before a bad one are not posted either.
    work_request list[2] = {
        {.opcode = opcode::fetch_add, .wr_id = 1, .local = {&ok, 1}, .remote = rb, .compare_add = 1},
        {.opcode = opcode::compare_swap, .wr_id = 2, .local = {&short_local, 1}, .remote = rb},
    };
    std::size_t posted = 99;
    EXPECT_EQ(p.client->post(list, &posted), errc::invalid_argument);
    EXPECT_EQ(posted, 0u);
    completion c[4];
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(p.client->poll(c), 0u) << "a refused request reached the wire";
    EXPECT_EQ(p.client->state(), connection_state::established);
    EXPECT_EQ(target, std::vector<std::uint64_t>(4, 7));
    EXPECT_EQ(local, std::vector<std::uint64_t>(4, guard));
    // And the connection still works.
    EXPECT_EQ(one(*p.client, list[0], *lmr, 0), 7u);
    EXPECT_EQ(load(target[1]), 8u);
}

// What only the target can check: a forged key, a range outside the registration, a
// region registered without remote_atomic. Each fails with remote_access (the connection
// breaks, as for a bad read) and leaves the target memory as it was.
TEST_P(atomics, targets_the_peer_refuses_fail_with_remote_access_and_stay_untouched)
{
    SKIP_WITHOUT_ATOMICS();
    // mem[8, 16) is registered for atomics, mem[16, 24) for reads and writes; mem[0, 8)
    // is not registered at all.
    std::vector<std::uint64_t> mem(24, 7);
    auto atomic_mr = server_dom_->register_memory(mem.data() + 8, 64, access::remote_atomic);
    auto rw_mr = server_dom_->register_memory(
        mem.data() + 16, 64, access::remote_read | access::remote_write | access::local_write);
    std::vector<std::uint64_t> local(1, guard);
    auto lmr = client_dom_->register_memory(local.data(), 8, access::local_write);
    auto forged_key = atomic_mr->remote(0, 8);
    forged_key.key ^= 0x5a5a00;
    auto past_end = atomic_mr->remote(); // claims 128 bytes, 64 registered
    past_end.length = 128;
    auto before = atomic_mr->remote(0, 8);
    before.addr -= 8;
    struct bad_target {
        const char* what;
        remote_buffer rb;
    };
    const bad_target cases[] = {
        {"forged key", forged_key},
        {"just past the registration's end", *past_end.slice(64, 8)},
        {"just before the registration", before},
        {"region without remote_atomic", rw_mr->remote(0, 8)},
    };
    for (const auto& [what, rb] : cases) {
        SCOPED_TRACE(what);
        auto p = connect_pair();
        sge s{lmr.get(), 0, 8};
        ASSERT_FALSE(p.client->post_fetch_add(s, rb, 1, 1));
        auto c = poll_n(*p.client, 1);
        ASSERT_EQ(c.size(), 1u);
        EXPECT_EQ(c[0].status, errc::remote_access) << c[0].status.message();
        EXPECT_EQ(c[0].wr_id, 1u);
        EXPECT_EQ(p.client->state(), connection_state::error);
        EXPECT_EQ(p.client->last_error(), errc::remote_access) << p.client->last_error().message();
        // A compare-and-swap the same way (on a fresh connection).
        auto q = connect_pair();
        ASSERT_FALSE(q.client->post_compare_swap(s, rb, 7, 99, 2));
        c = poll_n(*q.client, 1);
        ASSERT_EQ(c.size(), 1u);
        EXPECT_EQ(c[0].status, errc::remote_access) << c[0].status.message();
        for (std::size_t i = 0; i < mem.size(); ++i)
            EXPECT_EQ(load(mem[i]), 7u) << "word " << i << " of the target memory was touched";
        EXPECT_EQ(local[0], guard) << "a refused atomic returned a value";
    }
}

// A fenced request waits for the atomics before it, as for reads: here a write whose
// source is the buffer the fetch-add's old value lands in sends that old value. Without
// the fence the write could go out before the value arrived, and send what was there.
TEST_P(atomics, fence_orders_a_request_after_earlier_atomics)
{
    SKIP_WITHOUT_ATOMICS();
    auto p = connect_pair();
    std::vector<std::uint64_t> target = {1234, 0x77};
    std::vector<std::uint64_t> relay(16, guard); // [round]: the fetch-add's, [8 + round]: the CAS's
    auto amr = server_dom_->register_memory(target.data(), 8, access::remote_atomic);
    auto wmr = server_dom_->register_memory(target.data() + 1, 8, access::remote_write | access::remote_read);
    auto lmr = client_dom_->register_memory(relay.data(), relay.size() * 8, access::local_write);
    for (std::uint64_t round = 0; round < 8; ++round) {
        SCOPED_TRACE(round);
        sge s{lmr.get(), round * 8, 8}, t{lmr.get(), (8 + round) * 8, 8};
        work_request wrs[3] = {
            {.opcode = opcode::fetch_add,
             .wr_id = 1,
             .local = {&s, 1},
             .remote = amr->remote(),
             .compare_add = 1},
            // The write sends what the fetch-add returned (a fence: after it completed).
            {.opcode = opcode::write,
             .wr_id = 2,
             .local = {&s, 1},
             .remote = wmr->remote(),
             .flags = send_flags::signaled | send_flags::fence},
            // And a fenced compare-and-swap sees the fetch-add's result.
            {.opcode = opcode::compare_swap,
             .wr_id = 3,
             .local = {&t, 1},
             .remote = amr->remote(),
             .flags = send_flags::signaled | send_flags::fence,
             .compare_add = 1235 + round,
             .swap = 1235 + round},
        };
        ASSERT_FALSE(p.client->post(wrs));
        auto cs = expect_ok(*p.client, 3);
        ASSERT_EQ(cs.size(), 3u);
        expect_atomic_ok(cs[0], opcode::fetch_add, 1);
        EXPECT_EQ(cs[1].opcode, opcode::write);
        expect_atomic_ok(cs[2], opcode::compare_swap, 3);
        EXPECT_EQ(load(target[1]), 1234 + round) << "the fenced write did not send the old value";
        EXPECT_EQ(relay[round], 1234 + round);
        EXPECT_EQ(relay[8 + round], 1235 + round) << "the compare-and-swap after the fence saw another value";
        EXPECT_EQ(load(target[0]), 1235 + round);
    }
}

INSTANTIATE_TEST_SUITE_P(backends, atomics, testing::ValuesIn(selected_backends()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(atomics);

} // namespace
} // namespace rdmx::test
