// The transmit side's frames as socket-free parts of the engine: the batch one sendmsg
// sends (its iovecs, the frames in it, what it pinned, the chunks staged memory goes
// through) and the frame partly on the wire, which must finish before another starts.
// tcp_transmit.cpp's pump fills and sends them; tests/tcp/tx_frame_test.cpp runs them
// without a socket.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_staging.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{

enum class frame_kind : std::uint8_t { none, request, response };

/// One frame in a batch: which (a send queue or response ring position) and how much of
/// it was sent before the batch and is in it.
struct tx_item {
    frame_kind kind = frame_kind::none;
    std::uint64_t pos = 0;   ///< SQ position (= sequence number) or response ring position
    std::uint64_t skip = 0;  ///< bytes of the frame sent before this batch
    std::uint64_t added = 0; ///< bytes of the frame in this batch
    std::uint64_t total = 0; ///< bytes of the whole frame, header included
    bool was_current = false;
};

/// A chunk that staged memory is sent from (tcp_staging.hpp). A pump() holds two, so
/// that the copy for its next batch runs while this batch's sendmsg does.
struct tx_chunk {
    std::byte* p = nullptr;  ///< from the domain's pool, for the pump() call
    std::uint64_t fill = 0;  ///< bytes of it holding copies
    std::uint64_t stamp = 0; ///< when its range was set: the older chunk is reused first
    /// The range a batch finds in it: [src, src + len) of region `st` (generation
    /// `tag`), at p + off. Its copy may still be in flight (`copy`, with `copy_pin`
    /// pinned until it finished).
    region_state* st = nullptr;
    std::uint64_t tag = 0;
    const std::byte* src = nullptr;
    std::uint64_t len = 0;
    std::uint64_t off = 0;
    copy_batch copy;
    region_state* copy_pin = nullptr;
    bool in_batch = false; ///< the batch being built sends from it
};

/// What one sendmsg sends: fixed sizes, so that nothing allocates; a frame that does not
/// fit continues in the next batch.
struct tx_batch {
    // 128 iovecs hold a header plus the largest SGE list (32) several times over.
    static constexpr int max_iov = 128;
    static constexpr int max_frames = 16;
    static_assert(max_iov >= 2 * (1 + 32), "a batch must hold at least one full frame");

    iovec iov[max_iov];
    int niov = 0;
    tx_item items[max_frames];
    int nitems = 0;
    std::byte headers[max_frames][frame_header::wire_size];
    region_state* pinned[max_iov];
    int npinned = 0;
    bool closed = false;  ///< a frame could not be added whole: nothing may follow it
    bool revoked = false; ///< the last frame's memory was deregistered (pump withdraws it)
    /// ... or could not be staged (no chunk, or the driver's copy failed): a frame on
    /// the wire then cannot be finished (revoked_frame), none waits for a copy.
    bool stage_failed = false;
    tx_chunk chunks[2];
    std::uint64_t stamps = 0;
    /// Where the batch's last staged piece was cut short by the end of a chunk: the
    /// next batch starts there, and its copy can start before this batch is sent.
    region_state* cut_st = nullptr;
    std::uint64_t cut_tag = 0;
    const std::byte* cut_src = nullptr;
    std::uint64_t cut_len = 0; ///< bytes of that piece's segment after the cut

    /// A new batch: no frames, nothing pinned, open. The chunks keep what they hold (a
    /// copy of bytes the previous batch did not get out, or one started ahead of them).
    void reset() noexcept
    {
        niov = nitems = npinned = 0;
        closed = revoked = stage_failed = false;
        cut_st = nullptr;
        for (tx_chunk& c : chunks)
            c.in_batch = false;
    }
    /// Where the batch stands before a frame is added, to take the frame out again.
    struct mark {
        int niov, npinned, nitems;
    };
    mark checkpoint() const noexcept { return {niov, npinned, nitems}; }
    /// Takes out what was added since `m` (a frame whose memory was deregistered while it
    /// was added): unpins its memory and opens the batch again. Chunks it filled keep
    /// their copies (unused, harmless).
    void rollback(const mark& m) noexcept
    {
        for (int i = m.npinned; i < npinned; ++i)
            unpin(pinned[i]);
        niov = m.niov;
        npinned = m.npinned;
        nitems = m.nitems;
        closed = revoked = false;
    }
    /// After the sendmsg: the memory it read is the owner's again.
    void unpin_all() noexcept
    {
        for (int i = 0; i < npinned; ++i)
            unpin(pinned[i]);
        npinned = 0;
    }
};

/// The frame partly on the wire: once its first byte went out, nothing else may go before
/// its last. If its memory is deregistered meanwhile, the rest is copied (keep_copy) and
/// it finishes from that copy.
class wire_frame
{
public:
    /// Whether a frame is on the wire, and which.
    bool busy() const noexcept { return cur_.kind != frame_kind::none; }
    const tx_item& item() const noexcept { return cur_; }
    /// `it` went out up to `done` bytes (less than its total): it stays on the wire.
    void sent_part(const tx_item& it, std::uint64_t done) noexcept
    {
        cur_ = it;
        cur_.skip = done;
        cur_.was_current = true;
    }
    /// Its last byte went out, or it was abandoned: none is on the wire, and its copy goes.
    void finished() noexcept
    {
        cur_ = {};
        copy_.reset();
    }
    /// The rest, from frame offset `from` on, copied (copy_frame_on_wire).
    void keep_copy(std::unique_ptr<std::byte[]> copy, std::uint64_t from) noexcept
    {
        copy_ = std::move(copy);
        copy_from_ = from;
    }
    /// The copy of the rest (null while the frame reads the regions), and its frame offset.
    std::byte* copy() const noexcept { return copy_.get(); }
    std::uint64_t copy_from() const noexcept { return copy_from_; }

private:
    tx_item cur_;
    std::unique_ptr<std::byte[]> copy_;
    std::uint64_t copy_from_ = 0;
};

} // namespace rdmx::tcp
