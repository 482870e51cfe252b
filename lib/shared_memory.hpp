// Memory that a domain allocates (domain::allocate_memory): a sealed memfd mapped with one
// control page before the data. A peer on this host that reaches the region over shm://
// maps the same pages (tcp_shared_map.hpp) and copies into and out of them itself; the
// control page tells it what the pages are and whether they are still registered.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rdmx::detail
{

/// The first page of the memfd. Its owner writes it; a peer that maps the region only reads
/// it (its mapping is writable where the region takes remote writes, this page included),
/// and keeps what it checked at the mapping (tcp_shared_map.cpp).
struct shared_control {
    std::uint64_t magic;  ///< shared_magic once published
    std::uint64_t key;    ///< the region's key
    std::uint64_t base;   ///< the data's address in the owner's process
    std::uint64_t size;   ///< bytes of data (the memfd holds the control page and these)
    std::uint64_t rights; ///< rdmx::access bits of the registration
    /// 1 while registered; 0 from the region's destruction on, before its owner unmaps the
    /// data: a peer that finds 1 after its copy copied while the region was registered.
    std::uint64_t live;
};
inline constexpr std::uint64_t shared_magic = 0x31524853584d4452; // "RDMXSHR1"

/// The live word of `c`, for atomic access from either process.
inline std::atomic_ref<std::uint64_t> live_word(shared_control& c) noexcept
{
    return std::atomic_ref<std::uint64_t>(c.live);
}
inline std::uint64_t live_of(const shared_control& c) noexcept
{
    return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(c.live)).load(std::memory_order_acquire);
}

class shared_memory
{
public:
    /// `length` bytes (at least one page is mapped), zeroed. Throws rdmx::error naming the
    /// call that failed (memfd_create, ftruncate, fcntl, mmap).
    explicit shared_memory(std::size_t length);
    /// Marks the region gone (live = 0), then unmaps and closes: a peer's mapping keeps the
    /// pages, none of them this process's any more.
    ~shared_memory();
    shared_memory(const shared_memory&) = delete;
    shared_memory& operator=(const shared_memory&) = delete;

    std::byte* data() const noexcept { return map_ + page_; }
    std::size_t size() const noexcept { return size_; }
    int fd() const noexcept { return fd_; }
    /// Called once the region is registered: what a peer checks before it maps the data.
    void publish(std::uint64_t key, std::uint64_t rights) noexcept;
    /// Bytes of the control page (the data's offset in the memfd).
    static std::size_t page_size() noexcept;

private:
    shared_control& control() const noexcept { return *reinterpret_cast<shared_control*>(map_); }

    int fd_ = -1;
    std::byte* map_ = nullptr;
    std::size_t page_ = 0;
    std::size_t size_ = 0;
    std::size_t map_len_ = 0;
};

} // namespace rdmx::detail
