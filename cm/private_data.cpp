#include "cm/private_data.hpp"

#include <algorithm>

namespace rdmx::cm
{
namespace
{

// Trailer: magic "rx", version, user length, rkey (LE 32), addr (LE 64).
constexpr std::byte magic0{'r'}, magic1{'x'};
constexpr std::byte version{1};

void put_le(std::byte* p, std::uint64_t v, int n) noexcept
{
    for (int i = 0; i < n; ++i)
        p[i] = static_cast<std::byte>(v >> (8 * i));
}

std::uint64_t get_le(const std::byte* p, int n) noexcept
{
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i)
        v |= std::to_integer<std::uint64_t>(p[i]) << (8 * i);
    return v;
}

} // namespace

void encode_private_data(std::span<const std::byte> user, goodbye_target own,
                         std::span<std::byte> wire) noexcept
{
    std::fill(wire.begin(), wire.end(), std::byte{0});
    const std::size_t n = std::min(user.size(), wire.size() - trailer_size);
    std::copy_n(user.begin(), n, wire.begin());
    std::byte* t = wire.data() + wire.size() - trailer_size;
    t[0] = magic0;
    t[1] = magic1;
    t[2] = version;
    t[3] = static_cast<std::byte>(n);
    put_le(t + 4, own.rkey, 4);
    put_le(t + 8, own.addr, 8);
}

decoded_private_data decode_private_data(std::span<const std::byte> wire) noexcept
{
    if (wire.size() < trailer_size)
        return {wire, std::nullopt};
    const std::byte* t = wire.data() + wire.size() - trailer_size;
    const std::size_t n = std::to_integer<std::size_t>(t[3]);
    if (t[0] != magic0 || t[1] != magic1 || t[2] != version || n > wire.size() - trailer_size)
        return {wire, std::nullopt};
    goodbye_target g;
    g.rkey = static_cast<std::uint32_t>(get_le(t + 4, 4));
    g.addr = get_le(t + 8, 8);
    return {wire.first(n), g};
}

} // namespace rdmx::cm
