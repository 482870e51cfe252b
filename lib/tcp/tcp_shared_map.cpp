// The peer's allocated regions, mapped (tcp_shared_map.hpp).
#include "tcp/tcp_shared_map.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <rdmx/memory.hpp>

#include "log.hpp"

namespace rdmx::tcp
{

namespace
{
std::atomic<std::uint64_t> mapped_copy_count{0};
} // namespace

std::uint64_t mapped_copies() noexcept
{
    return mapped_copy_count.load(std::memory_order_relaxed);
}

void note_mapped_copy() noexcept
{
    mapped_copy_count.fetch_add(1, std::memory_order_relaxed);
}

shared_map_cache::~shared_map_cache()
{
    for (slot& s : slots_)
        unmap(s);
}

void shared_map_cache::unmap(slot& s) noexcept
{
    if (s.map)
        ::munmap(s.map, s.map_len);
    s = slot{};
}

const shared_map_cache::region* shared_map_cache::find(std::uint64_t key, int pidfd) noexcept
{
    for (slot& s : slots_)
        if (s.r.key == key)
            return s.mapped ? &s.r : nullptr;
    if (pidfd < 0)
        return nullptr;
    slot& s = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    unmap(s);
    s.r.key = key; // remembered either way: a key is tried once
    if (!map(s, key, pidfd))
        return nullptr;
    return &s.r;
}

void shared_map_cache::drop(const region* r) noexcept
{
    for (slot& s : slots_)
        if (&s.r == r) {
            const std::uint64_t key = s.r.key;
            unmap(s);
            s.r.key = key; // gone for good: the usual way from now on
        }
}

bool shared_map_cache::map(slot& s, std::uint64_t key, int pidfd) noexcept
{
    const int remote_fd = static_cast<int>(key & shared_key_fd_mask);
    const long got = ::syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0);
    if (got < 0) {
        RDMX_LOG(debug, "shm: pidfd_getfd of the peer's region %#llx: %s (its requests go the usual way)",
                 static_cast<unsigned long long>(key), std::strerror(errno));
        return false;
    }
    const int fd = static_cast<int>(got);
    const std::size_t page = detail::shared_memory::page_size();
    bool ok = false;
    void* m = MAP_FAILED;
    std::size_t len = 0;
    struct stat st {
    };
    const int seals = ::fcntl(fd, F_GET_SEALS);
    // A memfd (only they take seals) that can never shrink under this mapping, holding a
    // control page and whole pages of data.
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && seals >= 0 && (seals & F_SEAL_SHRINK) != 0 &&
        st.st_size >= static_cast<off_t>(page) && st.st_size % static_cast<off_t>(page) == 0) {
        len = static_cast<std::size_t>(st.st_size);
        // Read-only first: nothing is written before the control page is checked.
        m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
    }
    if (m != MAP_FAILED) {
        const auto* c = static_cast<const detail::shared_control*>(m);
        // Each field read once, then checked and kept: the peer may change the page later.
        const std::uint64_t magic =
            std::atomic_ref<const std::uint64_t>(c->magic).load(std::memory_order_acquire);
        const std::uint64_t ckey = c->key, size = c->size, rights = c->rights, base = c->base;
        ok = magic == detail::shared_magic && ckey == key && size <= len - page && detail::live_of(*c) == 1 &&
             base + size >= base;
        // Writable only where the registration lets peers write.
        if (ok && (rights & static_cast<std::uint64_t>(access::remote_write)) != 0)
            ok = ::mprotect(m, len, PROT_READ | PROT_WRITE) == 0;
        if (ok) {
            s.r = {.key = key,
                   .data = static_cast<std::byte*>(m) + page,
                   .base = base,
                   .size = size,
                   .rights = rights,
                   .control = c};
            s.mapped = true;
            s.map = m;
            s.map_len = len;
        } else {
            ::munmap(m, len);
        }
    }
    ::close(fd);
    if (!ok)
        RDMX_LOG(debug,
                 "shm: the peer's descriptor for key %#llx is not its allocated region (its requests go "
                 "the usual way)",
                 static_cast<unsigned long long>(key));
    return ok;
}

} // namespace rdmx::tcp
