// shm://: the peer's allocated regions (domain::allocate_memory) mapped into this process,
// so that an RDMA write or read into one is a copy this side makes itself (tcp_post.cpp,
// docs/shm.md "Allocated regions"). A part of the connection engine, used under its lock.
//
// The key of such a region says so (shared_key_bit) and names the memfd in the owner's
// process (its descriptor number, the bits below). This side takes the descriptor with
// pidfd_getfd, which the kernel allows where it allows process_vm_writev (the same
// ptrace check), and maps it only once it has checked that it is a memfd sealed against
// shrinking whose control page (shared_memory.hpp) names this very key: a descriptor
// number reused by another file, a region gone, a key forged by the peer all fail that
// check, and the request goes the usual way (the target checks the key and answers).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "shared_memory.hpp"

namespace rdmx::tcp
{

/// Keys of allocated regions that peers may map: this bit, and the memfd's descriptor
/// number in the bits below it. Every other key of a TCP domain has the bit clear.
inline constexpr std::uint64_t shared_key_bit = std::uint64_t{1} << 23;
inline constexpr std::uint64_t shared_key_fd_mask = shared_key_bit - 1;

/// RDMA writes and reads this process made by copying into a peer's mapped region (for tests).
std::uint64_t mapped_copies() noexcept;
void note_mapped_copy() noexcept;

class shared_map_cache
{
public:
    /// One mapped region of the peer.
    struct region {
        std::uint64_t key = 0;
        std::byte* data = nullptr; ///< the first byte of the region's data here
        std::uint64_t base = 0;    ///< its address in the peer's process (what remote addresses name)
        std::uint64_t size = 0;
        std::uint64_t rights = 0;
        const detail::shared_control* control = nullptr;
    };

    shared_map_cache() = default;
    ~shared_map_cache();
    shared_map_cache(const shared_map_cache&) = delete;
    shared_map_cache& operator=(const shared_map_cache&) = delete;

    /// The peer region `key` names (shared_key_bit set), mapped now on its first use
    /// through `pidfd` (the peer process's); nullptr where it cannot be mapped, which is
    /// remembered: a key is tried once (until it is evicted by 16 others).
    const region* find(std::uint64_t key, int pidfd) noexcept;
    /// The region `r` is gone (its live word was 0): unmapped, and its key not tried again.
    void drop(const region* r) noexcept;

private:
    struct slot {
        region r;
        bool mapped = false; ///< else a key that could not be mapped
        void* map = nullptr;
        std::size_t map_len = 0;
    };
    void unmap(slot& s) noexcept;
    /// pidfd_getfd, the checks, the mapping; false (and `s` unmapped) on any failure.
    bool map(slot& s, std::uint64_t key, int pidfd) noexcept;

    std::array<slot, 16> slots_{};
    unsigned next_ = 0; ///< the slot the next new key takes (round robin)
};

} // namespace rdmx::tcp
