// The byte rings of a shm:// connection: the same frame stream as on its UNIX socket, carried
// through memory both processes map (one single-producer single-consumer ring per
// direction), so that a busy-polling reader sees a frame without a system call on either
// side. The socket stays: it carries the handshake, the memfd (SCM_RIGHTS), a one-byte
// doorbell when a reader sleeps (reader_waits), and the end of the stream that says the
// peer went. UCX's posix transport and libfabric's shm provider are the models
// (docs/shm.md, "Rings").
//
// The peer can write anything into the mapping at any time: only the index it owns (the
// writer's tail in the receive ring, the reader's head in the send ring) is read from it,
// once per call, and checked against this side's own index, which it keeps privately.
// An index out of range fails the call with EPROTO (the engine reports a protocol
// violation). The memfd is sealed against shrinking (no SIGBUS from a peer that
// truncates it), and a client maps only one whose size and seals are right.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tcp/tcp_socket.hpp"

namespace rdmx::tcp
{

class byte_ring_pair
{
public:
    /// Bytes per direction (a power of two). Frames of any size pass (the stream is
    /// written in parts); payloads of 32 KiB and more usually go by CMA, as descriptors.
    static constexpr std::size_t capacity = 256u << 10;
    /// The memfd's size: two control pages, then the two rings.
    static constexpr std::size_t map_size = 2 * 4096 + 2 * capacity;

    /// The listener's side: a new sealed memfd (`fd`, to pass to the client) mapped; the
    /// listener writes ring 0 and reads ring 1. nullptr, with `why`, on failure.
    static std::unique_ptr<byte_ring_pair> create(unique_fd& fd, std::string& why) noexcept;
    /// The client's side: maps the listener's memfd after checking its size and seals;
    /// writes ring 1, reads ring 0. nullptr, with `why`, if anything is wrong with it.
    static std::unique_ptr<byte_ring_pair> adopt(int fd, std::string& why) noexcept;
    ~byte_ring_pair();
    /// False if RDMX_SHM_RING is "off" or "0" (read once): shm:// frames go through the
    /// socket, as before the rings (comparison runs).
    static bool enabled() noexcept;
    byte_ring_pair(const byte_ring_pair&) = delete;
    byte_ring_pair& operator=(const byte_ring_pair&) = delete;

    /// As recvmsg: copies what the receive ring holds, up to the iovecs' total (into them
    /// after their first `skip` bytes: a read that goes on). The bytes copied, 0 if it is
    /// empty, -1 with errno EPROTO if the peer's index is out of range. `short_read`, if
    /// given, says whether the ring held less than the iovecs' room (it is empty now).
    ssize_t read(const iovec* iov, int n, std::size_t skip = 0, bool* short_read = nullptr) noexcept;
    /// As sendmsg: copies what fits into the send ring. The bytes copied (0: full), -1 with
    /// errno EPROTO. `doorbell` comes back true when the reader asked to be woken: the
    /// caller sends it a byte on the socket.
    ssize_t write(const iovec* iov, int n, bool& doorbell) noexcept;
    /// The reader is about to wait on the socket: the writer's next write rings the
    /// doorbell. True if bytes came meanwhile (read them instead of waiting).
    bool reader_waits() noexcept;
    /// Nothing to read (or an index out of range, which the next read reports).
    bool rx_empty() const noexcept;
    /// Without the reader's lock, from any thread: whether the peer wrote bytes that this
    /// side has not read. A hint (the mapping's two indices as they are now, relaxed): a
    /// domain's progress looks at its connections' rings with it (domain_progress::run)
    /// and reads under their locks where it says so.
    bool rx_maybe_data() const noexcept
    {
        return rx_ctl_->tail.load(std::memory_order_relaxed) != rx_ctl_->head.load(std::memory_order_relaxed);
    }
    /// The reader's wake flag is still up (reader_waits): the writer has not written since.
    bool reader_asked() const noexcept { return rx_ctl_->wake.load(std::memory_order_relaxed) != 0; }

private:
    /// One direction's control block, on a page of its own. Each index is written by one
    /// side only; `wake` is set by the reader and taken (exchanged to 0) by the writer.
    struct control {
        alignas(64) std::atomic<std::uint64_t> tail; ///< bytes ever written (writer)
        alignas(64) std::atomic<std::uint64_t> head; ///< bytes ever read (reader)
        alignas(64) std::atomic<std::uint32_t> wake; ///< the reader sleeps: ring the doorbell
    };

    byte_ring_pair(void* map, bool listener) noexcept;
    /// Maps the memfd `fd` for one side (create, adopt): nullptr, with `why`, on failure.
    static std::unique_ptr<byte_ring_pair> map_side(int fd, bool listener, std::string& why) noexcept;

    void* map_;
    control* rx_ctl_;
    control* tx_ctl_;
    std::byte* rx_data_;
    std::byte* tx_data_;
    std::uint64_t rx_head_ = 0; ///< this side's own indices, never read back from the mapping
    std::uint64_t tx_tail_ = 0;
    std::uint64_t tx_head_seen_ = 0; ///< the reader's head as last read (write)
    [[maybe_unused]] void* tsan_tx_ =
        nullptr; ///< ThreadSanitizer builds: stand-ins for the tails (tcp_ring.cpp)
    [[maybe_unused]] void* tsan_rx_ = nullptr;
};

} // namespace rdmx::tcp
