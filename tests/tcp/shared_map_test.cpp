// Allocated regions over shm:// (lib/tcp/tcp_shared_map.cpp, tcp_post.cpp post_mapped): a
// peer on this host maps a region that domain::allocate_memory made and writes and reads it
// with its own copies; where anything is in doubt (rights, bounds, a region gone, a key
// that does not name such a region, a peer that went) the request goes the usual way and
// fails or succeeds exactly as it would have.
#include <gtest/gtest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/test_data.hpp"
#include "common/test_util.hpp"
#include "tcp/cma_target_link.hpp"
#include "shared_memory.hpp"
#include "tcp/raw_peer.hpp"
#include "tcp/tcp_engine.hpp"
#include "tcp/tcp_shared_map.hpp"

namespace rdmx::test
{
namespace
{

constexpr auto rw = access::remote_write | access::remote_read;

class shared_map : public tcp_loopback
{
protected:
    shared_map() { b_ = backend::shm; }

    /// Polls one completion of `c` (10 s at most) and returns its status.
    static std::error_code status_of_next(connection& c)
    {
        auto cs = poll_n(c, 1);
        EXPECT_EQ(cs.size(), 1u);
        return cs.empty() ? make_error_code(errc::timed_out) : cs[0].status;
    }
};

TEST_F(shared_map, writes_and_reads_into_an_allocated_region_are_the_initiators_own_copies)
{
    auto p = connect_pair();
    constexpr std::size_t n = 1 << 20;
    auto target = server_dom_->allocate_memory(n, rw);
    ASSERT_TRUE(target->owns_memory());
    ASSERT_EQ(target->size(), n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(target->data()) % 4096, 0u);
    EXPECT_EQ(target->data()[0], std::byte{0});
    EXPECT_NE(target->remote().key & tcp::shared_key_bit, 0u) << "the key does not say it may be mapped";
    auto src = pattern(n, 5);
    std::vector<std::byte> back(n);
    auto sm = client_dom_->register_memory(src.data(), n, access::none);
    auto bm = client_dom_->register_memory(back.data(), n, access::local_write);
    const std::uint64_t mapped0 = tcp::mapped_copies(), cma0 = tcp::cma_requests_completed();

    const sge w[3] = {{sm.get(), 0, 1000}, {sm.get(), 1000, 300000}, {sm.get(), 301000, n - 301000}};
    ASSERT_FALSE(p.client->post_write(w, target->remote(), 1));
    auto c = expect_ok(*p.client, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].opcode, opcode::write);
    EXPECT_EQ(c[0].byte_len, n);
    EXPECT_EQ(std::memcmp(target->data(), src.data(), n), 0) << "the write did not land";
    const sge r[2] = {{bm.get(), 0, 4096}, {bm.get(), 4096, n - 8192}};
    ASSERT_FALSE(p.client->post_read(r, *target->remote().slice(4096, n - 4096), 2));
    c = expect_ok(*p.client, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].opcode, opcode::read);
    EXPECT_EQ(std::memcmp(back.data(), src.data() + 4096, n - 4096), 0) << "the read brought other bytes";
    // Unsignaled: done, and no completion.
    ASSERT_FALSE(p.client->post_write({&w[0], 1}, target->remote(), 3, send_flags::none));
    completion none[2];
    EXPECT_EQ(p.client->poll(none), 0u);
    EXPECT_EQ(tcp::mapped_copies() - mapped0, 3u) << "not all three were the client's own copies";
    EXPECT_EQ(tcp::cma_requests_completed(), cma0) << "a request went to the target (CMA)";
}

TEST_F(shared_map, a_write_behind_an_outstanding_send_goes_the_usual_way_in_order)
{
    // RC's order: the write may not land before the send it was posted after is delivered;
    // the copy would place it at once, so with anything outstanding the target places it.
    auto p = connect_pair();
    constexpr std::size_t n = 256 * 1024;
    auto target = server_dom_->allocate_memory(n, rw);
    std::vector<std::byte> inbox(64), note(64, std::byte{7});
    auto im = server_dom_->register_memory(inbox.data(), inbox.size(), access::local_write);
    sge in{im.get(), 0, inbox.size()};
    ASSERT_FALSE(p.server->post_recv({&in, 1}, 9));
    auto src = pattern(n, 9);
    auto sm = client_dom_->register_memory(src.data(), n, access::none);
    auto nm = client_dom_->register_memory(note.data(), note.size(), access::none);
    const std::uint64_t mapped0 = tcp::mapped_copies();
    sge s{nm.get(), 0, note.size()}, w{sm.get(), 0, n};
    work_request wrs[2];
    wrs[0].opcode = opcode::send;
    wrs[0].wr_id = 1;
    wrs[0].local = {&s, 1};
    wrs[1].opcode = opcode::write;
    wrs[1].wr_id = 2;
    wrs[1].local = {&w, 1};
    wrs[1].remote = target->remote();
    ASSERT_FALSE(p.client->post(wrs));
    auto c = expect_ok(*p.client, 2);
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0].wr_id, 1u);
    EXPECT_EQ(c[1].wr_id, 2u);
    expect_ok(*p.server, 1);
    EXPECT_EQ(std::memcmp(target->data(), src.data(), n), 0);
    EXPECT_EQ(tcp::mapped_copies(), mapped0) << "the write overtook the send it was posted behind";
    // Nothing outstanding now: the next one is a copy.
    ASSERT_FALSE(p.client->post_write({&w, 1}, target->remote(), 3));
    expect_ok(*p.client, 1);
    EXPECT_EQ(tcp::mapped_copies() - mapped0, 1u);
}

