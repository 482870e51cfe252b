// Tag matching (libfabric's semantics): a message with tag t matches a receive (tag r,
// ignore i) when (t & ~i) == (r & ~i) and the receive is for its source or any peer.
// Receives and unexpected messages live in fixed pools; these lists thread them in
// posting / arrival order by index, so matching never allocates.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace rdmx::ep
{

inline constexpr std::uint32_t nil = std::numeric_limits<std::uint32_t>::max();

constexpr bool tag_matches(std::uint64_t msg_tag, std::uint64_t recv_tag, std::uint64_t ignore) noexcept
{
    return (msg_tag & ~ignore) == (recv_tag & ~ignore);
}

/// A doubly linked list of pool indices in insertion order. The links live here, one pair
/// per pool slot, sized once; a slot is on at most one list of a given index_list.
class index_list
{
public:
    explicit index_list(std::uint32_t slots = 0) : prev_(slots, nil), next_(slots, nil), on_(slots, 0) {}

    bool empty() const noexcept { return head_ == nil; }
    std::uint32_t size() const noexcept { return size_; }
    std::uint32_t front() const noexcept { return head_; }
    std::uint32_t next(std::uint32_t i) const noexcept { return next_[i]; }
    bool contains(std::uint32_t i) const noexcept { return on_[i] != 0; }

    void push_back(std::uint32_t i) noexcept
    {
        prev_[i] = tail_;
        next_[i] = nil;
        if (tail_ != nil)
            next_[tail_] = i;
        else
            head_ = i;
        tail_ = i;
        on_[i] = 1;
        ++size_;
    }
    void erase(std::uint32_t i) noexcept
    {
        if (!on_[i])
            return;
        if (prev_[i] != nil)
            next_[prev_[i]] = next_[i];
        else
            head_ = next_[i];
        if (next_[i] != nil)
            prev_[next_[i]] = prev_[i];
        else
            tail_ = prev_[i];
        on_[i] = 0;
        --size_;
    }
    /// The first index for which pred(i) holds, in order; nil if none.
    template <class Pred> std::uint32_t find(Pred pred) const noexcept
    {
        for (std::uint32_t i = head_; i != nil; i = next_[i])
            if (pred(i))
                return i;
        return nil;
    }

private:
    std::vector<std::uint32_t> prev_, next_;
    std::vector<std::uint8_t> on_;
    std::uint32_t head_ = nil, tail_ = nil, size_ = 0;
};

/// A stack of free pool indices, filled once.
class free_list
{
public:
    explicit free_list(std::uint32_t slots = 0)
    {
        free_.reserve(slots);
        for (std::uint32_t i = slots; i-- > 0;)
            free_.push_back(i);
    }
    bool empty() const noexcept { return free_.empty(); }
    std::uint32_t available() const noexcept { return static_cast<std::uint32_t>(free_.size()); }
    std::uint32_t take() noexcept
    {
        std::uint32_t i = free_.back();
        free_.pop_back();
        return i;
    }
    /// Never grows past the reserved size: each index is given back once.
    void give(std::uint32_t i) noexcept { free_.push_back(i); }

private:
    std::vector<std::uint32_t> free_;
};

} // namespace rdmx::ep
