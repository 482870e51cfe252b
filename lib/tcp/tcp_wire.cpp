#include "tcp/tcp_wire.hpp"

#include <bit>
#include <cstring>

#include <rdmx/error.hpp>

namespace rdmx::tcp
{
namespace
{

// Little-endian fields of n = 1, 2, 4 or 8 bytes at any alignment. One load or store each
// (memcpy), not a loop of bytes: the header is decoded for every frame on the hot path.
template <class T> T to_le(T v) noexcept
{
    if constexpr (std::endian::native == std::endian::big) {
        if constexpr (sizeof(T) == 2)
            v = __builtin_bswap16(v);
        else if constexpr (sizeof(T) == 4)
            v = __builtin_bswap32(v);
        else if constexpr (sizeof(T) == 8)
            v = __builtin_bswap64(v);
    }
    return v;
}
template <class T> void store(std::byte* p, std::uint64_t v) noexcept
{
    T t = to_le(static_cast<T>(v));
    std::memcpy(p, &t, sizeof t);
}
template <class T> std::uint64_t load(const std::byte* p) noexcept
{
    T t;
    std::memcpy(&t, p, sizeof t);
    return to_le(t);
}
void put_le(std::byte* p, std::uint64_t v, int n) noexcept
{
    switch (n) {
    case 1: store<std::uint8_t>(p, v); break;
    case 2: store<std::uint16_t>(p, v); break;
    case 4: store<std::uint32_t>(p, v); break;
    default: store<std::uint64_t>(p, v); break;
    }
}
std::uint64_t get_le(const std::byte* p, int n) noexcept
{
    switch (n) {
    case 1: return load<std::uint8_t>(p);
    case 2: return load<std::uint16_t>(p);
    case 4: return load<std::uint32_t>(p);
    default: return load<std::uint64_t>(p);
    }
}

std::error_code bad(const char** why, const char* reason) noexcept
{
    if (why)
        *why = reason;
    return errc::protocol_error;
}

} // namespace

std::uint64_t load_le64(const std::byte* p) noexcept
{
    return load<std::uint64_t>(p);
}
void store_le64(std::byte* p, std::uint64_t v) noexcept
{
    store<std::uint64_t>(p, v);
}

void frame_header::encode(std::byte* out) const noexcept
{
    put_le(out + 0, static_cast<std::uint8_t>(op), 1);
    put_le(out + 1, flags, 1);
    put_le(out + 2, 0, 2);
    put_le(out + 4, imm, 4);
    put_le(out + 8, seq, 8);
    put_le(out + 16, addr, 8);
    put_le(out + 24, key, 8);
    put_le(out + 32, length, 4);
    put_le(out + 36, status, 4);
}

std::error_code frame_header::decode(const std::byte* in, frame_header& out, const char** why) noexcept
{
    frame_header h;
    auto op = static_cast<std::uint8_t>(get_le(in, 1));
    h.flags = static_cast<std::uint8_t>(get_le(in + 1, 1));
    auto reserved = get_le(in + 2, 2);
    h.imm = static_cast<std::uint32_t>(get_le(in + 4, 4));
    h.seq = get_le(in + 8, 8);
    h.addr = get_le(in + 16, 8);
    h.key = get_le(in + 24, 8);
    h.length = static_cast<std::uint32_t>(get_le(in + 32, 4));
    h.status = static_cast<std::uint32_t>(get_le(in + 36, 4));
    if (reserved != 0)
        return bad(why, "reserved header bits set");
    switch (static_cast<frame_op>(op)) {
    case frame_op::send:
    case frame_op::send_inv:
    case frame_op::write:
    case frame_op::write_imm:
    case frame_op::read_req:
    case frame_op::fetch_add_req:
    case frame_op::compare_swap_req:
    case frame_op::write_cma:
    case frame_op::write_imm_cma:
    case frame_op::read_cma_req:
    case frame_op::send_cma: {
        // Every field a request does not use must be zero (docs/wire-format.md section 2):
        // the version byte of the handshake is the only way to give one a meaning later.
        auto o = static_cast<frame_op>(op);
        bool may_solicit = o == frame_op::send || o == frame_op::send_inv || o == frame_op::write_imm ||
                           o == frame_op::write_imm_cma || o == frame_op::send_cma;
        if (h.status != 0)
            return bad(why, "status on a request");
        if ((h.flags & ~flag_solicited) != 0)
            return bad(why, "unknown flags on a request");
        if (h.flags != 0 && !may_solicit)
            return bad(why, "solicited flag on a write or read request");
        if (h.imm != 0 && o != frame_op::write_imm && o != frame_op::write_imm_cma)
            return bad(why, "imm on a request other than write_imm");
        if ((o == frame_op::send || o == frame_op::send_cma) && (h.addr != 0 || h.key != 0))
            return bad(why, "addr or key on a send");
        if (o == frame_op::send_inv && h.addr != 0)
            return bad(why, "addr on a send_inv");
        if (o == frame_op::fetch_add_req && h.length != fetch_add_payload)
            return bad(why, "fetch_add request without exactly its 8-byte operand");
        if (o == frame_op::compare_swap_req && h.length != compare_swap_payload)
            return bad(why, "compare_swap request without exactly its 16 bytes of operands");
        if (is_cma_request(o) && (h.length == 0 || h.length % cma_descriptor_size != 0 ||
                                  h.length > max_cma_descriptors * cma_descriptor_size))
            return bad(why, "CMA request without 1 to 32 whole descriptors");
        break;
    }
    case frame_op::ack:
    case frame_op::read_resp:
    case frame_op::atomic_resp:
    case frame_op::read_cma_resp:
        if (h.flags != 0 || h.status != 0 || h.imm != 0 || h.addr != 0 || h.key != 0)
            return bad(why, "unused response fields not zero");
        if (op == static_cast<std::uint8_t>(frame_op::ack) && h.length != 0)
            return bad(why, "ack with a length");
        if (op == static_cast<std::uint8_t>(frame_op::atomic_resp) && h.length != atomic_resp_payload)
            return bad(why, "atomic response without exactly its 8-byte value");
        break;
    case frame_op::goodbye:
        if (h.flags != 0 || h.status != 0 || h.imm != 0 || h.seq != 0 || h.addr != 0 || h.key != 0 ||
            h.length != 0)
            return bad(why, "goodbye fields not zero");
        break;
    case frame_op::nak:
        if (h.flags != 0 || h.imm != 0 || h.addr != 0 || h.key != 0 || h.length != 0)
            return bad(why, "unused nak fields not zero");
        if (h.status < static_cast<std::uint32_t>(nak_code::rnr) ||
            h.status > static_cast<std::uint32_t>(nak_code::cma_refused))
            return bad(why, "unknown nak code");
        break;
    default: return bad(why, "unknown opcode");
    }
    if (h.length > max_frame_payload)
        return bad(why, "length over the frame limit");
    h.op = static_cast<frame_op>(op);
    out = h;
    return {};
}

std::size_t handshake::max_private_data(handshake_type t) noexcept
{
    switch (t) {
    case handshake_type::hello: return 56;
    case handshake_type::accept: return 196;
    case handshake_type::reject: return 148;
    }
    return 0;
}

void handshake::encode(std::byte* out) const noexcept
{
    std::memset(out, 0, wire_size());
    std::memcpy(out, handshake_magic.data(), 4);
    put_le(out + 4, version, 1);
    put_le(out + 5, static_cast<std::uint8_t>(type), 1);
    put_le(out + 6, private_data_len, 1);
    put_le(out + 7, flags, 1);
    put_le(out + 8, max_rd_atomic, 4);
    std::size_t n = private_data_len;
    if (n > max_private_data(type))
        n = max_private_data(type);
    std::memcpy(out + header_size, private_data.data(), n);
}

std::optional<std::uint8_t> handshake::peer_version(std::span<const std::byte> in) noexcept
{
    if (in.size() < header_size || std::memcmp(in.data(), handshake_magic.data(), 4) != 0)
        return std::nullopt;
    return static_cast<std::uint8_t>(get_le(in.data() + 4, 1));
}

std::optional<handshake> handshake::decode(std::span<const std::byte> in, bool expect_hello) noexcept
{
    if (in.size() < header_size || std::memcmp(in.data(), handshake_magic.data(), 4) != 0 ||
        get_le(in.data() + 4, 1) != protocol_version ||
        (get_le(in.data() + 7, 1) & ~(handshake_flag_goodbye | handshake_flag_ring)) != 0 ||
        get_le(in.data() + 12, 4) != 0)
        return std::nullopt;
    handshake h;
    auto t = static_cast<std::uint8_t>(get_le(in.data() + 5, 1));
    if (expect_hello) {
        if (t != static_cast<std::uint8_t>(handshake_type::hello))
            return std::nullopt;
    } else if (t != static_cast<std::uint8_t>(handshake_type::accept) &&
               t != static_cast<std::uint8_t>(handshake_type::reject)) {
        return std::nullopt;
    }
    h.type = static_cast<handshake_type>(t);
    if (in.size() != h.wire_size())
        return std::nullopt;
    h.private_data_len = static_cast<std::uint8_t>(get_le(in.data() + 6, 1));
    if (h.private_data_len > max_private_data(h.type))
        return std::nullopt;
    h.max_rd_atomic = static_cast<std::uint32_t>(get_le(in.data() + 8, 4));
    h.flags = static_cast<std::uint8_t>(get_le(in.data() + 7, 1));
    // A REJECT ends the attempt: no GOODBYE follows it, and its flags are 0.
    if (h.type == handshake_type::reject && h.flags != 0)
        return std::nullopt;
    // HELLO and ACCEPT state how many reads their sender serves: at least one (every rdmx
    // side serves reads), any larger value is fine (each side uses the smaller of the two).
    // REJECT serves nothing and carries 0.
    if ((h.type == handshake_type::reject) != (h.max_rd_atomic == 0))
        return std::nullopt;
    // The padding after the private data is zero, like every unused byte.
    auto pad = in.subspan(header_size + h.private_data_len);
    for (std::byte b : pad)
        if (b != std::byte{0})
            return std::nullopt;
    std::memcpy(h.private_data.data(), in.data() + header_size, h.private_data_len);
    return h;
}

} // namespace rdmx::tcp
