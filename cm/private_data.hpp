// The private data rdmx sends with rdma_connect and rdma_accept (docs/wire-format.md,
// "Verbs private data"): always the message's full size (56 / 196 bytes), the user's bytes
// first, zeros, and at the fixed end a 16-byte trailer that says how many bytes are the
// user's and where the peer writes its goodbye before it disconnects. IB CM pads what it
// carries to the message size and iWARP (MPA) carries the exact length: with the length
// in the trailer the receiver gets exactly the user's bytes on both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace rdmx::cm
{

/// Where a connection's goodbye flag is: the peer writes 8 nonzero bytes there.
struct goodbye_target {
    std::uint32_t rkey = 0;
    std::uint64_t addr = 0;
};

/// The wire sizes: rdma_cm's private data over RC on IB (iWARP carries these too).
inline constexpr std::size_t connect_wire_size = 56;
inline constexpr std::size_t accept_wire_size = 196;
inline constexpr std::size_t trailer_size = 16;

/// Writes `user` (at most wire.size() - trailer_size bytes, checked by the caller), zero
/// padding and the trailer naming `own` into `wire`.
void encode_private_data(std::span<const std::byte> user, goodbye_target own,
                         std::span<std::byte> wire) noexcept;

struct decoded_private_data {
    std::span<const std::byte> user;    ///< the user's bytes, a part of the input
    std::optional<goodbye_target> peer; ///< none: not an rdmx peer (no trailer)
};

/// Splits what a peer sent. Without the trailer's magic and version all of it is the
/// user's and the peer sends no goodbye.
decoded_private_data decode_private_data(std::span<const std::byte> wire) noexcept;

} // namespace rdmx::cm
