// The endpoint's wire structs (docs/endpoints.md): the connection identity in the connect
// private data, the accept reply, the reject reason, and the header in front of every
// message. One range-checked codec, little endian, as lib/tcp/tcp_wire.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include <rdmx/connection.hpp>

namespace rdmx::ep
{

inline constexpr std::uint32_t wire_magic = 0x45584452; // "RDXE" read little endian
/// 2: the dialler's ready message; 3: the delivered count in every header, and the
/// `delivered` message (iWARP's endpoint-level acknowledgement of eager messages);
/// 4: per-connection credits for eager and rendezvous-request messages on every provider
/// (the credit in every header; `delivered` counts rts messages too).
inline constexpr std::uint8_t wire_version = 4;
/// Messages (eager or rts) a sender may send on a new connection before the peer's first
/// header says how many more it takes: every receiver keeps room for them.
inline constexpr std::uint32_t initial_credit = 4;

/// A listener address as the peer dialled it: the key of the address vector.
struct net_address {
    /// 4 or 6, or shm_family: `ip` holds the name of shm://name:port, zero-padded.
    std::uint8_t family = 0;
    std::array<std::uint8_t, 16> ip{};
    std::uint16_t port = 0;
    friend bool operator==(const net_address&, const net_address&) = default;
};

inline constexpr std::uint8_t shm_family = 1;
/// `ip` of an shm_family address holds a name uri::parse takes: 1-16 bytes of letters,
/// digits, '-', '_', '.', then zeros.
bool valid_shm_name(const std::array<std::uint8_t, 16>& ip) noexcept;

/// Connect private data: who dials (at most 40 bytes, the smallest limit rdmx promises).
struct identity {
    std::uint64_t incarnation = 0;
    net_address listener;
};
inline constexpr std::size_t identity_size = 32;
static_assert(identity_size <= 40, "the identity must fit the connect private data of every backend");
static_assert(identity_size <= max_connect_private_data);
std::array<std::byte, identity_size> encode(const identity& id) noexcept;

enum class identity_status : std::uint8_t { ok, malformed, version_mismatch };
/// Parses the identity; trailing zero bytes (verbs pads private data) are allowed.
identity_status decode(std::span<const std::byte> in, identity& out) noexcept;

/// The accept reply: the acceptor's incarnation.
inline constexpr std::size_t accept_size = 16;
std::array<std::byte, accept_size> encode_accept(std::uint64_t incarnation) noexcept;
std::optional<std::uint64_t> decode_accept(std::span<const std::byte> in) noexcept;

/// Why an endpoint rejected a connection request.
enum class reject_reason : std::uint8_t {
    none = 0,             ///< not an endpoint's reject (another application, or no data)
    version_mismatch = 1, ///< the identity's protocol version is not ours
    malformed = 2,        ///< the private data is not an identity
    duplicate = 3,        ///< simultaneous connect: the other connection survives
    self = 4,             ///< the request came from this endpoint itself
};
const char* to_string(reject_reason r) noexcept;
inline constexpr std::size_t reject_size = 8;
std::array<std::byte, reject_size> encode_reject(reject_reason r) noexcept;
reject_reason decode_reject(std::span<const std::byte> in) noexcept;

/// Message types in the header of each send.
enum class msg_type : std::uint8_t {
    eager = 1, ///< the payload follows the header
    rts = 2,   ///< rendezvous request: descriptors of the sender's memory follow
    ack = 3,   ///< rendezvous done: the receiver has read the data (id = the sender's op)
    ready = 4, ///< a dialler's first message: its side of the connection is up
    /// header only: carries `delivered` and `credit` when no other message does
    delivered = 5,
};

/// The header in front of every message (32 bytes).
struct msg_header {
    msg_type type = msg_type::eager;
    std::uint8_t ndesc = 0;   ///< rts: descriptors after the header
    std::uint64_t tag = 0;    ///< eager / rts
    std::uint64_t length = 0; ///< eager: payload bytes; rts: the message's total length
    std::uint64_t id = 0;     ///< rts / ack: the sender's operation
    /// Data messages (eager and rts) the sender of this header has received on this
    /// connection so far (mod 2^32): on iWARP, where a send completes once TCP took it, the
    /// acknowledgement that completes the peer's eager sends (docs/endpoints.md,
    /// "Completion semantics").
    std::uint32_t delivered = 0;
    /// Data messages beyond `delivered` that the sender of this header takes: the peer may
    /// send message number delivered + credit at most ("Flow control").
    std::uint16_t credit = 0;
};
inline constexpr std::size_t header_size = 32;
/// Descriptors an rts carries at most (one per sge of the send).
inline constexpr std::size_t max_rts_desc = 7;
void encode(const msg_header& h, std::byte* out) noexcept;
/// nullopt for an unknown type or a header that does not fit `in`.
std::optional<msg_header> decode_header(std::span<const std::byte> in) noexcept;

} // namespace rdmx::ep
