// The object store's wire protocol and test data, shared by object_store_server.cpp and
// object_store_client.cpp.
//
// Protocol (RPC over send/recv, data by one-sided RDMA; the server does the data's RDMA):
//   - The client registers one data buffer (up to max_object) and keeps one receive
//     posted for the reply to its one outstanding request.
//   - Each request names the part of that buffer the server may touch, and how: where the
//     device has memory windows, by a window the client bound for this one request over
//     exactly that range, read-only for a PUT and write-only for a GET (flag
//     buffer_is_window); the server's reply is a send_with_invalidate naming the window's
//     key, which revokes it before the client sees the reply. A server that kept the
//     descriptor, or forged one for another range, can do nothing with it. Without
//     windows the descriptor is a slice of the region (the region's key).
//   - PUT key size version buffer: the client has filled `buffer` (`size` bytes) with
//     version `version` of key's object; the server RDMA-reads it into a new object of
//     its own and, once the read completed, replaces the key's object and replies ok.
//     Until the reply the client must not touch the buffer. Versions: a new key starts at
//     version 0; version v + 1 of an existing key is accepted only while the key's version
//     word holds v + 1 and its data is version v: the writer claimed the update by a
//     compare-and-swap of the word from v to v + 1 (conflict otherwise). So concurrent
//     writers of one key never lose an update (object_store_client --increment).
//   - GET key buffer: the server RDMA-writes the object into `buffer` (which must hold it)
//     and then sends the reply (ok, size, version): RC ordering delivers the write before
//     the send, so the data is in place when the client sees the reply. not_found,
//     too_small otherwise.
//   - Replies to a PUT or GET of an existing key carry `version_word`: a descriptor of the
//     key's 8-byte version word in the server's memory, for compare-and-swap by this
//     client alone (a window over those 8 bytes, bound for this client's connection;
//     without windows a slice of the server's version table). Zero where the device has
//     no atomics.
//   - SHUTDOWN: the server replies ok with its counters and exits once the reply is sent.
//   A client hangs up with disconnect(); a client that dies instead is cleaned up by the
//   server (its in-flight RDMA fails or is flushed), which keeps serving the others.
// Messages are fixed-size structs in host byte order (both ends on one architecture, as
// in the other samples); the descriptors inside are rdmx's own portable encoding.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <rdmx/rdmx.hpp>

namespace object_store
{

inline constexpr std::size_t min_object = 4096;
inline constexpr std::size_t max_object = 1 << 20;
inline constexpr std::uint32_t magic = 0x4f424a31; // "OBJ1"

enum class op : std::uint32_t { put = 1, get = 2, shutdown = 3 };
enum class status : std::uint32_t { ok = 0, not_found = 1, too_small = 2, bad_request = 3, conflict = 4 };

/// request::flags
inline constexpr std::uint32_t buffer_is_window = 1; ///< revoke `buffer` with the reply

inline const char* to_string(status s) noexcept
{
    switch (s) {
    case status::ok: return "ok";
    case status::not_found: return "not found";
    case status::too_small: return "buffer too small";
    case status::bad_request: return "bad request";
    case status::conflict: return "version conflict";
    }
    return "?";
}

struct request {
    std::uint32_t magic = object_store::magic;
    object_store::op op = op::get;
    std::uint64_t key = 0;
    std::uint64_t size = 0;              ///< PUT: bytes in `buffer`
    std::uint64_t version = 0;           ///< PUT: the version `buffer` holds
    std::uint32_t flags = 0;             ///< buffer_is_window
    rdmx::remote_buffer::bytes buffer{}; ///< PUT: source; GET: sink (its length = capacity)
};

/// The server's counters, sent with the reply to SHUTDOWN and printed when it exits.
struct counters {
    std::uint64_t accepted = 0;  ///< connections accepted
    std::uint64_t closed = 0;    ///< ended by a clean disconnect of the client
    std::uint64_t lost = 0;      ///< ended by an error (a client that died, a failed RDMA)
    std::uint64_t puts = 0;      ///< PUTs stored
    std::uint64_t gets = 0;      ///< GETs served
    std::uint64_t failed = 0;    ///< RDMA operations that completed with an error
    std::uint64_t open = 0;      ///< connections still up when the server stopped
    std::uint64_t conflicts = 0; ///< PUTs refused with status::conflict
};

struct reply {
    std::uint32_t magic = object_store::magic;
    object_store::status status = status::ok;
    std::uint64_t key = 0;
    std::uint64_t size = 0;                    ///< GET: bytes written into the client's buffer
    std::uint64_t version = 0;                 ///< PUT, GET: the version of the key's data
    rdmx::remote_buffer::bytes version_word{}; ///< PUT, GET: the key's version word (or zero)
    counters stats{};                          ///< SHUTDOWN only
};

/// One receive holds any message.
inline constexpr std::size_t message_size = 192;
static_assert(sizeof(request) <= message_size && sizeof(reply) <= message_size);

/// The size of key's object, 4 KiB .. 1 MiB: powers of two and odd sizes between them.
inline std::size_t object_size(std::uint64_t key) noexcept
{
    std::uint64_t h = key * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    std::size_t size = min_object << (h % 9); // 4 KiB .. 1 MiB
    std::size_t trim = (h >> 8) % min_object; // and not only powers of two
    return size > min_object ? size - trim : size;
}

/// Fills `out` with version `version` of key's object: what a GET must return byte for
/// byte after that version was PUT.
inline void fill(std::span<std::byte> out, std::uint64_t key, std::uint64_t version) noexcept
{
    std::uint64_t x = key * 0xbf58476d1ce4e5b9ull + version * 0x94d049bb133111ebull + 1;
    for (std::size_t i = 0; i < out.size(); i += 8) {
        // splitmix64: every 8-byte word differs, so a misplaced or stale block shows.
        std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        std::memcpy(out.data() + i, &z, std::min<std::size_t>(8, out.size() - i));
    }
}

} // namespace object_store
