// Registered memory and the remote-buffer descriptor that a peer uses to reach it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>

#include <rdmx/uri.hpp>

struct ibv_mr;
struct ibv_mw;

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
    /// Memory windows may be bound over it (verbs IBV_ACCESS_MW_BIND); needs
    /// device_limits::memory_windows. The window's own rights are a subset of the region's
    /// remote rights.
    bind_window = 1u << 4,
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

/// Where memory lives (libfabric's FI_HMEM iface, UCX's memory type).
enum class memory_type : std::uint8_t {
    /// register_memory finds out: device memory if the CUDA driver is loaded in the process
    /// and says so (cuPointerGetAttribute), host memory otherwise. Costs nothing in a
    /// process that never loaded CUDA.
    detect,
    host, ///< host memory, pageable or pinned (cudaMallocHost is host memory)
    /// CUDA device memory: cudaMalloc / cuMemAlloc, or CUDA virtual memory (cuMemCreate +
    /// cuMemMap) spanning several allocations mapped back to back. Managed memory
    /// (cudaMallocManaged) is refused. docs/gpu.md says how each backend reaches it.
    cuda,
};

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
/// `remote_access` (docs/wire-format.md section 5). verbs: the region's keys stop
/// working, but siw finishes a read response it had started, from the pages it pinned, after
/// the destructor returns. So keep the memory's bytes until the connections (or the
/// endpoint) that may still read it are destroyed: declare the memory first.
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
    /// host or cuda (never detect): where the registered memory lives.
    rdmx::memory_type memory_type() const noexcept { return type_; }
    /// The CUDA device of device memory (its ordinal); -1 for host memory.
    int device() const noexcept { return device_; }
    /// Local key (verbs lkey; unused on TCP).
    std::uint32_t local_key() const noexcept { return lkey_; }
    /// The descriptor for [offset, offset + len) of this region (whole region by default).
    /// Throws rdmx::error(invalid_argument) if the range does not fit.
    remote_buffer remote(std::size_t offset = 0, std::size_t len = SIZE_MAX) const;
    /// Verbs backend: the ibv_mr; nullptr on TCP.
    virtual ibv_mr* native() const noexcept { return nullptr; }
    /// Identifies the domain that registered it (checked when posting).
    const void* owner() const noexcept { return owner_; }
    /// Whether the region owns its memory (domain::allocate_memory): freed after it is
    /// deregistered.
    bool owns_memory() const noexcept { return owned_ != nullptr; }

protected:
    memory_region(const void* owner, rdmx::backend b, std::byte* data, std::size_t size, rdmx::access acc,
                  std::uint32_t lkey, std::uint64_t rkey, rdmx::memory_type type = memory_type::host,
                  int device = -1) noexcept
        : owner_(owner), backend_(b), type_(type), device_(device), data_(data), size_(size), access_(acc),
          lkey_(lkey), rkey_(rkey)
    {
    }

private:
    const void* owner_;
    rdmx::backend backend_;
    rdmx::memory_type type_;
    int device_;
    std::byte* data_;
    std::size_t size_;
    rdmx::access access_;
    std::uint32_t lkey_;
    std::uint64_t rkey_;
    /// domain::allocate_memory's memory: destroyed after the derived destructor has
    /// deregistered the region.
    std::shared_ptr<void> owned_;
    friend class domain;
};

/// A memory window (type 2, as verbs `ibv_alloc_mw(IBV_MW_TYPE_2)`): a key of its own over
/// a sub-range of a registered region, with rights of its own, that its owner hands to one
/// peer instead of the region's key and revokes at will (docs/memory-windows.md).
/// Created by `domain::allocate_window`, unbound. The owner binds it through a connection
/// (`connection::post_bind_window`, opcode::bind_window); from then on only that
/// connection's peer can reach [addr, addr + length) with it, and only with the window's
/// rights. Each bind gives it a new key, so descriptors of earlier binds stop working. It
/// is revoked by `connection::post_invalidate_window` (opcode::invalidate_window), by the
/// peer's opcode::send_with_invalidate naming its key, or by destroying it; an access
/// outside it, with rights it lacks, or after revocation is errc::remote_access (iWARP: the
/// connection is torn down) and touches nothing. Destroying the region under a bound
/// window revokes the window too (verbs: the window gets a fresh, unbound ibv_mw, so
/// native() changes). On every backend a bound window must be invalidated before it is
/// bound again, and only a bound one can be invalidated (IBTA o10-37.2.30; post() refuses
/// either with errc::invalid_argument): it is free again once this side posted its
/// invalidation, polled the receive of the peer's send_with_invalidate naming it, or
/// destroyed the region under it.
/// Not thread-safe against posts that name it.
class memory_window
{
public:
    virtual ~memory_window() = default;
    memory_window(const memory_window&) = delete;
    memory_window& operator=(const memory_window&) = delete;

    /// The descriptor a peer uses, as of the last bind posted (its key, range and
    /// backend); all zero before the first bind. Valid for the peer once the bind has
    /// completed, or at once for messages the owner sends after the bind on the same
    /// connection (posts on one connection are ordered).
    const remote_buffer& remote() const noexcept { return remote_; }
    rdmx::backend backend() const noexcept { return backend_; }
    /// Verbs backend: the ibv_mw; nullptr on TCP.
    virtual ibv_mw* native() const noexcept { return nullptr; }
    /// Identifies the domain that allocated it (checked when posting).
    const void* owner() const noexcept { return owner_; }

protected:
    memory_window(const void* owner, rdmx::backend b) noexcept : owner_(owner), backend_(b) {}
    remote_buffer remote_{};

private:
    const void* owner_;
    rdmx::backend backend_;
};

} // namespace rdmx
