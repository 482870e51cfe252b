// One TCP connection's own receive queue, a part of its engine with no socket: the ring of
// posted receives and their SGEs, consumed in order by the peer's sends and writes with
// immediate (tcp_target.cpp). Empty, of depth 0, on a connection whose receives come from
// a shared receive queue (tcp_srq.hpp). All allocation is at construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tcp/tcp_domain.hpp"

namespace rdmx::tcp
{

class recv_queue
{
public:
    struct entry {
        std::uint64_t wr_id = 0;
        std::uint64_t length = 0; ///< the SGEs' total
        std::uint32_t nseg = 0;
    };

    recv_queue(std::uint32_t depth, std::uint32_t max_sge)
        : depth_(depth), max_sge_(max_sge), entries_(depth), segs_(std::size_t{depth} * max_sge)
    {
    }

    bool empty() const noexcept { return head_ == tail_; }
    /// Receives posted and not completed.
    std::uint64_t size() const noexcept { return tail_ - head_; }

    /// The receive the next send consumes, and its SGEs. Only while not empty(), which a
    /// queue of depth 0 always is.
    entry& front() noexcept { return entries_[head_ % depth_]; }
    seg* front_segs() noexcept { return &segs_[(head_ % depth_) * max_sge_]; }
    /// The slot a receive posted now fills, and its SGEs (size() below the depth).
    entry& back() noexcept { return entries_[tail_ % depth_]; }
    seg* back_segs() noexcept { return &segs_[(tail_ % depth_) * max_sge_]; }

    /// The receive filled in at back() is posted.
    void push() noexcept { ++tail_; }
    /// The front completed (or flushed): returns it and moves on (not empty()).
    entry pop() noexcept
    {
        entry e = front();
        ++head_;
        return e;
    }

private:
    std::uint32_t depth_;
    std::uint32_t max_sge_;
    std::vector<entry> entries_;
    std::vector<seg> segs_;
    std::uint64_t head_ = 0;
    std::uint64_t tail_ = 0;
};

} // namespace rdmx::tcp