TEST_F(shared_map, a_region_peers_may_only_read_is_never_written_by_them)
{
    auto p = connect_pair();
    constexpr std::size_t n = 64 * 1024;
    auto target = server_dom_->allocate_memory(n, access::remote_read);
    std::memset(target->data(), 0x3c, n);
    std::vector<std::byte> buf(n, std::byte{1});
    auto bm = client_dom_->register_memory(buf.data(), n, access::local_write);
    const std::uint64_t mapped0 = tcp::mapped_copies();
    sge s{bm.get(), 0, n};
    ASSERT_FALSE(p.client->post_read({&s, 1}, target->remote(), 1));
    expect_ok(*p.client, 1);
    EXPECT_EQ(buf, std::vector<std::byte>(n, std::byte{0x3c}));
    EXPECT_EQ(tcp::mapped_copies() - mapped0, 1u) << "the read was not a copy";
    std::memset(buf.data(), 1, n);
    ASSERT_FALSE(p.client->post_write({&s, 1}, target->remote(), 2));
    EXPECT_EQ(status_of_next(*p.client), errc::remote_access);
    EXPECT_EQ(target->data()[0], std::byte{0x3c}) << "a peer without remote_write wrote the region";
    EXPECT_EQ(target->data()[n - 1], std::byte{0x3c});
    EXPECT_EQ(tcp::mapped_copies() - mapped0, 1u);
}

TEST_F(shared_map, a_write_past_the_region_fails_as_the_target_fails_it)
{
    auto p = connect_pair();
    constexpr std::size_t n = 8192;
    auto target = server_dom_->allocate_memory(n, rw);
    std::vector<std::byte> buf(2 * n, std::byte{2});
    auto bm = client_dom_->register_memory(buf.data(), buf.size(), access::local_write);
    remote_buffer past = target->remote();
    past.addr += n / 2; // the last half and a page beyond (the mapping's own page)
    past.length = n;
    sge s{bm.get(), 0, n};
    ASSERT_FALSE(p.client->post_write({&s, 1}, past, 1));
    EXPECT_EQ(status_of_next(*p.client), errc::remote_access);
    EXPECT_EQ(target->data()[n / 2], std::byte{0}) << "part of a write that does not fit landed";
}

TEST_F(shared_map, a_destroyed_region_takes_no_more_writes_from_a_peer_that_had_mapped_it)
{
    auto p = connect_pair();
    constexpr std::size_t n = 64 * 1024;
    auto target = server_dom_->allocate_memory(n, rw);
    const remote_buffer rb = target->remote();
    std::vector<std::byte> buf(n, std::byte{4});
    auto bm = client_dom_->register_memory(buf.data(), n, access::local_write);
    const std::uint64_t mapped0 = tcp::mapped_copies();
    sge s{bm.get(), 0, n};
    ASSERT_FALSE(p.client->post_write({&s, 1}, rb, 1));
    expect_ok(*p.client, 1);
    ASSERT_EQ(tcp::mapped_copies() - mapped0, 1u);
    target.reset(); // the client still has the pages mapped
    ASSERT_FALSE(p.client->post_write({&s, 1}, rb, 2));
    EXPECT_EQ(status_of_next(*p.client), errc::remote_access) << "a write into a destroyed region succeeded";
    EXPECT_EQ(tcp::mapped_copies() - mapped0, 1u);
}

