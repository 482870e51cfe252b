// The bulk RPC sample's protocol, shared by bulk_rpc_server.cpp and bulk_rpc_client.cpp:
// the flow of Mercury (and DAOS over it) on rdmx endpoints (rdmx/endpoint.hpp). Neither
// program has connection code: peers are addresses, the endpoint connects on first use.
//
//   - An RPC is a tagged message to the server: tag = rpc_tag | procedure. The server keeps
//     receives posted for (rpc_tag, ignore the procedure bits) from any peer, and learns
//     the caller from the completion's peer.
//   - Bulk data never travels in the RPC: the client registers its buffer and sends its
//     descriptor (remote_buffer) in the request; the server pulls a PUT's data with an
//     RDMA read and pushes a GET's data with an RDMA write, then replies.
//   - The reply is a tagged message to the caller with the tag the caller chose for it
//     (`reply_tag`), which the caller receives with a receive directed at the server.
//   - A write before the reply: the endpoint completes the write before the reply is
//     sent (the server sends it from the write's completion), so the data is in place
//     when the client sees the reply.
// Messages are fixed-size structs in host byte order (both ends on one architecture, as in
// the other samples); the descriptor inside is rdmx's own portable encoding.
#pragma once

#include <cstddef>
#include <cstdint>

#include <rdmx/rdmx.hpp>

namespace bulk_rpc
{

inline constexpr std::uint32_t magic = 0x42524331; // "BRC1"
inline constexpr std::uint64_t rpc_tag = 1ull << 63;
inline constexpr std::uint64_t procedure_bits = 0xff;

enum class procedure : std::uint64_t { put = 1, get = 2, shutdown = 3 };
enum class status : std::uint32_t { ok = 0, not_found = 1, too_small = 2, bad_request = 3, failed = 4 };

inline const char* to_string(status s) noexcept
{
    switch (s) {
    case status::ok: return "ok";
    case status::not_found: return "not found";
    case status::too_small: return "buffer too small";
    case status::bad_request: return "bad request";
    case status::failed: return "bulk transfer failed";
    }
    return "?";
}

struct request {
    std::uint32_t magic = bulk_rpc::magic;
    std::uint32_t reserved = 0;
    std::uint64_t key = 0;
    std::uint64_t size = 0;            ///< PUT: bytes in `bulk`
    std::uint64_t reply_tag = 0;       ///< the tag of the reply (high bit clear)
    rdmx::remote_buffer::bytes bulk{}; ///< PUT: the source; GET: the sink (its length = capacity)
};

struct counters {
    std::uint64_t rpcs = 0;   ///< requests served
    std::uint64_t puts = 0;   ///< PUTs stored
    std::uint64_t gets = 0;   ///< GETs served
    std::uint64_t failed = 0; ///< bulk transfers or replies that failed (a client that died)
    std::uint64_t peers = 0;  ///< peers the endpoint met
};

struct reply {
    std::uint32_t magic = bulk_rpc::magic;
    bulk_rpc::status status = status::ok;
    std::uint64_t key = 0;
    std::uint64_t size = 0; ///< GET: bytes written into the caller's buffer
    counters stats{};       ///< SHUTDOWN only
};

inline constexpr std::size_t message_size = 128;
static_assert(sizeof(request) <= message_size && sizeof(reply) <= message_size);

} // namespace bulk_rpc
