// Shared-memory byte rings of shm:// connections (tcp_ring.hpp).
#include "tcp/tcp_ring.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tcp/tcp_env_switch.hpp"

// ThreadSanitizer does not see the rings' ordering: a test's two ends are one process with
// two mappings of the memfd, so the tail a reader acquires lives at another address than the
// one its writer released. Each direction of each memfd gets a stand-in address (by inode)
// that write() releases and read() acquires, so that what a writer did before a frame
// happens before what its reader does after it, as the atomics make it so in fact.
#if defined(__SANITIZE_THREAD__)
#define RDMX_RING_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMX_RING_TSAN 1
#endif
#endif
#ifdef RDMX_RING_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace rdmx::tcp
{

namespace
{

#ifdef RDMX_RING_TSAN
char tsan_sync[4096];
void* tsan_address(int fd, int ring) noexcept
{
    struct stat st {
    };
    ::fstat(fd, &st);
    return &tsan_sync[(st.st_ino * 2 + static_cast<unsigned>(ring)) % sizeof tsan_sync];
}
#endif

constexpr unsigned required_seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

void* map_shared(int fd, std::string& why) noexcept
{
    void* m = ::mmap(nullptr, byte_ring_pair::map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        why = std::string("mmap of the ring memfd: ") + std::strerror(errno);
        return nullptr;
    }
    return m;
}

/// Copies between the ring's data (`len` bytes at position `pos`, wrapping) and the
/// iovecs after their first `skip` bytes, in the direction `into_iov`.
void copy_ring(std::byte* data, std::uint64_t pos, std::size_t len, const iovec* iov, int n, bool into_iov,
               std::size_t skip = 0) noexcept
{
    constexpr std::size_t cap = byte_ring_pair::capacity;
    std::size_t at = static_cast<std::size_t>(pos & (cap - 1));
    for (int i = 0; i < n && len > 0; ++i) {
        const std::size_t past = std::min(skip, iov[i].iov_len);
        skip -= past;
        auto* p = static_cast<std::byte*>(iov[i].iov_base) + past;
        std::size_t left = std::min(iov[i].iov_len - past, len);
        len -= left;
        while (left > 0) {
            const std::size_t step = std::min(left, cap - at);
            if (into_iov)
                std::memcpy(p, data + at, step);
            else
                std::memcpy(data + at, p, step);
            p += step;
            left -= step;
            at = (at + step) & (cap - 1);
        }
    }
}

std::size_t total(const iovec* iov, int n) noexcept
{
    std::size_t t = 0;
    for (int i = 0; i < n; ++i)
        t += iov[i].iov_len;
    return t;
}

} // namespace

byte_ring_pair::byte_ring_pair(void* map, bool listener) noexcept : map_(map)
{
    auto* base = static_cast<std::byte*>(map);
    auto* c0 = reinterpret_cast<control*>(base);
    auto* c1 = reinterpret_cast<control*>(base + 4096);
    std::byte* d0 = base + 2 * 4096;
    std::byte* d1 = d0 + capacity;
    rx_ctl_ = listener ? c1 : c0;
    tx_ctl_ = listener ? c0 : c1;
    rx_data_ = listener ? d1 : d0;
    tx_data_ = listener ? d0 : d1;
}

byte_ring_pair::~byte_ring_pair()
{
    ::munmap(map_, map_size);
}

bool byte_ring_pair::enabled() noexcept
{
    static const bool on = env_switch_on("RDMX_SHM_RING");
    return on;
}

std::unique_ptr<byte_ring_pair> byte_ring_pair::create(unique_fd& fd, std::string& why) noexcept
{
    unique_fd m(::memfd_create("rdmx-shm-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!m) {
        why = std::string("memfd_create: ") + std::strerror(errno);
        return nullptr;
    }
    if (::ftruncate(m.get(), static_cast<off_t>(map_size)) < 0 ||
        ::fcntl(m.get(), F_ADD_SEALS, static_cast<int>(required_seals)) < 0) {
        why = std::string("sizing and sealing the ring memfd: ") + std::strerror(errno);
        return nullptr;
    }
    auto r = map_side(m.get(), true, why);
    if (!r)
        return nullptr;
    // Fresh pages read as zero: both rings empty. Each reader starts asleep, so that the
    // first frames wake whoever waits on the socket.
    r->rx_ctl_->wake.store(1, std::memory_order_relaxed);
    r->tx_ctl_->wake.store(1, std::memory_order_relaxed);
    fd = std::move(m);
    return r;
}

std::unique_ptr<byte_ring_pair> byte_ring_pair::adopt(int fd, std::string& why) noexcept
{
    struct stat st {
    };
    if (::fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || static_cast<std::size_t>(st.st_size) != map_size) {
        why = "the listener's ring memfd is not a file of the ring's size";
        return nullptr;
    }
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (static_cast<unsigned>(seals) & required_seals) != required_seals) {
        why = "the listener's ring memfd is not sealed against resizing";
        return nullptr;
    }
    return map_side(fd, false, why);
}

std::unique_ptr<byte_ring_pair> byte_ring_pair::map_side(int fd, bool listener, std::string& why) noexcept
{
    void* map = map_shared(fd, why);
    if (!map)
        return nullptr;
    std::unique_ptr<byte_ring_pair> r(new (std::nothrow) byte_ring_pair(map, listener));
    if (!r) {
        ::munmap(map, map_size);
        why = "out of memory";
        return nullptr;
    }
#ifdef RDMX_RING_TSAN
    // Ring 0 is the listener's to write, ring 1 the client's.
    r->tsan_tx_ = tsan_address(fd, listener ? 0 : 1);
    r->tsan_rx_ = tsan_address(fd, listener ? 1 : 0);
#endif
    return r;
}

ssize_t byte_ring_pair::read(const iovec* iov, int n, std::size_t skip, bool* short_read) noexcept
{
    const std::uint64_t tail = rx_ctl_->tail.load(std::memory_order_acquire);
    const std::uint64_t avail = tail - rx_head_;
    if (avail > capacity) {
        errno = EPROTO;
        return -1;
    }
    const std::size_t room = total(iov, n);
    const std::size_t want = room - std::min(skip, room);
    const std::size_t len = std::min<std::size_t>(static_cast<std::size_t>(avail), want);
    if (short_read)
        *short_read = len < want;
    if (len == 0)
        return 0;
#ifdef RDMX_RING_TSAN
    __tsan_acquire(tsan_rx_);
#endif
    copy_ring(rx_data_, rx_head_, len, iov, n, true, skip);
    rx_head_ += len;
    rx_ctl_->head.store(rx_head_, std::memory_order_release);
    return static_cast<ssize_t>(len);
}

ssize_t byte_ring_pair::write(const iovec* iov, int n, bool& doorbell) noexcept
{
    doorbell = false;
    const std::size_t want = total(iov, n);
    // The reader's head as last seen: it only grows, so the room it shows is there. Looked
    // at again (a cache miss: the reader writes that line) only when that is not enough.
    if (capacity - (tx_tail_ - tx_head_seen_) < want) {
        const std::uint64_t head = tx_ctl_->head.load(std::memory_order_acquire);
        if (tx_tail_ - head > capacity || head - tx_head_seen_ > capacity) {
            errno = EPROTO; // past what was written, or behind what it said before
            return -1;
        }
        tx_head_seen_ = head;
    }
    const std::uint64_t used = tx_tail_ - tx_head_seen_;
    const std::size_t len = std::min<std::size_t>(static_cast<std::size_t>(capacity - used), want);
    if (len == 0)
        return 0;
    copy_ring(tx_data_, tx_tail_, len, iov, n, false);
    tx_tail_ += len;
#ifdef RDMX_RING_TSAN
    __tsan_release(tsan_tx_);
#endif
    tx_ctl_->tail.store(tx_tail_, std::memory_order_release);
    // Pairs with reader_waits(): either the reader sees this tail when it looks again, or
    // this side sees its flag.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    doorbell = tx_ctl_->wake.load(std::memory_order_relaxed) != 0 &&
               tx_ctl_->wake.exchange(0, std::memory_order_relaxed) != 0;
    return static_cast<ssize_t>(len);
}

bool byte_ring_pair::reader_waits() noexcept
{
    rx_ctl_->wake.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return !rx_empty();
}

bool byte_ring_pair::rx_empty() const noexcept
{
    return rx_ctl_->tail.load(std::memory_order_acquire) == rx_head_;
}

} // namespace rdmx::tcp
