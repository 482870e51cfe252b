// Test data that checks itself: byte patterns, splitmix64 words, FNV-1a, one copy for
// every suite. Built as a small library at the build's optimisation (tests/meson.build),
// while the test programs are built at -O0 for compile time: these loops run over every
// byte the tests move.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace rdmx::test
{

/// Byte `i` of the pattern `seed`: neighbouring bytes, 256-byte blocks and seeds (each
/// seed below 256 a stream of its own) differ.
std::byte pattern_byte(std::size_t i, std::uint64_t seed) noexcept;
/// Writes pattern bytes first, first + 1, ... of `seed` into `out`.
void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::size_t first = 0) noexcept;
/// `n` bytes of the pattern `seed`.
std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed);
/// How many bytes of `got` differ from the pattern (got[k] against byte first + k of
/// `seed`, each XORed with `mask`).
std::size_t wrong_bytes(std::span<const std::byte> got, std::uint64_t seed, std::size_t first = 0,
                        std::byte mask = std::byte{0}) noexcept;
/// dst[k] = src[k] ^ mask over `n` bytes (an echo that is not a plain copy).
void xor_copy(std::byte* dst, const std::byte* src, std::size_t n, std::byte mask) noexcept;

/// splitmix64's finaliser: neighbouring words, rounds and clients look unrelated.
std::uint64_t mix(std::uint64_t x) noexcept;
/// Fills n bytes (a multiple of 8) with words mix(seed + first), mix(seed + first + 1), ...
void fill_words(std::byte* p, std::size_t n, std::uint64_t seed, std::uint64_t first = 0) noexcept;
/// The offset of the first byte that differs from fill_words(seed, first), or nullopt.
std::optional<std::size_t> first_wrong_word(const std::byte* p, std::size_t n, std::uint64_t seed,
                                            std::uint64_t first = 0) noexcept;

/// FNV-1a (64 bit) of n bytes.
std::uint64_t fnv1a(const std::byte* p, std::size_t n) noexcept;

} // namespace rdmx::test
