// The rings of shm:// connections (lib/tcp/tcp_ring.hpp): the byte stream through them,
// the doorbell rule, the checks of the peer's indices and memfd; then connections: rdmx
// peers take rings, and a raw peer that takes them and corrupts an index is a protocol
// violation that ends only its own connection.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "backends.hpp"
#include "common/test_util.hpp"
#include "tcp/raw_peer.hpp"
#include "tcp/tcp_connection.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_engine.hpp"
#include "tcp/tcp_ring.hpp"

namespace rdmx::test
{
namespace
{

using namespace std::chrono_literals;
using tcp::byte_ring_pair;
using tcp::unique_fd;

constexpr std::size_t cap = byte_ring_pair::capacity;
// The layout both sides agree on (tcp_ring.hpp): ring r's control block at r * 4096, its
// tail at +0 and head at +64; ring 0 is written by the listener, ring 1 by the client.
constexpr std::size_t tail_at(int r)
{
    return static_cast<std::size_t>(r) * 4096;
}
constexpr std::size_t head_at(int r)
{
    return static_cast<std::size_t>(r) * 4096 + 64;
}

/// A peer's own mapping of the rings' memfd, read and written by hand on the documented
/// layout: ring r's tail, head and wake flag (+128) in its control page, its bytes after
/// the two control pages.
class raw_rings
{
public:
    explicit raw_rings(int memfd)
    {
        void* m = ::mmap(nullptr, byte_ring_pair::map_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        EXPECT_NE(m, MAP_FAILED) << std::strerror(errno);
        base_ = m == MAP_FAILED ? nullptr : static_cast<std::byte*>(m);
    }
    ~raw_rings()
    {
        if (base_)
            ::munmap(base_, byte_ring_pair::map_size);
    }
    raw_rings(const raw_rings&) = delete;
    raw_rings& operator=(const raw_rings&) = delete;

    explicit operator bool() const { return base_ != nullptr; }
    std::atomic<std::uint64_t>& tail(int r) const { return *at<std::atomic<std::uint64_t>>(tail_at(r)); }
    std::atomic<std::uint32_t>& wake(int r) const
    {
        return *at<std::atomic<std::uint32_t>>(tail_at(r) + 128);
    }
    std::byte* data(int r) const { return base_ + 2 * 4096 + static_cast<std::size_t>(r) * cap; }
    /// Any 8 bytes of the control pages, as a corrupting peer writes them.
    void store(std::size_t off, std::uint64_t v) const { std::memcpy(base_ + off, &v, sizeof v); }

private:
    template <class T> T* at(std::size_t off) const { return reinterpret_cast<T*>(base_ + off); }
    std::byte* base_ = nullptr;
};

struct rings {
    unique_fd fd;
    std::unique_ptr<byte_ring_pair> listener, client;
    std::optional<raw_rings> raw; ///< the test's own mapping, to corrupt indices as a peer could

