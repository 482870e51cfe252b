// The TCP wire codec: exact layout (docs/wire-format.md) and rejection of anything malformed.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

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
        bool known = op == 1 || op == 2 || op == 3 || op == 4 || op == 7 || op == 16 || op == 17 ||
                     op == 19 || op == 21;
        // nak (18) needs a code, so an all-zero nak is rejected as well; goodbye (19) is
        // all zero but its opcode. The atomic frames (5, 6, 20) need their payload length,
        // the CMA requests (8, 9, 10) at least one descriptor.
        EXPECT_EQ(!ec, known) << "opcode " << op;
    }
}

TEST(tcp_wire, cma_frames_carry_whole_descriptors_and_the_read_response_no_payload)
{
    for (auto op : {frame_op::write_cma, frame_op::write_imm_cma, frame_op::read_cma_req}) { // send_cma below
        frame_header h;
        h.op = op;
        h.addr = 0x1000;
        h.key = 7;
        for (std::uint32_t n : {1u, 2u, 32u}) {
            h.length = n * cma_descriptor_size;
            EXPECT_FALSE(decode_bytes(encoded(h))) << static_cast<int>(op) << ": " << n << " descriptors";
            EXPECT_EQ(h.payload_length(), h.length) << "the payload is the descriptors";
            EXPECT_TRUE(h.is_request());
            EXPECT_TRUE(is_cma_request(op));
        }
        for (std::uint32_t len : {0u, 8u, 17u, 33 * cma_descriptor_size}) {
            h.length = len;
            EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error)
                << static_cast<int>(op) << ": length " << len;
        }
        h.length = cma_descriptor_size;
        h.imm = 5;
        EXPECT_EQ(!decode_bytes(encoded(h)), op == frame_op::write_imm_cma) << "imm only with write_imm_cma";
        h.imm = 0;
        h.flags = flag_solicited;
        EXPECT_EQ(!decode_bytes(encoded(h)), op == frame_op::write_imm_cma)
            << "solicited only with write_imm_cma";
    }
    frame_header sc;
    sc.op = frame_op::send_cma;
    sc.length = 2 * cma_descriptor_size;
    sc.flags = flag_solicited;
    EXPECT_FALSE(decode_bytes(encoded(sc))) << "a send by CMA may be solicited";
    EXPECT_TRUE(is_cma_request(frame_op::send_cma));
    sc.key = 1;
    EXPECT_EQ(decode_bytes(encoded(sc)), errc::protocol_error) << "a send by CMA names no key";
    sc.key = 0;
    sc.addr = 1;
    EXPECT_EQ(decode_bytes(encoded(sc)), errc::protocol_error) << "... and no address";
    EXPECT_FALSE(is_cma_request(frame_op::write));
    EXPECT_FALSE(is_cma_request(frame_op::read_req));

    frame_header r;
    r.op = frame_op::read_cma_resp;
    r.seq = 3;
    r.length = 1 << 20;
    EXPECT_FALSE(decode_bytes(encoded(r)));
    EXPECT_EQ(r.payload_length(), 0u) << "the target wrote the bytes itself: none follow";
    EXPECT_FALSE(r.is_request());
    r.key = 1;
    EXPECT_EQ(decode_bytes(encoded(r)), errc::protocol_error) << "unused response fields";

    frame_header nak;
    nak.op = frame_op::nak;
    nak.status = static_cast<std::uint32_t>(nak_code::cma_refused);
    EXPECT_FALSE(decode_bytes(encoded(nak)));
    nak.status = static_cast<std::uint32_t>(nak_code::cma_refused) + 1;
    EXPECT_EQ(decode_bytes(encoded(nak)), errc::protocol_error) << "unknown nak code";
}

