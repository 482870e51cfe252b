// Receive framing as socket-free parts of the engine: the stage that reads run ahead into,
// and the frame being received (its header, what its payload is for, where the payload's
// next byte goes). tcp_receive.cpp reads the socket into them; tests/tcp/rx_frame_test.cpp
// runs them without one.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{

/// Bytes read ahead of the frame being interpreted: a read that starts a frame goes here,
/// so that headers, frames without a payload (ACKs, read requests) and small payloads
/// arrive several to one system call. Payload bytes that came with their header are
/// copied out of it; the rest of a payload is read straight into its destination.
class rx_stage
{
public:
    static constexpr std::size_t size = 1024;
    static_assert(size >= frame_header::wire_size);

    /// Unconsumed bytes, and where they begin.
    std::size_t staged() const noexcept { return end_ - begin_; }
    const std::byte* data() const noexcept { return buf_ + begin_; }
    /// Consumes n staged bytes (n <= staged()); an emptied stage starts again at its front.
    void consume(std::size_t n) noexcept
    {
        begin_ += n;
        if (begin_ == end_)
            begin_ = end_ = 0;
    }
    /// Room for a read that completes a header: a partial one moves to the front first
    /// (the buffer is the reader's again), then everything after the staged bytes.
    std::span<std::byte> room_after() noexcept
    {
        if (begin_ > 0) {
            std::memmove(buf_, buf_ + begin_, staged());
            end_ -= begin_;
            begin_ = 0;
        }
        return {buf_ + end_, size - end_};
    }
    /// A read into room_after() took n bytes.
    void filled(std::size_t n) noexcept { end_ += n; }
    /// The whole buffer, for a read that runs ahead of a payload: the next frames come with
    /// it, saving a system call per frame. The stage is empty then (a payload is read from
    /// the socket only once its staged bytes are consumed); read_ahead_took(n) says what
    /// came, 0 if the read did not reach it.
    std::span<std::byte> empty_for_read_ahead() noexcept
    {
        begin_ = end_ = 0;
        return {buf_, size};
    }
    void read_ahead_took(std::size_t n) noexcept { end_ = n; }

private:
    std::byte buf_[size];
    std::size_t begin_ = 0; ///< unconsumed bytes: [begin_, end_)
    std::size_t end_ = 0;
};

/// What the payload of the frame being received is for: the receive side's state (none
/// between frames, while a header is read).
enum class rx_action : std::uint8_t {
    none,          ///< reading a header
    recv,          ///< send: into the posted receive
    recv_overflow, ///< send larger than the receive: drain, local_length, NAK
    rnr,           ///< no receive posted: drain, then NAK rnr
    drop,          ///< after an RNR NAK, requests until the NAKed one are drained silently
    write,         ///< into target memory, then ACK
    write_imm,     ///< into target memory, then consume a receive and ACK
    write_bad,     ///< access violation: drain, then NAK remote_access
    read_resp,     ///< into the read's local SGEs
    atomic,        ///< the operands of an atomic request, into operands; then execute_atomic
    atomic_resp,   ///< the old value, into operands; then into the atomic's local SGE
    cma,           ///< a CMA request's descriptors (shm://), into cma; then serve_cma
};

/// The frame being received: its header, its action, the payload bytes still to come and
/// the position in the memory they go to (a list of segs, walked as bytes arrive wherever
/// they landed: read straight in, copied from the stage, or through a staging chunk).
struct rx_frame {
    rx_frame() = default;
    rx_frame(const rx_frame&) = delete; // segs may point at its own `one`
    rx_frame& operator=(const rx_frame&) = delete;

    frame_header hdr;
    rx_action action = rx_action::none;
    std::uint64_t left = 0; ///< payload bytes not yet received
    const seg* segs = nullptr;
    std::uint32_t nseg = 0;
    std::uint32_t seg_i = 0;   ///< the seg the next byte goes to
    std::uint64_t seg_off = 0; ///< and its offset there
    bool fault = false;        ///< a destination region vanished (or a copy failed) during the payload
    seg one;                   ///< the destination when it is a single range (into_one)
    std::array<std::byte, compare_swap_payload> operands{}; ///< an atomic frame's payload (into_operands)
    /// A CMA request's payload: the initiator's descriptors (into_cma)
    std::array<std::byte, max_cma_descriptors * cma_descriptor_size> cma{};

    /// A new frame whose header was just read: its payload is all to come, with no
    /// destination yet (the target or the initiator chooses one).
    void begin(const frame_header& h) noexcept
    {
        hdr = h;
        left = h.payload_length();
        segs = nullptr;
        nseg = seg_i = 0;
        seg_off = 0;
        fault = false;
        action = rx_action::none;
    }
    /// The payload goes to the list [s, s + n), for action `a`.
    void into(rx_action a, const seg* s, std::uint32_t n) noexcept
    {
        action = a;
        segs = s;
        nseg = n;
    }
    /// The payload goes to the one range `r`.
    void into_one(rx_action a, const seg& r) noexcept
    {
        one = r;
        into(a, &one, 1);
    }
    /// The payload (at most `len` bytes, len <= operands' size) goes to `operands`.
    void into_operands(rx_action a, std::uint64_t len) noexcept
    {
        into_one(a, {nullptr, 0, operands.data(), len});
    }
    /// The payload (a CMA request's descriptors; the decoder bounds their length) goes to `cma`.
    void into_cma(std::uint64_t len) noexcept { into_one(rx_action::cma, {nullptr, 0, cma.data(), len}); }
    /// Whether the payload is kept (into memory) rather than read and dropped.
    bool to_memory() const noexcept
    {
        return action == rx_action::recv || action == rx_action::write || action == rx_action::write_imm ||
               action == rx_action::read_resp || action == rx_action::atomic ||
               action == rx_action::atomic_resp || action == rx_action::cma;
    }
    /// n payload bytes reached the memory (wherever they landed: read straight in, copied
    /// from the stage, or through a staging chunk): the position moves on over the segs.
    /// (`left` is the caller's to count down: bytes read and dropped count there too.)
    void advance(std::uint64_t n) noexcept
    {
        while (n > 0 && seg_i < nseg) {
            const std::uint64_t step = std::min(segs[seg_i].len - seg_off, n);
            seg_off += step;
            n -= step;
            if (seg_off == segs[seg_i].len) {
                ++seg_i;
                seg_off = 0;
            }
        }
    }
};

/// Staged bytes that can be processed without reading: a whole header, or payload.
inline bool staged_work(const rx_stage& st, const rx_frame& f) noexcept
{
    return st.staged() > 0 && (f.action != rx_action::none || st.staged() >= frame_header::wire_size);
}

} // namespace rdmx::tcp