TEST_F(shared_map, a_peer_that_went_gets_no_write_completed_into_its_region)
{
    auto p = connect_pair();
    constexpr std::size_t n = 64 * 1024;
    auto target = server_dom_->allocate_memory(n, rw);
    std::vector<std::byte> buf(n, std::byte{5});
    auto bm = client_dom_->register_memory(buf.data(), n, access::local_write);
    sge s{bm.get(), 0, n};
    ASSERT_FALSE(p.client->post_write({&s, 1}, target->remote(), 1));
    expect_ok(*p.client, 1);
    p.server.reset(); // its end of the socket closes; the region stays registered
    std::this_thread::sleep_for(1ms);
    const std::uint64_t mapped0 = tcp::mapped_copies();
    if (!p.client->post_write({&s, 1}, target->remote(), 2)) {
        EXPECT_TRUE(status_of_next(*p.client)) << "a write over a connection its peer closed succeeded";
    }
    EXPECT_EQ(tcp::mapped_copies(), mapped0);
}

TEST_F(shared_map, copies_complete_on_a_shared_queue_and_wake_its_sleeper)
{
    // A service's shape: the client's connections report to one shared queue that a thread
    // sleeps on (wait: arm, poll, sleep on fd()); copies made by another thread's post()
    // complete there, each with its connection and context, and wake it.
    auto cq = client_dom_->create_completion_queue({.depth = 1024});
    connection_options co;
    co.send_cq = cq;
    constexpr std::size_t n = 128 * 1024;
    auto target = server_dom_->allocate_memory(2 * n, rw);
    auto src = pattern(n, 31);
    std::vector<pair> pairs;
    for (std::uint64_t k = 0; k < 2; ++k) {
        co.context = 100 + k;
        pairs.push_back(connect_pair(co, {}));
    }
    auto sm = client_dom_->register_memory(src.data(), n, access::none);
    const std::uint64_t mapped0 = tcp::mapped_copies();
    std::vector<completion> got;
    std::thread sleeper([&] {
        completion c[4];
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        while (got.size() < 2 && std::chrono::steady_clock::now() < deadline)
            for (std::size_t i = 0, k = cq->wait(c, 1s); i < k; ++i)
                got.push_back(c[i]);
    });
    std::this_thread::sleep_for(20ms); // asleep on fd() by now, most likely
    sge s{sm.get(), 0, n};
    for (std::uint64_t k = 0; k < 2; ++k)
        ASSERT_FALSE(pairs[k].client->post_write({&s, 1}, *target->remote().slice(k * n, n), 7 + k));
    sleeper.join();
    ASSERT_EQ(got.size(), 2u);
    for (std::uint64_t k = 0; k < 2; ++k) {
        EXPECT_FALSE(got[k].status);
        EXPECT_EQ(got[k].wr_id, 7 + k);
        EXPECT_EQ(got[k].context, 100 + k);
        EXPECT_EQ(got[k].conn, pairs[k].client.get());
        EXPECT_EQ(std::memcmp(target->data() + k * n, src.data(), n), 0);
    }
    EXPECT_EQ(tcp::mapped_copies() - mapped0, 2u);
}

TEST_F(shared_map, a_control_page_changed_after_the_mapping_changes_nothing_the_peer_checks)
{
    // The owner's side may write its control page at any time (a hostile or broken peer):
    // the initiator keeps what it checked when it mapped the region and never trusts more.
    auto p = connect_pair();
    constexpr std::size_t n = 8192;
    auto target = server_dom_->allocate_memory(n, rw);
    std::vector<std::byte> buf(4 * n, std::byte{6});
    auto bm = client_dom_->register_memory(buf.data(), buf.size(), access::local_write);
    sge s{bm.get(), 0, n};
    ASSERT_FALSE(p.client->post_write({&s, 1}, target->remote(), 1));
    expect_ok(*p.client, 1);
    auto* control =
        reinterpret_cast<detail::shared_control*>(target->data() - detail::shared_memory::page_size());
    ASSERT_EQ(control->key, target->remote().key);
    control->size = 1ull << 40;
    control->base -= 4096;
    control->rights = ~std::uint64_t{0};
    remote_buffer past = target->remote();
    past.length = 3 * n;
    sge big{bm.get(), 0, 3 * n};
    ASSERT_FALSE(p.client->post_write({&big, 1}, past, 2));
    EXPECT_EQ(status_of_next(*p.client), errc::remote_access) << "a write past the region succeeded";
}

