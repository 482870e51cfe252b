// Test data helpers (test_data.hpp), compiled at the build's optimisation.
#include "common/test_data.hpp"

#include <cstring>

namespace rdmx::test
{

std::byte pattern_byte(std::size_t i, std::uint64_t seed) noexcept
{
    return static_cast<std::byte>((i * 131 + (i >> 8) + seed * 17 + (seed >> 8)) & 0xff);
}

void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::size_t first) noexcept
{
    for (std::size_t k = 0; k < out.size(); ++k)
        out[k] = pattern_byte(first + k, seed);
}

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed)
{
    std::vector<std::byte> v(n);
    fill_pattern(v, seed);
    return v;
}

std::size_t wrong_bytes(std::span<const std::byte> got, std::uint64_t seed, std::size_t first,
                        std::byte mask) noexcept
{
    std::size_t bad = 0;
    for (std::size_t k = 0; k < got.size(); ++k)
        bad += got[k] != (pattern_byte(first + k, seed) ^ mask);
    return bad;
}

void xor_copy(std::byte* dst, const std::byte* src, std::size_t n, std::byte mask) noexcept
{
    for (std::size_t k = 0; k < n; ++k)
        dst[k] = src[k] ^ mask;
}

std::uint64_t mix(std::uint64_t x) noexcept
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void fill_words(std::byte* p, std::size_t n, std::uint64_t seed, std::uint64_t first) noexcept
{
    for (std::size_t i = 0; i < n / 8; ++i) {
        std::uint64_t w = mix(seed + first + i);
        std::memcpy(p + 8 * i, &w, 8);
    }
}

std::optional<std::size_t> first_wrong_word(const std::byte* p, std::size_t n, std::uint64_t seed,
                                            std::uint64_t first) noexcept
{
    for (std::size_t i = 0; i < n / 8; ++i) {
        std::uint64_t w = mix(seed + first + i), got;
        std::memcpy(&got, p + 8 * i, 8);
        if (got != w)
            return 8 * i;
    }
    return std::nullopt;
}

std::uint64_t fnv1a(const std::byte* p, std::size_t n) noexcept
{
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t i = 0; i < n; ++i)
        h = (h ^ static_cast<std::uint8_t>(p[i])) * 1099511628211ull;
    return h;
}

} // namespace rdmx::test