    rings()
    {
        std::string why;
        listener = byte_ring_pair::create(fd, why);
        EXPECT_NE(listener, nullptr) << why;
        if (!listener)
            return;
        client = byte_ring_pair::adopt(fd.get(), why);
        EXPECT_NE(client, nullptr) << why;
        if (!raw.emplace(fd.get()))
            raw.reset();
    }
    void store(std::size_t at, std::uint64_t v) { raw->store(at, v); }
};

ssize_t put(byte_ring_pair& r, const void* p, std::size_t n, bool* bell = nullptr)
{
    iovec v{const_cast<void*>(p), n};
    bool b = false;
    ssize_t k = r.write(&v, 1, b);
    if (bell)
        *bell = b;
    return k;
}

ssize_t get(byte_ring_pair& r, void* p, std::size_t n)
{
    iovec v{p, n};
    return r.read(&v, 1);
}

TEST(tcp_ring, bytes_cross_in_order_through_the_wrap_in_both_directions)
{
    rings rs;
    ASSERT_TRUE(rs.listener && rs.client);
    for (int dir = 0; dir < 2; ++dir) {
        byte_ring_pair& w = dir == 0 ? *rs.listener : *rs.client;
        byte_ring_pair& r = dir == 0 ? *rs.client : *rs.listener;
        // Odd sizes, written as two iovecs and read as three, four ring-fulls in all.
        std::uint8_t next_out = 0, next_in = 0;
        std::size_t moved = 0;
        std::vector<std::uint8_t> out(7001), in(5003);
        while (moved < 4 * cap) {
            for (auto& b : out)
                b = next_out++;
            iovec wv[2] = {{out.data(), 3000}, {out.data() + 3000, out.size() - 3000}};
            bool bell;
            ssize_t k = w.write(wv, 2, bell);
            ASSERT_GT(k, 0);
            next_out = static_cast<std::uint8_t>(next_out - (out.size() - static_cast<std::size_t>(k)));
            for (;;) {
                iovec rv[3] = {{in.data(), 1}, {in.data() + 1, 2000}, {in.data() + 2001, in.size() - 2001}};
                ssize_t g = r.read(rv, 3);
                ASSERT_GE(g, 0);
                if (g == 0)
                    break;
                for (ssize_t i = 0; i < g; ++i)
                    ASSERT_EQ(in[static_cast<std::size_t>(i)], next_in++) << "byte " << moved + i;
                moved += static_cast<std::size_t>(g);
            }
        }
    }
}

TEST(tcp_ring, a_full_ring_takes_what_fits_then_nothing_until_the_reader_frees_room)
{
    rings rs;
    ASSERT_TRUE(rs.listener && rs.client);
    std::vector<std::byte> big(cap + 100, std::byte{7});
    EXPECT_EQ(put(*rs.client, big.data(), big.size()), static_cast<ssize_t>(cap));
    EXPECT_EQ(put(*rs.client, big.data(), 1), 0) << "full";
    EXPECT_EQ(get(*rs.listener, big.data(), 100), 100);
    EXPECT_EQ(put(*rs.client, big.data(), big.size()), 100);
    EXPECT_FALSE(rs.listener->rx_empty());
}

TEST(tcp_ring, the_writer_rings_once_for_each_time_the_reader_goes_to_sleep)
{
    rings rs;
    ASSERT_TRUE(rs.listener && rs.client);
    std::byte b[64]{};
    bool bell = false;
    // A reader starts asleep: the first frames wake whoever waits on the socket.
    ASSERT_EQ(put(*rs.listener, b, 8, &bell), 8);
    EXPECT_TRUE(bell);
    ASSERT_EQ(put(*rs.listener, b, 8, &bell), 8);
    EXPECT_FALSE(bell) << "one doorbell per sleep";
    // Bytes waiting: a reader about to sleep is told to read them instead.
    EXPECT_TRUE(rs.client->reader_waits());
    ASSERT_EQ(get(*rs.client, b, sizeof b), 16);
    EXPECT_FALSE(rs.client->reader_waits());
    ASSERT_EQ(put(*rs.listener, b, 8, &bell), 8);
    EXPECT_TRUE(bell);
    // A reader that polls and never sleeps is never rung.
    ASSERT_EQ(get(*rs.client, b, sizeof b), 8);
    ASSERT_EQ(put(*rs.listener, b, 8, &bell), 8);
    EXPECT_FALSE(bell);
}

TEST(tcp_ring, indices_of_the_peer_out_of_range_fail_with_eproto)
{
    std::byte b[64]{};
    {
        SCOPED_TRACE("a tail more than a ring ahead of the reader");
        rings rs;
        ASSERT_TRUE(rs.client && rs.raw);
        rs.store(tail_at(0), cap + 1);
        errno = 0;
        EXPECT_EQ(get(*rs.client, b, sizeof b), -1);
        EXPECT_EQ(errno, EPROTO);
        EXPECT_FALSE(rs.client->rx_empty()) << "so that a reader looks and meets the error";
    }
    {
        SCOPED_TRACE("a tail that went backwards");
        rings rs;
        ASSERT_TRUE(rs.client && rs.raw);
        ASSERT_EQ(put(*rs.listener, b, 10), 10);
        ASSERT_EQ(get(*rs.client, b, sizeof b), 10);
        rs.store(tail_at(0), 5);
        errno = 0;
        EXPECT_EQ(get(*rs.client, b, sizeof b), -1);
        EXPECT_EQ(errno, EPROTO);
    }
    {
        SCOPED_TRACE("a head past what was written");
        rings rs;
        ASSERT_TRUE(rs.client && rs.raw);
        ASSERT_EQ(put(*rs.client, b, 10), 10);
        rs.store(head_at(1), 11);
        // The writer looks at the head when the room it saw last is not enough.
        std::vector<std::byte> big(cap);
        errno = 0;
        EXPECT_EQ(put(*rs.client, big.data(), big.size()), -1);
        EXPECT_EQ(errno, EPROTO);
    }
    {
        SCOPED_TRACE("a head that went backwards");
        rings rs;
        ASSERT_TRUE(rs.client && rs.raw);
        std::vector<std::byte> big(cap);
        ASSERT_EQ(put(*rs.client, big.data(), big.size()), static_cast<ssize_t>(cap));
        ASSERT_EQ(get(*rs.listener, big.data(), 100), 100);
        ASSERT_EQ(put(*rs.client, big.data(), 100), 100) << "the room the reader made";
        rs.store(head_at(1), 50);
        errno = 0;
        EXPECT_EQ(put(*rs.client, big.data(), 1), -1);
        EXPECT_EQ(errno, EPROTO);
    }
    {
        SCOPED_TRACE("the reader's own head, rewritten by the peer, is not believed");
        rings rs;
        ASSERT_TRUE(rs.client && rs.raw);
        ASSERT_EQ(put(*rs.listener, b, 10), 10);
        rs.store(head_at(0), 0xffff'0000);
        EXPECT_EQ(get(*rs.client, b, sizeof b), 10) << "what the writer wrote, no more";
        EXPECT_EQ(get(*rs.client, b, sizeof b), 0);
    }
}

TEST(tcp_ring, a_memfd_that_could_be_resized_or_has_another_size_is_refused)
{
    std::string why;
    {
        unique_fd m(::memfd_create("unsealed", MFD_CLOEXEC));
        ASSERT_TRUE(m);
        ASSERT_EQ(::ftruncate(m.get(), byte_ring_pair::map_size), 0);
        EXPECT_EQ(byte_ring_pair::adopt(m.get(), why), nullptr);
        EXPECT_NE(why.find("sealed"), std::string::npos) << why;
    }
    {
        // Shrinking and growing sealed, the seals themselves not: a peer could still add
        // write seals, but not resize; rdmx asks for all three all the same.
        unique_fd m(::memfd_create("open-seals", MFD_CLOEXEC | MFD_ALLOW_SEALING));
        ASSERT_TRUE(m);
        ASSERT_EQ(::ftruncate(m.get(), byte_ring_pair::map_size), 0);
        ASSERT_EQ(::fcntl(m.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
        why.clear();
        EXPECT_EQ(byte_ring_pair::adopt(m.get(), why), nullptr);
        EXPECT_NE(why.find("sealed"), std::string::npos) << why;
    }
    {
        unique_fd m(::memfd_create("small", MFD_CLOEXEC | MFD_ALLOW_SEALING));
        ASSERT_TRUE(m);
        ASSERT_EQ(::ftruncate(m.get(), byte_ring_pair::map_size / 2), 0);
        ASSERT_EQ(::fcntl(m.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
        why.clear();
        EXPECT_EQ(byte_ring_pair::adopt(m.get(), why), nullptr);
        EXPECT_NE(why.find("size"), std::string::npos) << why;
    }
    {
        int p[2];
        ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
        unique_fd r(p[0]), w(p[1]);
        why.clear();
        EXPECT_EQ(byte_ring_pair::adopt(r.get(), why), nullptr) << "a pipe";
    }
}

class shm_rings : public tcp_loopback
{
protected:
    shm_rings() { b_ = backend::shm; }

    static bool rings_of(connection& c) { return static_cast<tcp::tcp_connection&>(c).engine().uses_rings(); }

    /// A raw client that offers rings: its socket, the ACCEPT, and the memfd that came.
    std::unique_ptr<connection> accept_ring_peer(int& fd, handshake& reply, unique_fd& memfd,
                                                 const connection_options& opts = {})
    {
        fd = raw_dial();
        EXPECT_GE(fd, 0);
        handshake h;
        h.type = handshake_type::hello;
        h.max_rd_atomic = 16;
        h.flags = tcp::handshake_flag_goodbye | tcp::handshake_flag_ring;
        std::byte out[handshake::reply_size];
        h.encode(out);
        EXPECT_TRUE(send_all(fd, out, handshake::hello_size));
        auto req = listener_->get_request(5s);
        EXPECT_NE(req, nullptr);
        if (!req)
            return nullptr;
        auto c = req->accept(opts);
        std::byte buf[handshake::reply_size];
        EXPECT_EQ(tcp::recv_with_fd(fd, buf, memfd, MSG_WAITALL), static_cast<ssize_t>(sizeof buf));
        auto r = handshake::decode(buf, false);
        EXPECT_TRUE(r && r->type == handshake_type::accept);
        if (r)
            reply = *r;
        return c;
    }
};

TEST_F(shm_rings, rdmx_peers_take_rings_and_a_peer_that_does_not_offer_them_gets_the_socket)
{
    auto [client, server] = connect_pair();
    ASSERT_NE(server, nullptr);
    EXPECT_TRUE(rings_of(*client));
    EXPECT_TRUE(rings_of(*server));

    int fd;
    ASSERT_TRUE(accept_raw(fd) != nullptr) << "a HELLO without the ring flag is accepted as before";
    ::close(fd);
}

TEST_F(shm_rings, a_raw_peer_gets_a_sealed_memfd_and_a_corrupt_index_fails_only_its_connection)
{
    // A second, well-behaved connection on the same listener keeps working throughout.
    auto [client, server] = connect_pair();
    ASSERT_NE(server, nullptr);

    int fd;
    handshake reply;
    unique_fd memfd;
    auto c = accept_ring_peer(fd, reply, memfd);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(reply.flags, tcp::handshake_flag_goodbye | tcp::handshake_flag_ring);
    ASSERT_TRUE(memfd) << "the ACCEPT that grants rings brings the memfd";
    EXPECT_TRUE(rings_of(*c));
    const int seals = ::fcntl(memfd.get(), F_GET_SEALS);
    EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    EXPECT_EQ(::ftruncate(memfd.get(), 0), -1) << "the peer cannot shrink it under the listener";

    // The client's ring (1): a tail two rings ahead of what the listener read, and a
    // doorbell so that it looks.
    raw_rings peer(memfd.get());
    ASSERT_TRUE(peer);
    peer.store(tail_at(1), 2 * cap);
    const char bell = 0;
    ASSERT_EQ(::send(fd, &bell, 1, MSG_NOSIGNAL), 1);
    for (auto deadline = std::chrono::steady_clock::now() + 5s;
         c->state() == connection_state::established && std::chrono::steady_clock::now() < deadline;)
        std::this_thread::sleep_for(1ms);
    EXPECT_EQ(c->state(), connection_state::error) << to_string(c->state());
    EXPECT_EQ(c->last_error(), errc::protocol_error) << c->last_error().message();
    ::close(fd);

    // The other connection is untouched.
    std::vector<std::byte> src(64, std::byte{0x5a}), dst(64);
    auto sm = client_dom_->register_memory(src.data(), src.size(), access::none);
    auto dm = server_dom_->register_memory(dst.data(), dst.size(), access::local_write);
    sge rs{dm.get(), 0, dst.size()}, ws{sm.get(), 0, src.size()};
    recv_request rr{.wr_id = 1, .local = {&rs, 1}};
    ASSERT_FALSE(server->post_recv({&rr, 1}));
    work_request wr{.opcode = opcode::send, .wr_id = 2, .local = {&ws, 1}, .flags = send_flags::signaled};
    ASSERT_FALSE(client->post({&wr, 1}));
    completion got[4];
    std::size_t k = 0;
    for (auto deadline = std::chrono::steady_clock::now() + 5s;
         k == 0 && std::chrono::steady_clock::now() < deadline;)
        k = server->wait(got, 100ms);
    ASSERT_EQ(k, 1u);
    EXPECT_FALSE(got[0].status) << got[0].status.message();
    EXPECT_EQ(dst, src);
}

TEST_F(shm_rings, a_raw_peer_on_the_documented_layout_is_served_and_a_doorbell_flood_is_only_bytes)
{
    // docs/wire-format.md section 12, by hand: a zero-length WRITE into ring 1 (the
    // client's), its tail published, after 64 KiB of doorbell bytes; the ACK comes back
    // through ring 0.
    int fd;
    handshake reply;
    unique_fd memfd;
    auto c = accept_ring_peer(fd, reply, memfd);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(memfd);
    raw_rings peer(memfd.get());
    ASSERT_TRUE(peer);

    std::vector<char> flood(64 << 10, 'x');
    ASSERT_TRUE(send_all(fd, flood.data(), flood.size()));
    frame_header h;
    h.op = frame_op::write;
    h.seq = 0;
    h.encode(peer.data(1));
    peer.tail(1).store(frame_header::wire_size, std::memory_order_release);
    const char bell = 0;
    ASSERT_EQ(::send(fd, &bell, 1, MSG_NOSIGNAL), 1);

    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (peer.tail(0).load(std::memory_order_acquire) < frame_header::wire_size &&
           std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    ASSERT_GE(peer.tail(0).load(std::memory_order_acquire), frame_header::wire_size) << "no frame back";
    frame_header r;
    ASSERT_FALSE(frame_header::decode(peer.data(0), r));
    EXPECT_EQ(r.op, frame_op::ack);
    EXPECT_EQ(r.seq, 0u);
    EXPECT_EQ(c->state(), connection_state::established);
    ::close(fd);
}

TEST_F(shm_rings,
       a_shared_queue_poll_reads_frames_no_doorbell_announced_and_a_poller_gone_leaves_the_ring_to_the_engine)
{
    // A connection on a shared queue: the queue's polls look at its ring themselves
    // (domain_progress::run), not only at sockets that doorbells made readable. With the
    // server's engine thread held, a raw peer writes frames and never rings: the polls
    // alone read them and answer. Then the polls stop and the engine thread goes on: it
    // raises the wake flag, and the doorbell that the next frame rings by the documented
    // rule is read with nobody polling.
    auto cq = server_dom_->create_completion_queue({.depth = 1024});
    connection_options opts;
    opts.send_cq = opts.recv_cq = cq;
    int fd;
    handshake reply;
    unique_fd memfd;
    auto c = accept_ring_peer(fd, reply, memfd, opts);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(memfd);
    raw_rings peer(memfd.get());
    ASSERT_TRUE(peer);
    // Zero-length WRITEs (nothing to complete here), each answered by an ACK in ring 0.
    auto write_frame = [&](std::uint32_t seq) {
        frame_header h;
        h.op = frame_op::write;
        h.seq = seq;
        h.encode(peer.data(1) + seq * frame_header::wire_size);
        peer.tail(1).store((seq + 1) * frame_header::wire_size, std::memory_order_release);
    };
    auto acked = [&](std::uint32_t seq) { // an ACK of `seq` or later in ring 0 (header-sized frames)
        const std::uint64_t end = peer.tail(0).load(std::memory_order_acquire);
        for (std::uint64_t at = 0; at + frame_header::wire_size <= end; at += frame_header::wire_size) {
            frame_header r;
            if (frame_header::decode(peer.data(0) + at, r) || r.op != frame_op::ack)
                return false;
            if (r.seq >= seq)
                return true;
        }
        return false;
    };

    engine_hold hold(*server_dom_);

    completion got[4];
    const std::uint32_t frames = 50;
    for (std::uint32_t seq = 0; seq < frames; ++seq) {
        write_frame(seq); // no doorbell, whatever the flag says
        auto deadline = std::chrono::steady_clock::now() + 5s;
        while (!acked(seq) && std::chrono::steady_clock::now() < deadline)
            EXPECT_EQ(cq->poll(got), 0u);
        ASSERT_TRUE(acked(seq)) << "frame " << seq << " was not read by the queue's polls";
    }
    EXPECT_EQ(c->state(), connection_state::established);

    // The polls stop, the engine thread goes on: the flag goes up (the engine drains the
    // socket and raises it whenever it finds its ring empty), then a frame and its doorbell.
    hold.release();
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (peer.wake(1).load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    ASSERT_NE(peer.wake(1).exchange(0), 0u) << "nobody asked for a doorbell once the polls stopped";
    write_frame(frames);
    const char bell = 0;
    ASSERT_EQ(::send(fd, &bell, 1, MSG_NOSIGNAL), 1);
    deadline = std::chrono::steady_clock::now() + 5s;
    while (!acked(frames) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(acked(frames)) << "the doorbell woke nobody";
    EXPECT_EQ(c->state(), connection_state::established);
    ::close(fd);
}

} // namespace
} // namespace rdmx::test
