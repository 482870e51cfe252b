// domain::allocate_memory's memory (shared_memory.hpp).
#include "shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <rdmx/error.hpp>

namespace rdmx::detail
{

std::size_t shared_memory::page_size() noexcept
{
    static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return p;
}

shared_memory::shared_memory(std::size_t length) : page_(page_size()), size_(length)
{
    // Whole pages, one of them the control page; a length that wraps is refused here.
    const std::size_t data_pages = (length + page_ - 1) / page_;
    if (length > SIZE_MAX - 2 * page_ || data_pages > (SIZE_MAX / page_) - 1)
        throw_error(errc::invalid_argument, "allocate_memory: length too large");
    map_len_ = (data_pages + 1) * page_;
    fd_ = ::memfd_create("rdmx-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ < 0)
        throw_errno(errno, "memfd_create");
    // Sealed against shrinking and growing: a peer that maps it can never be made to fault
    // (SIGBUS) past its end, nor can the peer change its size under this process.
    if (::ftruncate(fd_, static_cast<off_t>(map_len_)) != 0) {
        const int err = errno;
        ::close(fd_);
        throw_errno(err, "ftruncate (allocate_memory)");
    }
    if (::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        const int err = errno;
        ::close(fd_);
        throw_errno(err, "fcntl(F_ADD_SEALS) (allocate_memory)");
    }
    void* m = ::mmap(nullptr, map_len_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) {
        const int err = errno;
        ::close(fd_);
        throw_errno(err, "mmap (allocate_memory)");
    }
    map_ = static_cast<std::byte*>(m);
}

shared_memory::~shared_memory()
{
    live_word(control()).store(0, std::memory_order_seq_cst);
    ::munmap(map_, map_len_);
    ::close(fd_);
}

void shared_memory::publish(std::uint64_t key, std::uint64_t rights) noexcept
{
    shared_control& c = control();
    c.key = key;
    c.base = reinterpret_cast<std::uintptr_t>(data());
    c.size = size_;
    c.rights = rights;
    live_word(c).store(1, std::memory_order_release);
    std::atomic_ref<std::uint64_t>(c.magic).store(shared_magic, std::memory_order_release);
}

} // namespace rdmx::detail
