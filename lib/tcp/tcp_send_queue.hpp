// One TCP connection's send queue, a part of its engine with no socket: the ring of
// requests (each with its SGEs and its inline copy), the binds and invalidations posted
// behind them, and the positions that say where each request is. The engine (tcp_post.cpp,
// tcp_transmit.cpp, tcp_reliability.cpp, tcp_completion.cpp) moves them; the ring keeps
// their order and counts (tests/tcp/send_queue_test.cpp). All allocation is at construction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <rdmx/connection.hpp>

#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{

class send_queue
{
public:
    struct entry {
        std::uint64_t wr_id = 0;
        std::uint64_t remote_addr = 0;
        std::uint64_t remote_key = 0;
        std::uint32_t length = 0;
        std::uint32_t imm = 0;
        rdmx::opcode op = opcode::send;
        bool signaled = false;
        bool fenced = false;
        bool solicited = false;
        std::uint32_t nseg = 0;
        /// Atomics: the operands as the request frame carries them (compare_add, then
        /// swap; little endian), and the payload piece naming them. Its SGE is where the
        /// old value lands.
        std::array<std::byte, compare_swap_payload> operands{};
        seg operand_seg;
        /// shm://: the target moves this request's data itself (a CMA request, whose
        /// payload `cma_seg` is the SGE list as descriptors in cma_buf()). Decided when its
        /// frame is first built, and again when it is sent again (go_back).
        bool via_cma = false;
        seg cma_seg;
    };
    /// A bind or invalidation posted behind requests still outstanding: it completes once
    /// the head reaches `after`, so that the send queue's completions keep the order of
    /// posting, as on verbs. It takes a slot of the queue's depth.
    struct local_entry {
        std::uint64_t wr_id = 0;
        std::uint64_t after = 0;
        rdmx::opcode op = opcode::bind_window;
        bool signaled = false;
    };

    /// `cma`: room for CMA descriptors in every slot (shm://).
    send_queue(std::uint32_t depth, std::uint32_t max_sge, std::uint32_t max_inline, bool cma = false)
        : depth_(depth), max_sge_(max_sge), max_inline_(max_inline), entries_(depth),
          segs_(std::size_t{depth} * max_sge), inline_(std::size_t{depth} * max_inline), locals_(depth),
          cma_(cma ? std::size_t{depth} * max_sge * cma_descriptor_size : 0)
    {
    }

    /// Whether a request of `op` waits for a response with data (READ_RESP, ATOMIC_RESP)
    /// and counts against max_rd_atomic and fences, as verbs counts reads and atomics
    /// alike (IBV_SEND_FENCE, max_rd_atomic).
    static bool reads_or_atomic(rdmx::opcode op) noexcept
    {
        return op == opcode::read || op == opcode::fetch_add || op == opcode::compare_swap;
    }

    // Positions are also the requests' sequence numbers: [head, next) started and awaiting
    // a response, [next, tail) not started.
    std::uint64_t head() const noexcept { return head_; }
    std::uint64_t next() const noexcept { return next_; }
    std::uint64_t tail() const noexcept { return tail_; }
    /// Nothing posted is outstanding (locals complete as the head moves).
    bool empty() const noexcept { return head_ == tail_; }
    /// Started requests await a response.
    bool in_flight() const noexcept { return head_ < next_; }
    /// Requests not started yet.
    bool unstarted() const noexcept { return next_ < tail_; }
    /// Slots taken: requests and the locals behind them.
    std::uint64_t used() const noexcept { return tail_ - head_ + (ltail_ - lhead_); }
    /// Reads and atomics started and not answered (reads_or_atomic).
    std::uint32_t reads_in_flight() const noexcept { return reads_; }

    entry& at(std::uint64_t pos) noexcept { return entries_[pos % depth_]; }
    seg* segs(std::uint64_t pos) noexcept { return &segs_[(pos % depth_) * max_sge_]; }
    /// The slot's own buffer for inline data (max_inline bytes).
    std::byte* inline_buf(std::uint64_t pos) noexcept
    {
        return inline_.data() + (pos % depth_) * max_inline_;
    }

    /// The slot's room for its SGE list as CMA descriptors (max_sge of them); null
    /// without it.
    std::byte* cma_buf(std::uint64_t pos) noexcept
    {
        return cma_.empty() ? nullptr : cma_.data() + (pos % depth_) * max_sge_ * cma_descriptor_size;
    }

    /// The request filled in at(tail()) is posted.
    void push() noexcept { ++tail_; }
    /// A local operation posted now: false if nothing is outstanding (its turn is now, the
    /// caller completes it), else queued behind the requests.
    bool push_local(std::uint64_t wr_id, rdmx::opcode op, bool signaled) noexcept
    {
        if (empty())
            return false;
        locals_[ltail_++ % depth_] = {.wr_id = wr_id, .after = tail_, .op = op, .signaled = signaled};
        return true;
    }
    /// The request at next() goes on the wire.
    void start() noexcept
    {
        if (reads_or_atomic(at(next_).op))
            ++reads_;
        ++next_;
    }
    /// The head is done (answered, or failed): returns it and moves on.
    entry pop() noexcept
    {
        entry e = at(head_);
        ++head_;
        if (reads_or_atomic(e.op) && reads_ > 0)
            --reads_;
        return e;
    }
    /// The next local whose turn came (the head passed its place), into `out`; false if none.
    bool pop_local_due(local_entry& out) noexcept
    {
        if (lhead_ == ltail_ || locals_[lhead_ % depth_].after > head_)
            return false;
        out = locals_[lhead_++ % depth_];
        return true;
    }
    /// Go back to `seq` (an RNR NAK of it): everything from it on was dropped by the peer
    /// and is sent again; nothing before it is outstanding (responses come in order).
    void go_back(std::uint64_t seq) noexcept
    {
        next_ = seq;
        reads_ = 0;
    }
    /// Everything left completes as flushed: nothing is started any more.
    void stop_sending() noexcept
    {
        next_ = tail_;
        reads_ = 0;
    }

private:
    std::uint32_t depth_;
    std::uint32_t max_sge_;
    std::uint32_t max_inline_;
    std::vector<entry> entries_;
    std::vector<seg> segs_;
    std::vector<std::byte> inline_;
    std::vector<local_entry> locals_; ///< ring of depth_: [lhead_, ltail_)
    std::vector<std::byte> cma_;
    std::uint64_t head_ = 0;
    std::uint64_t next_ = 0;
    std::uint64_t tail_ = 0;
    std::uint64_t lhead_ = 0;
    std::uint64_t ltail_ = 0;
    std::uint32_t reads_ = 0;
};

} // namespace rdmx::tcp
