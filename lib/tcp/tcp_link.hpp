// The byte stream under one connection's frames: its socket, or a shm:// connection's rings
// (tcp_ring.hpp) with the socket as their doorbell and as the sign of the peer's end. The
// framing above (tcp_receive.cpp, tcp_transmit.cpp) reads and writes through recv() and
// send() and waits as it does on a socket: a reader that found the rings empty sleeps on
// the socket, which its peer's next write rings (docs/shm.md, "Rings").
//
// A part of the connection engine with its own state, owned by it and used under its lock
// (one reader and one writer at a time); it neither locks nor knows who reads. The caller
// says how the reader waits (link_waiter), which is the engine's business (rx_may_sleep).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "tcp/tcp_ring.hpp"

namespace rdmx::tcp
{

/// How the reader of a link waits when it finds nothing (rings only: a socket's reader
/// waits on the socket either way).
enum class link_waiter : std::uint8_t {
    /// It polls and never sleeps on the socket: the peer need not ring, and the socket (its
    /// doorbells, the peer's end) is looked at only every 1024th empty read or once it was
    /// found readable (socket_readable).
    polls,
    /// It sleeps on the socket: an empty ring raises the wake flag, so that the peer's next
    /// write rings.
    sleeps,
    /// A shared queue's poller about to sleep on the domain's sockets: as `sleeps`, but a
    /// wake flag still up (nothing written since it went up) saves the socket's look.
    sleeps_flag_kept,
};

class stream_link
{
public:
    /// What the link is now: a socket until rings are taken (use_rings), rings for good after.
    enum class mode : std::uint8_t { socket, rings };
    /// take_doorbells: the socket emptied of doorbells (taken), its end or an error (end;
    /// errno 0 at the end of the stream, else the error), or four buffers full (more: a peer
    /// that floods; again later).
    enum class doorbells : std::uint8_t { taken, end, more };

    /// next_space_wait doubles while the ring stays full, from 20 us to 1 ms.
    static constexpr unsigned backoff_min_us = 20, backoff_max_us = 1000;
    /// A read wait in the middle of a payload of at least wake_mark_min bytes still to come
    /// wakes when min(to come, wake_mark_max) have arrived (SO_RCVLOWAT), not at the first
    /// byte: each wake costs the reader a switch and the sender an IPI.
    static constexpr std::uint64_t wake_mark_min = 64u << 10;
    static constexpr std::uint64_t wake_mark_max = 256u << 10;

    /// `fd`: the connection's socket (not owned; it must outlive the link's use).
    explicit stream_link(int fd) noexcept : fd_(fd) {}

    mode current() const noexcept { return rings_ ? mode::rings : mode::socket; }
    bool uses_rings() const noexcept { return rings_ != nullptr; }
    /// The rings, for a look without the owner's lock (byte_ring_pair::rx_maybe_data); null
    /// on a socket.
    const byte_ring_pair* rings() const noexcept { return rings_.get(); }
    /// From now on frames go through `r` (the listener's, or the client's from the ACCEPT).
    void use_rings(std::unique_ptr<byte_ring_pair> r) noexcept { rings_ = std::move(r); }
    /// The socket was found readable (a domain's progress): the next empty ring read looks
    /// at it at once, whoever reads.
    void socket_readable() noexcept { socket_ready_ = rings_ != nullptr; }

    /// As recvmsg with MSG_DONTWAIT: bytes, 0 at the end of the stream, -1 with errno
    /// (EAGAIN; EINTR: doorbells to read again; EPROTO: a ring index of the peer out of
    /// range). `sink`: where doorbells are read to.
    ssize_t recv(const iovec* iov, int n, link_waiter how, std::span<std::byte> sink) noexcept;
    /// As sendmsg with MSG_DONTWAIT | MSG_NOSIGNAL: bytes, -1 with errno (EAGAIN: the ring
    /// or socket is full; EPIPE: the peer of a full ring went; EPROTO).
    ssize_t send(const iovec* iov, int n) noexcept;
    /// Nothing to read now (busy-poll ownership's probe): MSG_PEEK on a socket, the ring's
    /// indices on rings.
    bool empty() noexcept;
    /// Rings: reads the doorbells from the socket (see doorbells). A socket: taken.
    doorbells take_doorbells(std::span<std::byte> sink) noexcept;
    /// Before its reader sleeps on the socket (rings): reads the doorbells, then, with
    /// `raise_flag`, raises the wake flag, in that order (a doorbell left in the socket would
    /// wake the wait at once). True if the reader must read instead: the end of the stream
    /// or an error is there, or (with the flag raised) bytes came that no doorbell will
    /// announce. False on a socket.
    bool must_read_before_wait(std::span<std::byte> sink, bool raise_flag = true) noexcept;
    /// The ring holds bytes (rings; false on a socket, where empty() asks the kernel).
    bool ring_has_data() const noexcept { return rings_ && !rings_->rx_empty(); }
    /// The send ring is full: how long to wait before trying again (doubling from
    /// backoff_min_us to backoff_max_us while it stays full; a write that goes in resets it).
    std::chrono::microseconds next_space_wait() noexcept;

    // --- the socket's wake mark (SO_RCVLOWAT), for the reader's wait on a socket link ---
    /// The mark for a wait armed now with `to_come` payload bytes still to come from the
    /// socket (0 between frames): 1 below wake_mark_min, else min(to_come, wake_mark_max).
    /// Never more than what is to come: what follows it may never be sent (a peer that
    /// waits for our answer), so a larger mark would never be reached.
    static int wake_mark_for(std::uint64_t to_come) noexcept
    {
        return to_come >= wake_mark_min ? static_cast<int>(to_come < wake_mark_max ? to_come : wake_mark_max)
                                        : 1;
    }
    int wake_mark() const noexcept { return wake_mark_; }
    /// Sets the socket's SO_RCVLOWAT to `bytes` where that changes it. Never on rings (the
    /// socket carries one-byte doorbells, each of them a wake). A hint: where the kernel
    /// refuses it the mark stays, and waking at every byte is still correct.
    void set_wake_mark(int bytes) noexcept;
    /// A read consumed part of what a wait armed at the current mark waits for: the mark
    /// comes down to wake_mark_for(to_come) where that is lower, never up. The kernel
    /// re-checks readiness in setsockopt (tcp_set_rcvlowat), so a wait whose new mark the
    /// bytes already there reach wakes at once.
    void keep_wake_mark_reachable(std::uint64_t to_come) noexcept
    {
        if (wake_mark_ > 1)
            if (const int want = wake_mark_for(to_come); want < wake_mark_)
                set_wake_mark(want);
    }

private:
    const int fd_;
    std::unique_ptr<byte_ring_pair> rings_;
    unsigned idle_ = 0;         ///< empty ring reads of a reader that polls (recv)
    bool socket_ready_ = false; ///< socket_readable(), not yet acted on
    unsigned backoff_us_ = backoff_min_us;
    int wake_mark_ = 1; ///< the socket's SO_RCVLOWAT (set_wake_mark)
};

} // namespace rdmx::tcp
