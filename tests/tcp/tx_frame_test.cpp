// The transmit side's frames (lib/tcp/tcp_tx_frame.hpp) without a socket: a batch that
// takes a frame out again, and the frame on the wire with the copy of its rest.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "tcp/tcp_tx_frame.hpp"

namespace rdmx::tcp
{
namespace
{

// A region as the engine sees it: live under `tag` until revoked.
struct region {
    region_state st;
    explicit region(std::uint64_t tag) { st.tag.store(tag); }
    std::uint32_t users() const { return st.users.load(); }
};

void add_piece(tx_batch& b, region& r, std::uint64_t tag)
{
    ASSERT_TRUE(pin(&r.st, tag));
    b.pinned[b.npinned++] = &r.st;
    b.iov[b.niov++] = {nullptr, 8};
}

TEST(tcp_tx_batch, a_frame_taken_out_again_leaves_the_batch_as_it_was)
{
    region a(1), revoked(2);
    tx_batch b;
    b.reset();
    // One frame in whole, then one whose memory goes while it is added.
    b.items[b.nitems++] = {.kind = frame_kind::response, .pos = 0, .skip = 0, .added = 48, .total = 48};
    add_piece(b, a, 1);
    const tx_batch::mark m = b.checkpoint();
    b.items[b.nitems++] = {.kind = frame_kind::request, .pos = 7, .skip = 0, .added = 0, .total = 100};
    add_piece(b, revoked, 2);
    add_piece(b, revoked, 2);
    b.revoked = b.closed = true;
    ASSERT_EQ(revoked.users(), 2u);
    b.rollback(m);
    EXPECT_EQ(revoked.users(), 0u) << "the withdrawn frame's memory stayed pinned";
    EXPECT_EQ(a.users(), 1u) << "the frame before it lost its pin";
    EXPECT_EQ(b.nitems, 1);
    EXPECT_EQ(b.niov, 1);
    EXPECT_EQ(b.npinned, 1);
    EXPECT_FALSE(b.closed) << "the batch stays closed after the frame went";
    EXPECT_FALSE(b.revoked);
    b.unpin_all();
    EXPECT_EQ(a.users(), 0u);
    EXPECT_EQ(b.npinned, 0);
}

TEST(tcp_tx_batch, a_new_batch_keeps_its_chunks_but_not_their_claims)
{
    tx_batch b;
    std::byte chunk[16];
    b.chunks[0].p = chunk;
    b.chunks[0].fill = 16;
    b.chunks[0].in_batch = true;
    b.niov = 3;
    b.nitems = 2;
    b.closed = b.stage_failed = true;
    region r(5);
    b.cut_st = &r.st;
    b.reset();
    EXPECT_EQ(b.niov, 0);
    EXPECT_EQ(b.nitems, 0);
    EXPECT_FALSE(b.closed);
    EXPECT_FALSE(b.stage_failed);
    EXPECT_EQ(b.cut_st, nullptr);
    EXPECT_EQ(b.chunks[0].p, chunk) << "a chunk (and the copy it holds) was dropped between batches";
    EXPECT_EQ(b.chunks[0].fill, 16u);
    EXPECT_FALSE(b.chunks[0].in_batch) << "the new batch does not send from it yet";
}

TEST(tcp_wire_frame, a_frame_sent_in_part_stays_on_the_wire_until_its_last_byte)
{
    wire_frame w;
    EXPECT_FALSE(w.busy());
    const tx_item it{.kind = frame_kind::request, .pos = 3, .skip = 0, .added = 30, .total = 140};
    w.sent_part(it, 30);
    ASSERT_TRUE(w.busy());
    EXPECT_EQ(w.item().pos, 3u);
    EXPECT_EQ(w.item().skip, 30u) << "where the next batch resumes it";
    EXPECT_TRUE(w.item().was_current);
    w.sent_part(w.item(), 90);
    EXPECT_EQ(w.item().skip, 90u);
    w.finished();
    EXPECT_FALSE(w.busy());
}

TEST(tcp_wire_frame, the_copy_of_its_rest_lives_as_long_as_the_frame)
{
    wire_frame w;
    w.sent_part({.kind = frame_kind::response, .pos = 1, .skip = 0, .added = 50, .total = 1040}, 50);
    EXPECT_EQ(w.copy(), nullptr);
    auto rest = std::make_unique<std::byte[]>(1000);
    std::memset(rest.get(), 0x5a, 1000);
    w.keep_copy(std::move(rest), 50);
    ASSERT_NE(w.copy(), nullptr);
    EXPECT_EQ(w.copy_from(), 50u);
    w.sent_part(w.item(), 500); // more went out: the copy stays for the rest
    ASSERT_NE(w.copy(), nullptr);
    EXPECT_EQ(w.copy()[999], std::byte{0x5a});
    w.finished();
    EXPECT_EQ(w.copy(), nullptr) << "the next frame would send the previous frame's copy";
}

} // namespace
} // namespace rdmx::tcp