TEST(shared_map_process, another_process_s_allocated_region_is_written_by_this_process_s_copy)
{
    // Two processes, as in use: cma_target's region from allocate_memory. A 1 MiB write
    // is this process's copy into its mapping; what the target then serves the usual way
    // (a read posted behind a send, by its own process_vm_writev) shows the bytes in its
    // memory.
    cma_target_link t;
    ASSERT_NO_FATAL_FAILURE(
        open_cma_target("shm://map-" + std::to_string(::getpid()) + ":7100", "allocated", t));
    constexpr std::size_t n = 1 << 20;
    ASSERT_EQ(t.region.length, n);
    ASSERT_NE(t.region.key & tcp::shared_key_bit, 0u);
    auto src = pattern(n, 21);
    std::vector<std::byte> back(n), note(1000, std::byte{0x77});
    auto sm = t.dom->register_memory(src.data(), n, access::none);
    auto bm = t.dom->register_memory(back.data(), n, access::local_write);
    auto nm = t.dom->register_memory(note.data(), note.size(), access::none);
    const std::uint64_t mapped0 = tcp::mapped_copies(), cma0 = tcp::cma_requests_completed();
    const sge w[2] = {{sm.get(), 0, 4096}, {sm.get(), 4096, n - 4096}};
    ASSERT_FALSE(t.conn->post_write(w, t.region, 1));
    expect_ok(*t.conn, 1);
    EXPECT_EQ(tcp::mapped_copies() - mapped0, 1u) << "the write was not this process's copy";
    // The send lands in the receive the target posted over its region's first 256 KiB.
    sge s{nm.get(), 0, note.size()}, r{bm.get(), 0, n};
    work_request wrs[2];
    wrs[0].opcode = opcode::send;
    wrs[0].wr_id = 2;
    wrs[0].local = {&s, 1};
    wrs[1].opcode = opcode::read;
    wrs[1].wr_id = 3;
    wrs[1].local = {&r, 1};
    wrs[1].remote = t.region;
    ASSERT_FALSE(t.conn->post(wrs));
    expect_ok(*t.conn, 2);
    EXPECT_EQ(tcp::mapped_copies() - mapped0, 1u) << "the read behind the send was a copy";
    EXPECT_EQ(tcp::cma_requests_completed() - cma0, 1u) << "the read was not served by the target";
    EXPECT_EQ(std::memcmp(back.data(), note.data(), note.size()), 0)
        << "the send is not in the target's region";
    EXPECT_EQ(std::memcmp(back.data() + note.size(), src.data() + note.size(), n - note.size()), 0)
        << "the target's memory does not hold what the write copied";
    t.conn->disconnect();
    EXPECT_EQ(t.child->wait(), 0) << "cma_target did not see a clean disconnect";
}

TEST(shared_map_cache, keys_that_do_not_name_an_allocated_region_are_never_mapped)
{
    // This process's own descriptors through its own pidfd, as a peer's: sockets, an
    // eventfd, the rings' memfd of a live shm:// connection, and two allocated regions.
    // Only a key that names a region exactly is mapped.
    auto dom = domain::open("shm://keys:0");
    auto a = dom->allocate_memory(4096, rw);
    auto b = dom->allocate_memory(3 * 4096 + 5, access::remote_read);
    auto lst = dom->listen("shm://keys:0");
    auto peer = domain::open("shm://keys:0");
    auto conn = peer->start_connect("shm://keys:" + std::to_string(lst->port()), {});
    auto req = lst->get_request(5s);
    ASSERT_TRUE(req);
    auto acc = req->accept({});
    ASSERT_EQ(wait_established(*conn), connection_state::established);
    const long pidfd = ::syscall(SYS_pidfd_open, ::getpid(), 0);
    ASSERT_GE(pidfd, 0) << std::strerror(errno);
    tcp::shared_map_cache cache;
    const std::uint64_t ka = a->remote().key, kb = b->remote().key;
    for (std::uint64_t fd = 0; fd < 512; ++fd) {
        const std::uint64_t forged = ((ka & ~tcp::shared_key_fd_mask) ^ (std::uint64_t{1} << 40)) | fd;
        EXPECT_EQ(cache.find(forged, static_cast<int>(pidfd)), nullptr) << "descriptor " << fd;
    }
    const auto* ra = cache.find(ka, static_cast<int>(pidfd));
    ASSERT_NE(ra, nullptr);
    EXPECT_EQ(ra->base, reinterpret_cast<std::uintptr_t>(a->data()));
    EXPECT_EQ(ra->size, 4096u);
    const auto* rb = cache.find(kb, static_cast<int>(pidfd));
    ASSERT_NE(rb, nullptr);
    EXPECT_EQ(rb->size, 3 * 4096u + 5);
    std::memcpy(a->data(), "seen", 5);
    EXPECT_EQ(std::memcmp(ra->data, "seen", 5), 0) << "the mapping is not the region's memory";
    ::close(static_cast<int>(pidfd));
}

} // namespace
} // namespace rdmx::test
