// The TCP wire codec: exact layout (docs/wire-format.md) and rejection of anything malformed.
#include <gtest/gtest.h>

#include <cstring>

#include <rdmx/error.hpp>

#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{
namespace
{

TEST(tcp_wire, header_layout_is_little_endian_40_bytes)
{
    frame_header h;
    h.op = frame_op::write_imm;
    h.flags = flag_solicited;
    h.imm = 0x11223344;
    h.seq = 0x0102030405060708ull;
    h.addr = 0xa1a2a3a4a5a6a7a8ull;
    h.key = 0xb1b2b3b4b5b6b7b8ull;
    h.length = 0x00c0ffee;
    frame_header::bytes b;
    h.encode(b.data());
    const unsigned char expect[40] = {3,    1,    0,    0,    0x44, 0x33, 0x22, 0x11, // op flags rsvd imm
                                      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // seq
                                      0xa8, 0xa7, 0xa6, 0xa5, 0xa4, 0xa3, 0xa2, 0xa1, // addr
                                      0xb8, 0xb7, 0xb6, 0xb5, 0xb4, 0xb3, 0xb2, 0xb1, // key
                                      0xee, 0xff, 0xc0, 0x00, 0,    0,    0,    0};   // length status
    EXPECT_EQ(0, std::memcmp(b.data(), expect, 40));
    frame_header d;
    ASSERT_FALSE(frame_header::decode(b.data(), d));
    EXPECT_EQ(d.op, h.op);
    EXPECT_EQ(d.flags, h.flags);
    EXPECT_EQ(d.imm, h.imm);
    EXPECT_EQ(d.seq, h.seq);
    EXPECT_EQ(d.addr, h.addr);
    EXPECT_EQ(d.key, h.key);
    EXPECT_EQ(d.length, h.length);
    EXPECT_EQ(d.payload_length(), h.length);
    EXPECT_TRUE(d.is_request());
}

TEST(tcp_wire, payload_length_per_opcode)
{
    frame_header h;
    h.length = 100;
    for (auto op : {frame_op::send, frame_op::write, frame_op::write_imm, frame_op::read_resp}) {
        h.op = op;
        EXPECT_EQ(h.payload_length(), 100u);
    }
    h.op = frame_op::read_req;
    EXPECT_EQ(h.payload_length(), 0u) << "a read request carries the wanted length, not a payload";
    EXPECT_TRUE(h.is_request());
    h.op = frame_op::ack;
    EXPECT_FALSE(h.is_request());
}

std::error_code decode_bytes(frame_header::bytes b)
{
    frame_header d;
    return frame_header::decode(b.data(), d);
}

frame_header::bytes encoded(const frame_header& h)
{
    frame_header::bytes b;
    h.encode(b.data());
    return b;
}

TEST(tcp_wire, rejects_malformed_headers)
{
    frame_header ok;
    ok.op = frame_op::send;
    ok.length = 10;
    EXPECT_FALSE(decode_bytes(encoded(ok)));

    auto b = encoded(ok);
    b[0] = std::byte{0};
    EXPECT_EQ(decode_bytes(b), errc::protocol_error) << "opcode 0";
    b[0] = std::byte{99};
    EXPECT_EQ(decode_bytes(b), errc::protocol_error) << "unknown opcode";
    b = encoded(ok);
    b[2] = std::byte{1};
    EXPECT_EQ(decode_bytes(b), errc::protocol_error) << "reserved bits";
    b = encoded(ok);
    b[1] = std::byte{0x80};
    EXPECT_EQ(decode_bytes(b), errc::protocol_error) << "unknown flag";

    frame_header big = ok;
    big.length = max_frame_payload + 1;
    EXPECT_EQ(decode_bytes(encoded(big)), errc::protocol_error) << "over the frame limit";
    big.length = 0xffffffffu;
    EXPECT_EQ(decode_bytes(encoded(big)), errc::protocol_error);
    big.length = max_frame_payload;
    EXPECT_FALSE(decode_bytes(encoded(big))) << "exactly the limit is fine";

    frame_header ack;
    ack.op = frame_op::ack;
    ack.seq = 5;
    EXPECT_FALSE(decode_bytes(encoded(ack)));
    ack.length = 4;
    EXPECT_EQ(decode_bytes(encoded(ack)), errc::protocol_error) << "an ack has no payload";
    ack.length = 0;
    ack.key = 1;
    EXPECT_EQ(decode_bytes(encoded(ack)), errc::protocol_error) << "unused fields must be zero";

    frame_header nak;
    nak.op = frame_op::nak;
    nak.status = static_cast<std::uint32_t>(nak_code::remote_access);
    EXPECT_FALSE(decode_bytes(encoded(nak)));
    nak.status = 0;
    EXPECT_EQ(decode_bytes(encoded(nak)), errc::protocol_error) << "nak without a code";
    nak.status = 77;
    EXPECT_EQ(decode_bytes(encoded(nak)), errc::protocol_error) << "unknown nak code";

    frame_header req = ok;
    req.status = 1;
    EXPECT_EQ(decode_bytes(encoded(req)), errc::protocol_error) << "status on a request";
}

TEST(tcp_wire, every_single_byte_opcode_either_decodes_or_is_rejected)
{
    for (int op = 0; op < 256; ++op) {
        frame_header::bytes b{};
        b[0] = static_cast<std::byte>(op);
        frame_header d;
        auto ec = frame_header::decode(b.data(), d);
        bool known = op == 1 || op == 2 || op == 3 || op == 4 || op == 16 || op == 17;
        // nak (18) needs a code, so an all-zero nak is rejected as well.
        EXPECT_EQ(!ec, known) << "opcode " << op;
    }
}

TEST(tcp_wire, handshake_round_trip)
{
    handshake h;
    h.type = handshake_type::hello;
    h.max_rd_atomic = 16;
    const char* msg = "hello from client";
    h.private_data_len = static_cast<std::uint8_t>(std::strlen(msg));
    std::memcpy(h.private_data.data(), msg, h.private_data_len);
    std::byte buf[handshake::reply_size];
    ASSERT_EQ(h.wire_size(), 72u);
    h.encode(buf);
    EXPECT_EQ(0, std::memcmp(buf, "RDXT", 4));
    EXPECT_EQ(buf[4], std::byte{1}) << "version";
    EXPECT_EQ(buf[5], std::byte{1}) << "hello";
    auto d = handshake::decode({buf, handshake::hello_size}, true);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->max_rd_atomic, 16u);
    ASSERT_EQ(d->data().size(), std::strlen(msg));
    EXPECT_EQ(0, std::memcmp(d->data().data(), msg, std::strlen(msg)));
    EXPECT_FALSE(handshake::decode({buf, handshake::hello_size}, false)) << "a hello is not a reply";
    EXPECT_FALSE(handshake::decode({buf, handshake::hello_size - 1}, true)) << "truncated";

    handshake r;
    r.type = handshake_type::reject;
    r.private_data_len = 148;
    ASSERT_EQ(r.wire_size(), 212u);
    r.encode(buf);
    EXPECT_TRUE(handshake::decode({buf, handshake::reply_size}, false));
    buf[6] = std::byte{149};
    EXPECT_FALSE(handshake::decode({buf, handshake::reply_size}, false)) << "reject data over 148";
    r.type = handshake_type::accept;
    r.private_data_len = 196;
    r.encode(buf);
    EXPECT_TRUE(handshake::decode({buf, handshake::reply_size}, false));
    buf[0] = std::byte{'X'};
    EXPECT_FALSE(handshake::decode({buf, handshake::reply_size}, false)) << "bad magic";
    r.encode(buf);
    buf[4] = std::byte{2};
    EXPECT_FALSE(handshake::decode({buf, handshake::reply_size}, false)) << "other version";

    handshake big;
    big.type = handshake_type::hello;
    big.private_data_len = 57;
    big.encode(buf);
    EXPECT_FALSE(handshake::decode({buf, handshake::hello_size}, true)) << "hello data over 56";
}

} // namespace
} // namespace rdmx::tcp