TEST(tcp_wire, goodbye_carries_nothing_but_its_opcode)
{
    frame_header::bytes b{};
    frame_header{.op = frame_op::goodbye}.encode(b.data());
    frame_header d;
    ASSERT_FALSE(frame_header::decode(b.data(), d));
    EXPECT_EQ(d.op, frame_op::goodbye);
    EXPECT_EQ(d.payload_length(), 0u);
    EXPECT_FALSE(d.is_request());
    for (std::size_t at = 1; at < frame_header::wire_size; ++at) {
        auto bad = b;
        bad[at] = std::byte{1};
        EXPECT_TRUE(frame_header::decode(bad.data(), d)) << "byte " << at << " set in a goodbye";
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
    EXPECT_EQ(buf[4], std::byte{2}) << "version";
    EXPECT_EQ(handshake::peer_version(buf), 2);
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
    r.max_rd_atomic = 4;
    r.private_data_len = 196;
    r.encode(buf);
    EXPECT_TRUE(handshake::decode({buf, handshake::reply_size}, false));
    buf[0] = std::byte{'X'};
    EXPECT_FALSE(handshake::decode({buf, handshake::reply_size}, false)) << "bad magic";
    r.encode(buf);
    buf[4] = std::byte{1};
    EXPECT_FALSE(handshake::decode({buf, handshake::reply_size}, false)) << "version 1";
    EXPECT_EQ(handshake::peer_version(buf), 1);
    buf[4] = std::byte{3};
    EXPECT_FALSE(handshake::decode({buf, handshake::reply_size}, false)) << "version 3";
    r.type = handshake_type::reject;
    r.max_rd_atomic = 0;
    r.private_data_len = 0;
    r.flags = tcp::handshake_flag_goodbye;
    r.encode(buf);
    EXPECT_FALSE(handshake::decode({buf, handshake::reply_size}, false)) << "a REJECT with the GOODBYE flag";

    handshake big;
    big.type = handshake_type::hello;
    big.private_data_len = 57;
    big.encode(buf);
    EXPECT_FALSE(handshake::decode({buf, handshake::hello_size}, true)) << "hello data over 56";
}

TEST(tcp_wire, request_fields_an_opcode_does_not_use_must_be_zero)
{
    // docs/wire-format.md section 2: no field of a request is ignored.
    auto req = [](frame_op op) {
        frame_header h;
        h.op = op;
        h.seq = 1;
        h.length = 8;
        if (op != frame_op::send) {
            h.addr = 0x1000;
            h.key = 0xabc;
        }
        return h;
    };
    for (auto op : {frame_op::send, frame_op::write, frame_op::write_imm, frame_op::read_req}) {
        SCOPED_TRACE(static_cast<int>(op));
        EXPECT_FALSE(decode_bytes(encoded(req(op))));
        frame_header h = req(op);
        h.flags = flag_solicited;
        bool may_solicit = op == frame_op::send || op == frame_op::write_imm;
        EXPECT_EQ(!decode_bytes(encoded(h)), may_solicit) << "solicited only on send and write_imm";
        h = req(op);
        h.imm = 7;
        EXPECT_EQ(!decode_bytes(encoded(h)), op == frame_op::write_imm) << "imm only on write_imm";
        h = req(op);
        h.status = 1;
        EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "status on a request";
        for (int bit = 1; bit < 8; ++bit) { // no fence bit, nor any other: the fence is local
            h = req(op);
            h.flags = static_cast<std::uint8_t>(1u << bit);
            EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "flag bit " << bit;
        }
    }
    frame_header s = req(frame_op::send);
    s.addr = 1;
    EXPECT_EQ(decode_bytes(encoded(s)), errc::protocol_error) << "addr on a send";
    s = req(frame_op::send);
    s.key = 1;
    EXPECT_EQ(decode_bytes(encoded(s)), errc::protocol_error) << "key on a send";
    // A zero-length write or read carries whatever addr and key: the codec passes them, and
    // the engine does not look at them (it touches nothing, as on verbs).
    for (auto op : {frame_op::write, frame_op::write_imm, frame_op::read_req}) {
        frame_header z = req(op);
        z.length = 0;
        z.addr = ~std::uint64_t{0};
        z.key = 0;
        EXPECT_FALSE(decode_bytes(encoded(z))) << static_cast<int>(op);
    }
}

TEST(tcp_wire, atomic_frames_carry_exactly_their_operands_and_old_value)
{
    // docs/wire-format.md section 2: FETCH_ADD_REQ 8 bytes, COMPARE_SWAP_REQ 16, ATOMIC_RESP 8.
    struct shape {
        frame_op op;
        std::uint32_t length;
        bool request;
    };
    for (auto [op, length, request] : {shape{frame_op::fetch_add_req, fetch_add_payload, true},
                                       shape{frame_op::compare_swap_req, compare_swap_payload, true},
                                       shape{frame_op::atomic_resp, atomic_resp_payload, false}}) {
        SCOPED_TRACE(static_cast<int>(op));
        frame_header h;
        h.op = op;
        h.seq = 3;
        h.length = length;
        if (request) {
            h.addr = 0x1000;
            h.key = 0xabc;
        }
        frame_header d;
        auto b = encoded(h);
        EXPECT_EQ(static_cast<int>(b[0]), static_cast<int>(op));
        ASSERT_FALSE(frame_header::decode(b.data(), d));
        EXPECT_EQ(d.payload_length(), length);
        EXPECT_EQ(d.is_request(), request);
        for (std::uint32_t wrong : {0u, 4u, length - 1, length + 1, length + 8, 24u}) {
            h.length = wrong;
            EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "length " << wrong;
        }
        h.length = length;
        h.flags = flag_solicited;
        EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "solicited on an atomic frame";
        h.flags = 0;
        h.imm = 1;
        EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "imm on an atomic frame";
        h.imm = 0;
        h.status = 1;
        EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "status on an atomic frame";
        if (!request) {
            h.status = 0;
            h.addr = 8;
            EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "addr on a response";
        }
    }
    // The operands and the old value are little endian.
    std::byte le[8];
    store_le64(le, 0x0102030405060708ull);
    EXPECT_EQ(le[0], std::byte{0x08});
    EXPECT_EQ(le[7], std::byte{0x01});
    EXPECT_EQ(load_le64(le), 0x0102030405060708ull);
}

TEST(tcp_wire, send_inv_is_a_send_that_carries_the_key_to_revoke)
{
    // docs/wire-format.md section 2: opcode 7, a payload as SEND, `key` the window's key,
    // `addr` 0; solicited allowed as on SEND.
    frame_header h;
    h.op = frame_op::send_inv;
    h.seq = 9;
    h.key = 0xfeedfacecafebeefull;
    h.length = 24;
    h.flags = flag_solicited;
    auto b = encoded(h);
    EXPECT_EQ(static_cast<int>(b[0]), 7);
    frame_header d;
    ASSERT_FALSE(frame_header::decode(b.data(), d));
    EXPECT_EQ(d.op, frame_op::send_inv);
    EXPECT_EQ(d.key, h.key);
    EXPECT_EQ(d.payload_length(), 24u);
    EXPECT_TRUE(d.is_request());
    h.addr = 0x1000;
    EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "addr on a send_inv";
    h.addr = 0;
    h.imm = 1;
    EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "imm on a send_inv";
    h.imm = 0;
    h.status = 2;
    EXPECT_EQ(decode_bytes(encoded(h)), errc::protocol_error) << "status on a send_inv";
}

TEST(tcp_wire, seq_is_a_full_64_bit_counter)
{
    // Not a ring index: every value decodes as itself, in requests and in responses.
    for (std::uint64_t seq :
         {std::uint64_t{0}, std::uint64_t{1} << 32, (std::uint64_t{1} << 32) + 5, ~std::uint64_t{0}}) {
        for (auto op : {frame_op::write, frame_op::ack}) {
            frame_header h;
            h.op = op;
            h.seq = seq;
            auto b = encoded(h);
            frame_header d;
            ASSERT_FALSE(frame_header::decode(b.data(), d));
            EXPECT_EQ(d.seq, seq);
        }
    }
}

/// A HELLO (or reply) as bytes, for tampering.
std::vector<std::byte> handshake_bytes(handshake_type t, std::uint32_t max_rd, std::string_view pdata)
{
    handshake h;
    h.type = t;
    h.max_rd_atomic = max_rd;
    h.private_data_len = static_cast<std::uint8_t>(pdata.size());
    std::memcpy(h.private_data.data(), pdata.data(), pdata.size());
    std::vector<std::byte> b(h.wire_size());
    h.encode(b.data());
    return b;
}

TEST(tcp_wire, handshake_padding_and_reserved_bytes_must_be_zero)
{
    for (auto t : {handshake_type::hello, handshake_type::accept, handshake_type::reject}) {
        SCOPED_TRACE(static_cast<int>(t));
        bool hello = t == handshake_type::hello;
        std::uint32_t rd = t == handshake_type::reject ? 0 : 4;
        auto good = handshake_bytes(t, rd, "abc");
        ASSERT_TRUE(handshake::decode(good, hello));
        // Padding: the first byte after the private data, and the last byte of the message.
        for (std::size_t at : {handshake::header_size + 3, good.size() - 1}) {
            auto b = good;
            b[at] = std::byte{1};
            EXPECT_FALSE(handshake::decode(b, hello)) << "padding byte " << at;
        }
        // Reserved: bytes 12..15, and every flag of byte 7 but handshake_flag_goodbye and
        // handshake_flag_ring.
        for (std::size_t at : {12u, 13u, 14u, 15u}) {
            auto b = good;
            b[at] = std::byte{1};
            EXPECT_FALSE(handshake::decode(b, hello)) << "reserved byte " << at;
        }
        for (unsigned bit = 2; bit < 8; ++bit) {
            auto b = good;
            b[7] = static_cast<std::byte>(1u << bit);
            EXPECT_FALSE(handshake::decode(b, hello)) << "unknown flag bit " << bit;
        }
        for (std::uint8_t f : {handshake_flag_goodbye, handshake_flag_ring}) {
            auto flagged = good;
            flagged[7] = std::byte{f};
            auto h = handshake::decode(flagged, hello);
            if (t == handshake_type::reject) {
                EXPECT_FALSE(h) << "flag " << unsigned{f} << " in a REJECT (no connection follows it)";
            } else {
                ASSERT_TRUE(h);
                EXPECT_EQ(h->flags, f);
            }
        }
        // A full private data area leaves no padding.
        auto full = handshake_bytes(t, rd, std::string(handshake::max_private_data(t), 'x'));
        EXPECT_TRUE(handshake::decode(full, hello));
    }
}

TEST(tcp_wire, handshake_read_limit_rules)
{
    // HELLO and ACCEPT: at least one read served; any larger value is accepted as sent.
    for (auto t : {handshake_type::hello, handshake_type::accept}) {
        bool hello = t == handshake_type::hello;
        EXPECT_FALSE(handshake::decode(handshake_bytes(t, 0, ""), hello)) << "a limit of 0";
        auto one = handshake::decode(handshake_bytes(t, 1, ""), hello);
        ASSERT_TRUE(one);
        EXPECT_EQ(one->max_rd_atomic, 1u);
        auto huge = handshake::decode(handshake_bytes(t, 0xffffffffu, ""), hello);
        ASSERT_TRUE(huge) << "a limit above ours is the peer's business";
        EXPECT_EQ(huge->max_rd_atomic, 0xffffffffu);
    }
    // REJECT serves nothing: 0, and nothing else.
    EXPECT_TRUE(handshake::decode(handshake_bytes(handshake_type::reject, 0, "no"), false));
    EXPECT_FALSE(handshake::decode(handshake_bytes(handshake_type::reject, 1, "no"), false));
}

} // namespace
} // namespace rdmx::tcp
