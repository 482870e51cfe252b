// The endpoint's wire codec (docs/endpoints.md, "Protocol").
#include "endpoint/ep_wire.hpp"

#include <cstring>

#include "resolve.hpp"

namespace rdmx::ep
{
namespace
{

void put16(std::byte* p, std::uint16_t v) noexcept
{
    for (int i = 0; i < 2; ++i)
        p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put32(std::byte* p, std::uint32_t v) noexcept
{
    for (int i = 0; i < 4; ++i)
        p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, std::uint64_t v) noexcept
{
    for (int i = 0; i < 8; ++i)
        p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get(const std::byte* p, int n) noexcept
{
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i)
        v |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
    return v;
}
/// Everything past `used` is zero (verbs pads private data to the message's size).
bool zero_tail(std::span<const std::byte> in, std::size_t used) noexcept
{
    for (std::size_t i = used; i < in.size(); ++i)
        if (in[i] != std::byte{0})
            return false;
    return true;
}

} // namespace

bool valid_shm_name(const std::array<std::uint8_t, 16>& ip) noexcept
{
    std::size_t n = 0;
    while (n < ip.size() && ip[n] != 0)
        if (!detail::shm_name_char(static_cast<char>(ip[n++])))
            return false;
    for (std::size_t i = n; i < ip.size(); ++i)
        if (ip[i] != 0)
            return false;
    return n > 0;
}

// identity: magic u32, version u8, family u8, port u16, incarnation u64, ip[16]
std::array<std::byte, identity_size> encode(const identity& id) noexcept
{
    std::array<std::byte, identity_size> b{};
    put32(&b[0], wire_magic);
    b[4] = static_cast<std::byte>(wire_version);
    b[5] = static_cast<std::byte>(id.listener.family);
    put16(&b[6], id.listener.port);
    put64(&b[8], id.incarnation);
    std::memcpy(&b[16], id.listener.ip.data(), 16);
    return b;
}

identity_status decode(std::span<const std::byte> in, identity& out) noexcept
{
    if (in.size() < 5 || get(in.data(), 4) != wire_magic)
        return identity_status::malformed;
    if (std::to_integer<std::uint8_t>(in[4]) != wire_version)
        return identity_status::version_mismatch;
    if (in.size() < identity_size || !zero_tail(in, identity_size))
        return identity_status::malformed;
    out.listener.family = std::to_integer<std::uint8_t>(in[5]);
    out.listener.port = static_cast<std::uint16_t>(get(&in[6], 2));
    out.incarnation = get(&in[8], 8);
    std::memcpy(out.listener.ip.data(), &in[16], 16);
    const std::uint8_t f = out.listener.family;
    if ((f != 4 && f != 6 && f != shm_family) || (f == shm_family && !valid_shm_name(out.listener.ip)) ||
        out.listener.port == 0 || out.incarnation == 0)
        return identity_status::malformed;
    return identity_status::ok;
}

// accept: magic u32, version u8, 3 zero bytes, incarnation u64
std::array<std::byte, accept_size> encode_accept(std::uint64_t incarnation) noexcept
{
    std::array<std::byte, accept_size> b{};
    put32(&b[0], wire_magic);
    b[4] = static_cast<std::byte>(wire_version);
    put64(&b[8], incarnation);
    return b;
}

std::optional<std::uint64_t> decode_accept(std::span<const std::byte> in) noexcept
{
    if (in.size() < accept_size || get(in.data(), 4) != wire_magic ||
        std::to_integer<std::uint8_t>(in[4]) != wire_version || !zero_tail(in, accept_size))
        return std::nullopt;
    std::uint64_t inc = get(&in[8], 8);
    if (inc == 0)
        return std::nullopt;
    return inc;
}

const char* to_string(reject_reason r) noexcept
{
    switch (r) {
    case reject_reason::none: return "not an endpoint's reject";
    case reject_reason::version_mismatch: return "protocol version mismatch";
    case reject_reason::malformed: return "malformed identity";
    case reject_reason::duplicate: return "duplicate (simultaneous connect)";
    case reject_reason::self: return "the endpoint itself";
    }
    return "?";
}

// reject: magic u32, version u8, reason u8, 2 zero bytes
std::array<std::byte, reject_size> encode_reject(reject_reason r) noexcept
{
    std::array<std::byte, reject_size> b{};
    put32(&b[0], wire_magic);
    b[4] = static_cast<std::byte>(wire_version);
    b[5] = static_cast<std::byte>(r);
    return b;
}

reject_reason decode_reject(std::span<const std::byte> in) noexcept
{
    if (in.size() < reject_size || get(in.data(), 4) != wire_magic)
        return reject_reason::none;
    auto r = std::to_integer<std::uint8_t>(in[5]);
    if (r < 1 || r > 4)
        return reject_reason::none;
    return static_cast<reject_reason>(r);
}

// header: type u8, ndesc u8, credit u16, delivered u32, tag u64, length u64, id u64
void encode(const msg_header& h, std::byte* out) noexcept
{
    std::memset(out, 0, header_size);
    out[0] = static_cast<std::byte>(h.type);
    out[1] = static_cast<std::byte>(h.ndesc);
    put16(out + 2, h.credit);
    put32(out + 4, h.delivered);
    put64(out + 8, h.tag);
    put64(out + 16, h.length);
    put64(out + 24, h.id);
}

std::optional<msg_header> decode_header(std::span<const std::byte> in) noexcept
{
    if (in.size() < header_size)
        return std::nullopt;
    msg_header h;
    auto t = std::to_integer<std::uint8_t>(in[0]);
    if (t < 1 || t > 5)
        return std::nullopt;
    h.type = static_cast<msg_type>(t);
    h.ndesc = std::to_integer<std::uint8_t>(in[1]);
    h.tag = get(&in[8], 8);
    h.length = get(&in[16], 8);
    h.id = get(&in[24], 8);
    h.delivered = static_cast<std::uint32_t>(get(&in[4], 4));
    h.credit = static_cast<std::uint16_t>(get(&in[2], 2));
    if (h.type == msg_type::rts && (h.ndesc == 0 || h.ndesc > max_rts_desc))
        return std::nullopt;
    return h;
}

} // namespace rdmx::ep
