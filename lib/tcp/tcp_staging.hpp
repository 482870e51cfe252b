// Staging: how the engine reaches registered memory its CPU cannot address (CUDA device
// memory), and, for tests, host memory it is told to treat the same way
// (RDMX_TCP_FORCE_STAGING=1 or 2). A socket call never touches such memory: a send gathers
// from host chunks that a copy filled before it, a receive scatters into chunks that a
// copy empties after it, the copies asynchronous so that they overlap the socket calls
// (docs/gpu.md, "TCP: staged through host memory"). The chunks come from a pool the domain
// makes when the first such region is registered, so the data path allocates nothing
// unless more socket calls stage at once than the pool foresaw (then one more chunk,
// counted).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace rdmx::tcp
{

/// How the engine reaches a region's memory.
enum class staging : std::uint8_t {
    none, ///< directly: socket calls and memcpy on the application's pointers
    host, ///< host memory staged anyway (RDMX_TCP_FORCE_STAGING: tests of the staging path)
    cuda, ///< CUDA device memory: cuMemcpyDtoH / cuMemcpyHtoD through the chunks
};

/// Copies between staged memory and chunks that may still run after the call that started
/// them (bounce_pool::start), complete once bounce_pool::finish returned: the driver's
/// asynchronous copies on the pool's stream for the device, so that a copy overlaps the
/// socket call beside it. Host memory staged for tests is copied at once, or, under
/// RDMX_TCP_FORCE_STAGING=2, only in finish(): what a copy that completes late does, in
/// tests without a GPU.
class copy_batch
{
public:
    /// The most copies in flight in one batch (a receive's SGEs, and one more).
    static constexpr int max_copies = 40;
    bool empty() const noexcept { return n_ == 0 && devices_ == 0; }

private:
    friend class bounce_pool;
    struct deferred {
        std::byte* dst;
        const std::byte* src;
        std::size_t n;
    };
    deferred copies_[max_copies];
    int n_ = 0;                 ///< deferred host copies
    std::uint32_t devices_ = 0; ///< devices (< 32) with copies in flight on their stream
};

/// Host chunks that socket calls stage through; page-locked (cuMemHostAlloc) once device
/// memory was registered, so that the driver copies them by DMA.
class bounce_pool
{
public:
    /// Bytes per chunk by default: the most one socket call moves from or to staged
    /// memory. RDMX_TCP_STAGING_CHUNK (bytes, 4 KiB to 16 MiB) sets another when the domain
    /// is made, for benchmarks (tests/gpu/device-check.sh measures two).
    static constexpr std::size_t default_chunk_size = 256 * 1024;
    /// Chunks made when the first staged region is registered: a pump() and a read run
    /// take two each, on the engine thread and an application thread at once.
    static constexpr std::size_t initial_chunks = 8;

    /// Reads RDMX_TCP_STAGING_CHUNK.
    bounce_pool();
    ~bounce_pool();
    bounce_pool(const bounce_pool&) = delete;
    bounce_pool& operator=(const bounce_pool&) = delete;

    /// A region of kind `s` (on CUDA device `device`) is registered (set-up; may
    /// allocate): the first makes the initial chunks, the first device one makes later
    /// chunks page-locked (portable: for every device). Throws rdmx::error if no memory
    /// can be had.
    void prepare(staging s, int device);
    /// A free chunk, or (none free) a new one, counted in grown(); nullptr if that failed.
    std::byte* take() noexcept;
    void give(std::byte* chunk) noexcept;

    std::size_t chunk_size() const noexcept { return chunk_size_; }

    /// Copies `n` bytes of staged memory at `src` to the host at `dst` (`out`), or host
    /// bytes at `src` to staged memory at `dst`, as part of `b`: it may still run when
    /// this returns (see copy_batch); the bytes are in place once finish(b) returned true.
    /// false if the driver refused it (logged): nothing runs then.
    bool start(copy_batch& b, bool out, staging s, int device, std::byte* dst, const std::byte* src,
               std::size_t n) noexcept;
    /// Waits for `b`'s copies (or makes the deferred ones); false if one failed (logged).
    bool finish(copy_batch& b) noexcept;
    /// Copies `n` bytes as start() does, finished when this returns (memcpy for host
    /// memory, cuMemcpyDtoH / cuMemcpyHtoD for device memory), where nothing runs beside
    /// it. false if the driver failed (logged, rate-limited, naming the call and its error).
    bool copy_now(bool out, staging s, int device, std::byte* dst, const std::byte* src,
                  std::size_t n) noexcept;
    /// RDMX_TCP_FORCE_STAGING=2: host copies wait for finish() (tests).
    void defer_host_copies() noexcept { defer_ = true; }
    /// Chunks made on the data path because all were in use (tests, statistics).
    std::uint64_t grown() const noexcept { return grown_.load(std::memory_order_relaxed); }
    /// Bytes copied out of and into staged memory so far (tests: the path was taken).
    std::uint64_t bytes_out() const noexcept { return out_.load(std::memory_order_relaxed); }
    std::uint64_t bytes_in() const noexcept { return in_.load(std::memory_order_relaxed); }
    void count_out(std::size_t n) noexcept { out_.fetch_add(n, std::memory_order_relaxed); }
    void count_in(std::size_t n) noexcept { in_.fetch_add(n, std::memory_order_relaxed); }

private:
    struct chunk {
        std::byte* p = nullptr;
        bool pinned = false; ///< cuMemHostAlloc'd (else operator new)
    };
    chunk make() noexcept;

    std::size_t chunk_size_ = default_chunk_size;
    std::mutex mu_;
    std::vector<chunk> all_;
    std::vector<std::byte*> free_;
    bool pin_ = false;    ///< device memory was registered: new chunks are page-locked
    int pin_device_ = -1; ///< whose primary context allocates and frees them
    bool defer_ = false;
    /// RDMX_TCP_STAGING_FAIL=N: every Nth copy of host memory staged for tests fails, as a
    /// driver's copy can, so that tests reach the failure paths without a GPU.
    std::uint64_t fail_every_ = 0;
    std::atomic<std::uint64_t> copies_{0};
    bool injected_failure(staging s) noexcept;
    /// Per device (< 32), the stream that asynchronous copies run on (cuStreamCreate,
    /// non-blocking); made when the device's first region is registered, written under
    /// mu_ before that region's key is published, read without it after.
    void* streams_[32] = {};
    std::atomic<std::uint64_t> grown_{0}, out_{0}, in_{0};
};

} // namespace rdmx::tcp
