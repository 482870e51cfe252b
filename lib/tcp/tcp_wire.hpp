// TCP backend wire format: the handshake messages and the fixed 40-byte frame header.
// docs/wire-format.md is the specification; this file is its only encoder and decoder,
// so that the engine never reads a field that was not range-checked here first.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <system_error>

namespace rdmx::tcp
{

/// The handshake's version byte (docs/wire-format.md section 1). 2 added the GOODBYE flag
/// and frame, the atomic frames and SEND_INV; a version-1 HELLO is answered with a REJECT
/// in version 1's form whose private data says so (reject_text_for_version).
inline constexpr std::uint8_t protocol_version = 2;
/// Opens every handshake message; differs from remote_buffer's "RDMX" on purpose.
inline constexpr std::array<std::byte, 4> handshake_magic = {std::byte{'R'}, std::byte{'D'}, std::byte{'X'},
                                                             std::byte{'T'}};

/// Frame opcodes. Requests (initiator to target) carry a request sequence number of their
/// own direction; responses carry the sequence number of the request they answer.
enum class frame_op : std::uint8_t {
    send = 1,      ///< request; payload lands in the target's next posted receive
    write = 2,     ///< request; payload lands at addr in the registration named by key
    write_imm = 3, ///< request; as write, then consumes a posted receive carrying imm
    read_req = 4,  ///< request; no payload, length = bytes wanted from addr/key
    /// request; payload (length 8) = the addend; the 8 bytes at addr/key get it added
    fetch_add_req = 5,
    /// request; payload (length 16) = compare, then swap; addr/key as fetch_add_req
    compare_swap_req = 6,
    /// request; as send, and key = the target's memory window to revoke before the
    /// receive completes (opcode::send_with_invalidate)
    send_inv = 7,
    /// shm:// only (docs/wire-format.md section 11). Requests whose data the target moves
    /// itself by cross-memory attach (CMA): the payload is the initiator's own SGE list as
    /// cma_descriptor entries, not the data. addr/key, imm and flags as write / write_imm /
    /// read_req; the data length is the descriptors' sum.
    write_cma = 8,
    write_imm_cma = 9,
    read_cma_req = 10,
    /// shm:// only: as send (flags as send; addr and key 0), its data taken by the target
    /// into the posted receive by CMA; the payload is the descriptors
    send_cma = 11,
    ack = 16,       ///< response; acknowledges every request up to and including seq
    read_resp = 17, ///< response; payload = the bytes read for request seq
    nak = 18,       ///< response; request seq failed, status = nak_code
    /// the sender ends the connection on purpose: its last frame, FIN follows. Sent only
    /// to a peer whose handshake carried handshake_flag_goodbye.
    goodbye = 19,
    /// response; payload (length 8) = the target's value before the atomic request seq
    atomic_resp = 20,
    /// response (shm:// only); no payload: the target wrote the `length` bytes of read
    /// request seq into the initiator's memory itself (read_cma_req)
    read_cma_resp = 21,
};

/// One entry of a CMA request's payload: a range of the initiator's memory (address,
/// length; 8 bytes little endian each). At most max_cma_descriptors per request.
inline constexpr std::uint32_t cma_descriptor_size = 16;
inline constexpr std::uint32_t max_cma_descriptors = 32;

/// Whether `op` is one of the requests that carry CMA descriptors.
inline bool is_cma_request(frame_op op) noexcept
{
    return op == frame_op::write_cma || op == frame_op::write_imm_cma || op == frame_op::read_cma_req ||
           op == frame_op::send_cma;
}

/// Payload bytes of the atomic frames: one or two little-endian 64-bit operands, the old value.
inline constexpr std::uint32_t fetch_add_payload = 8;
inline constexpr std::uint32_t compare_swap_payload = 16;
inline constexpr std::uint32_t atomic_resp_payload = 8;

/// The 64-bit little-endian integer at `p` (any alignment), and the reverse: the atomic
/// frames' operands and old value.
std::uint64_t load_le64(const std::byte* p) noexcept;
void store_le64(std::byte* p, std::uint64_t v) noexcept;

/// Why a NAK was sent (status field of a nak frame).
enum class nak_code : std::uint32_t {
    rnr = 1,              ///< no receive posted: retry seq after a delay (go-back-N)
    remote_access = 2,    ///< bad key, out of bounds, or missing rights; fatal
    invalid_request = 3,  ///< send larger than the posted receive; fatal
    remote_operation = 4, ///< the target could not complete the request; fatal
    /// shm:// only: the target cannot reach the initiator's memory (CMA refused: ptrace
    /// rules, another user or PID namespace). Not fatal: the initiator sends seq and what
    /// follows it again with the data in the frames, and sends no CMA request again.
    cma_refused = 5,
};

inline constexpr std::uint8_t flag_solicited =
    1u << 0; ///< send / send_inv / write_imm: wake solicited_only waiters

/// Frames carry at most this much payload, the library-wide limit (validate.hpp).
inline constexpr std::uint32_t max_frame_payload = 1u << 30;

struct frame_header {
    frame_op op = frame_op::send;
    std::uint8_t flags = 0;
    std::uint32_t imm = 0;
    std::uint64_t seq = 0;
    std::uint64_t addr = 0;
    std::uint64_t key = 0;
    std::uint32_t length = 0; ///< payload bytes following the header; read_req: bytes wanted
    std::uint32_t status = 0; ///< nak: a nak_code; 0 otherwise

