// Registered memory and the remote-buffer descriptor that a peer uses to reach it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include <rdmx/uri.hpp>

struct ibv_mr;

namespace rdmx
{

/// Access rights of a registration (a bit set).
enum class access : std::uint32_t {
    none = 0,
    local_write = 1u << 0,  ///< the NIC may write it: receive buffers, read sinks
    remote_write = 1u << 1, ///< peers may RDMA-write it (implies local_write)
    remote_read = 1u << 2,  ///< peers may RDMA-read it
    /// Peers may target it with atomics (fetch_add, compare_swap; implies local_write).
    remote_atomic = 1u << 3,
};
constexpr access operator|(access a, access b) noexcept
{
    return static_cast<access>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr access operator&(access a, access b) noexcept
{
    return static_cast<access>(static_cast<std::uint32_t>(a) & static_cast<std::uint32_t>(b));
}
constexpr bool any(access a) noexcept
{
    return a != access::none;
}

/// What a peer needs to reach a registered range: address, length and remote key.
/// Serialises to a fixed-size byte string (little endian) for sending to the peer.
struct remote_buffer {
    std::uint64_t addr = 0;
    std::uint64_t length = 0;
    std::uint64_t key = 0; ///< verbs: the rkey (32 bits); TCP: a random 64-bit key
    rdmx::backend backend = rdmx::backend::verbs;

    /// Layout: "RDMX" magic, version 1, backend, 2 zero bytes, addr, length, key; the
    /// parse rules are in docs/wire-format.md section 9.
    static constexpr std::size_t wire_size = 32;
    using bytes = std::array<std::byte, wire_size>;

    bytes serialize() const noexcept;
    /// Returns nullopt for anything that is not exactly a valid descriptor.
    static std::optional<remote_buffer> parse(std::span<const std::byte> data) noexcept;

    /// The sub-range [offset, offset + len); nullopt if it does not fit.
    std::optional<remote_buffer> slice(std::uint64_t offset, std::uint64_t len) const noexcept;

    friend bool operator==(const remote_buffer&, const remote_buffer&) = default;
};

/// A registered memory region. Created by `domain::register_memory`; deregistered (and
/// remote access revoked at once) when destroyed. May outlive the domain object that
/// registered it: it keeps what it needs of the domain alive (see rdmx::domain).
/// TCP: the destructor never waits for a peer; a frame partly sent from the region is
/// finished from a copy of its rest, and reads not yet answered fail with
/// `remote_access` (docs/wire-format.md section 5).
class memory_region
{
public:
    virtual ~memory_region() = default;
    memory_region(const memory_region&) = delete;
    memory_region& operator=(const memory_region&) = delete;

    std::byte* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    rdmx::access access() const noexcept { return access_; }
    rdmx::backend backend() const noexcept { return backend_; }
    /// Local key (verbs lkey; unused on TCP).
    std::uint32_t local_key() const noexcept { return lkey_; }
    /// The descriptor for [offset, offset + len) of this region (whole region by default).
    /// Throws rdmx::error(invalid_argument) if the range does not fit.
    remote_buffer remote(std::size_t offset = 0, std::size_t len = SIZE_MAX) const;
    /// Verbs backend: the ibv_mr; nullptr on TCP.
    virtual ibv_mr* native() const noexcept { return nullptr; }
    /// Identifies the domain that registered it (checked when posting).
    const void* owner() const noexcept { return owner_; }

protected:
    memory_region(const void* owner, rdmx::backend b, std::byte* data, std::size_t size, rdmx::access acc,
                  std::uint32_t lkey, std::uint64_t rkey) noexcept
        : owner_(owner), backend_(b), data_(data), size_(size), access_(acc), lkey_(lkey), rkey_(rkey)
    {
    }

private:
    const void* owner_;
    rdmx::backend backend_;
    std::byte* data_;
    std::size_t size_;
    rdmx::access access_;
    std::uint32_t lkey_;
    std::uint64_t rkey_;
};

} // namespace rdmx
