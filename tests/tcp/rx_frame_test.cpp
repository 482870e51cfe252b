// Receive framing's parts (lib/tcp/tcp_rx_frame.hpp) without a socket: the stage that reads
// run ahead into, and the frame being received walking its destination as bytes arrive.
#include <gtest/gtest.h>

#include <vector>

#include "tcp/tcp_rx_frame.hpp"

namespace rdmx::tcp
{
namespace
{

// Fills `room` with bytes 0, 1, 2, ... from `first` on, as a read would; returns how many.
std::size_t fill(std::span<std::byte> room, std::size_t n, std::uint8_t first)
{
    for (std::size_t i = 0; i < n; ++i)
        room[i] = static_cast<std::byte>(first + i);
    return n;
}

TEST(tcp_rx_stage, a_partial_header_moves_to_the_front_before_the_next_read)
{
    rx_stage st;
    auto room = st.room_after();
    ASSERT_EQ(room.size(), rx_stage::size);
    st.filled(fill(room, 100, 0));
    st.consume(90); // frames taken; 10 bytes of the next header are left
    ASSERT_EQ(st.staged(), 10u);
    EXPECT_EQ(st.data()[0], std::byte{90});
    room = st.room_after();
    EXPECT_EQ(room.size(), rx_stage::size - 10) << "the partial header was not moved to the front";
    EXPECT_EQ(st.data()[0], std::byte{90}) << "moving lost the header's first byte";
    EXPECT_EQ(st.data()[9], std::byte{99});
    st.filled(fill(room, 6, 100));
    ASSERT_EQ(st.staged(), 16u);
    for (std::size_t i = 0; i < 16; ++i)
        EXPECT_EQ(st.data()[i], static_cast<std::byte>(90 + i)) << "byte " << i;
}

TEST(tcp_rx_stage, an_emptied_stage_starts_again_at_its_front)
{
    rx_stage st;
    st.filled(fill(st.room_after(), 40, 0));
    st.consume(15);
    st.consume(25);
    EXPECT_EQ(st.staged(), 0u);
    EXPECT_EQ(st.room_after().size(), rx_stage::size) << "consumed bytes still took room";
}

TEST(tcp_rx_stage, a_read_ahead_replaces_the_stage_with_what_it_brought)
{
    rx_stage st;
    auto ahead = st.empty_for_read_ahead();
    ASSERT_EQ(ahead.size(), rx_stage::size);
    EXPECT_EQ(st.staged(), 0u);
    st.read_ahead_took(fill(ahead, 30, 7));
    ASSERT_EQ(st.staged(), 30u);
    EXPECT_EQ(st.data()[0], std::byte{7});
    // A read that did not reach the stage brought nothing.
    st.empty_for_read_ahead();
    st.read_ahead_took(0);
    EXPECT_EQ(st.staged(), 0u);
}

TEST(tcp_rx_frame, begin_forgets_the_previous_frame)
{
    std::byte mem[8];
    seg s{nullptr, 0, mem, sizeof mem};
    rx_frame f;
    frame_header h{};
    h.op = frame_op::write;
    h.length = 8;
    f.begin(h);
    f.into_one(rx_action::write, s);
    f.fault = true;
    f.advance(5);
    frame_header next{};
    next.op = frame_op::ack;
    f.begin(next);
    EXPECT_EQ(f.action, rx_action::none);
    EXPECT_EQ(f.left, 0u);
    EXPECT_EQ(f.segs, nullptr);
    EXPECT_EQ(f.nseg, 0u);
    EXPECT_EQ(f.seg_i, 0u);
    EXPECT_EQ(f.seg_off, 0u);
    EXPECT_FALSE(f.fault) << "a fault of one frame carried over to the next";
    EXPECT_EQ(f.hdr.op, frame_op::ack);
}

TEST(tcp_rx_frame, the_position_walks_segments_in_pieces_of_any_size)
{
    std::vector<std::byte> mem(40);
    const seg segs[] = {
        {nullptr, 0, mem.data(), 7}, {nullptr, 0, mem.data() + 7, 1}, {nullptr, 0, mem.data() + 8, 32}};
    frame_header h{};
    h.op = frame_op::send;
    h.length = 40;
    rx_frame f;
    f.begin(h);
    ASSERT_EQ(f.left, 40u);
    f.into(rx_action::recv, segs, 3);
    ASSERT_TRUE(f.to_memory());
    // Bytes arrive 3 at a time: the position is always byte k of the list.
    for (std::uint64_t k = 0; k < 40; k += 3) {
        const std::uint64_t n = std::min<std::uint64_t>(3, 40 - k);
        f.advance(n);
        f.left -= n;
        const std::uint64_t at = k + n;
        std::uint64_t i = 0, off = at;
        while (i < 3 && off >= segs[i].len) {
            off -= segs[i].len;
            ++i;
        }
        EXPECT_EQ(f.seg_i, i) << "after " << at << " bytes";
        EXPECT_EQ(f.seg_off, off) << "after " << at << " bytes";
    }
    EXPECT_EQ(f.left, 0u);
    EXPECT_EQ(f.seg_i, 3u);
    f.advance(5); // past the end (a caller's bug) stays at the end
    EXPECT_EQ(f.seg_i, 3u);
    EXPECT_EQ(f.seg_off, 0u);
}

TEST(tcp_rx_frame, operands_are_the_destination_of_atomics_and_their_answers)
{
    rx_frame f;
    frame_header h{};
    h.op = frame_op::compare_swap_req;
    h.length = compare_swap_payload;
    f.begin(h);
    f.into_operands(rx_action::atomic, h.length);
    ASSERT_EQ(f.nseg, 1u);
    EXPECT_EQ(f.segs[0].ptr, f.operands.data());
    EXPECT_EQ(f.segs[0].len, compare_swap_payload);
    EXPECT_EQ(f.segs[0].st, nullptr) << "the operands are the engine's memory, no region's";
    EXPECT_TRUE(f.to_memory());
    f.into_operands(rx_action::atomic_resp, atomic_resp_payload);
    EXPECT_EQ(f.segs[0].len, atomic_resp_payload);
}

TEST(tcp_rx_frame, payloads_that_are_drained_are_not_kept)
{
    rx_frame f;
    for (rx_action a :
         {rx_action::none, rx_action::recv_overflow, rx_action::rnr, rx_action::drop, rx_action::write_bad}) {
        f.action = a;
        EXPECT_FALSE(f.to_memory()) << static_cast<int>(a);
    }
    for (rx_action a : {rx_action::recv, rx_action::write, rx_action::write_imm, rx_action::read_resp,
                        rx_action::atomic, rx_action::atomic_resp}) {
        f.action = a;
        EXPECT_TRUE(f.to_memory()) << static_cast<int>(a);
    }
}

TEST(tcp_rx_frame, staged_work_is_a_whole_header_or_payload_bytes)
{
    rx_stage st;
    rx_frame f;
    EXPECT_FALSE(staged_work(st, f)) << "an empty stage";
    st.filled(fill(st.room_after(), frame_header::wire_size - 1, 0));
    EXPECT_FALSE(staged_work(st, f)) << "part of a header is no work without a read";
    st.filled(fill(st.room_after(), 1, 0));
    EXPECT_TRUE(staged_work(st, f)) << "a whole header";
    st.consume(frame_header::wire_size);
    st.filled(fill(st.room_after(), 1, 0));
    f.action = rx_action::write;
    EXPECT_TRUE(staged_work(st, f)) << "one byte of a payload";
}

} // namespace
} // namespace rdmx::tcp