    static constexpr std::size_t wire_size = 40;
    using bytes = std::array<std::byte, wire_size>;

    void encode(std::byte* out) const noexcept;
    /// Checks everything a frame header can be checked for on its own (known opcode,
    /// reserved bits zero, length within limits, every field its opcode does not use zero,
    /// the solicited flag only on send and write_imm, the atomic frames' payload length
    /// exactly theirs); errc::protocol_error otherwise.
    /// `why` names the first violation. Sequence, keys and bounds are the engine's checks.
    static std::error_code decode(const std::byte* in, frame_header& out,
                                  const char** why = nullptr) noexcept;

    bool is_request() const noexcept { return static_cast<std::uint8_t>(op) < 16; }
    /// Bytes of payload that follow this header on the wire.
    std::uint32_t payload_length() const noexcept
    {
        return op == frame_op::read_req || op == frame_op::ack || op == frame_op::nak ||
                       op == frame_op::goodbye || op == frame_op::read_cma_resp
                   ? 0
                   : length;
    }
};

enum class handshake_type : std::uint8_t { hello = 1, accept = 2, reject = 3 };

/// Handshake flags (byte 7): the sender ends a connection on purpose with a GOODBYE frame
/// before FIN, so that its bare FIN or reset means its process died (errc::peer_lost).
inline constexpr std::uint8_t handshake_flag_goodbye = 1u << 0;
/// Handshake flag bit 1, shm:// (UNIX sockets) only: in a HELLO, "I can take rings"; in an
/// ACCEPT, "the frames go through the rings of the memfd that came with this message"
/// (SCM_RIGHTS; tcp_ring.hpp, docs/wire-format.md section 1).
inline constexpr std::uint8_t handshake_flag_ring = 1u << 1;

/// HELLO (client to listener) and ACCEPT / REJECT (the reply). Fixed sizes, so that the
/// client reads exactly the reply and leaves any frame after it for the engine.
struct handshake {
    handshake_type type = handshake_type::hello;
    std::uint32_t max_rd_atomic = 0; ///< reads the sender will serve at once (its responder resources)
    std::uint8_t private_data_len = 0;
    std::uint8_t flags = 0; ///< handshake_flag_goodbye, handshake_flag_ring; other bits are malformed
    /// encode() writes it; decode() accepts protocol_version alone (see peer_version).
    std::uint8_t version = protocol_version;
    std::array<std::byte, 196> private_data{};

    static constexpr std::size_t header_size = 16;
    static constexpr std::size_t hello_size = header_size + 56;  ///< 72
    static constexpr std::size_t reply_size = header_size + 196; ///< 212

    std::size_t wire_size() const noexcept { return type == handshake_type::hello ? hello_size : reply_size; }
    std::span<const std::byte> data() const noexcept { return {private_data.data(), private_data_len}; }

    /// `out` must hold wire_size() bytes.
    void encode(std::byte* out) const noexcept;
    /// Parses a HELLO (`expect_hello`) or a reply; nullopt for anything malformed: bad
    /// magic, version or type, reserved or padding bytes not zero, private data over the
    /// limit, max_rd_atomic 0 in a HELLO or ACCEPT, or not 0 in a REJECT.
    static std::optional<handshake> decode(std::span<const std::byte> in, bool expect_hello) noexcept;
    /// The version byte of a handshake message that starts with the magic (at least
    /// header_size bytes), whatever the version; nullopt otherwise. For answering a peer of
    /// another version in a form it can read.
    static std::optional<std::uint8_t> peer_version(std::span<const std::byte> in) noexcept;
    /// Largest private data per type: 56 (hello), 196 (accept), 148 (reject).
    static std::size_t max_private_data(handshake_type t) noexcept;
};

} // namespace rdmx::tcp
