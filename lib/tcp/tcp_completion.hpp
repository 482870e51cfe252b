// The completion ring of one TCP connection and its notification arming: fixed size,
// allocated at set-up, used under the engine's mutex by whichever thread completes or polls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <rdmx/connection.hpp>

namespace rdmx::tcp
{

/// Which of a connection's queues a completion belongs to.
enum class cq_side : std::uint8_t { send, recv };

/// A bounded FIFO of completions. Full is the caller's error (a CQ overrun, fatal as on verbs).
class completion_ring
{
public:
    explicit completion_ring(std::size_t capacity) : slots_(capacity), tags_(capacity) {}

    std::size_t size() const noexcept { return count_; }
    std::size_t capacity() const noexcept { return slots_.size(); }
    bool empty() const noexcept { return count_ == 0; }
    bool full() const noexcept { return count_ == slots_.size(); }

    /// False, and nothing stored, when the ring is full. `tagged`: counted by pop() and
    /// drop_tagged() (the engine tags the receives of a shared receive queue).
    bool push(const completion& c, bool tagged = false) noexcept
    {
        if (full())
            return false;
        std::size_t i = (head_ + count_) % slots_.size();
        slots_[i] = c;
        tags_[i] = tagged;
        tagged_ += tagged;
        ++count_;
        return true;
    }
    /// Moves the oldest completions into `out`, as many as fit; returns how many, and in
    /// `*tagged` (if given) how many of them were tagged.
    std::size_t pop(std::span<completion> out, std::size_t* tagged = nullptr) noexcept
    {
        std::size_t n = out.size() < count_ ? out.size() : count_;
        std::size_t t = 0;
        for (std::size_t i = 0; i < n; ++i) {
            out[i] = slots_[head_];
            t += tags_[head_];
            head_ = (head_ + 1) % slots_.size();
        }
        count_ -= n;
        tagged_ -= t;
        if (tagged)
            *tagged = t;
        return n;
    }
    /// The tagged completions still queued, which lose their tags (they will not be polled).
    std::size_t drop_tagged() noexcept
    {
        std::size_t t = tagged_;
        for (std::size_t i = 0; i < count_; ++i)
            tags_[(head_ + i) % slots_.size()] = false;
        tagged_ = 0;
        return t;
    }

private:
    std::vector<completion> slots_;
    std::vector<std::uint8_t> tags_;
    std::size_t head_ = 0, count_ = 0, tagged_ = 0;
};

/// request_notify()'s arming: one wake for the next completion (or, solicited only, the next
/// error or solicited receive), as ibv_req_notify_cq.
class notify_arm
{
public:
    enum class mode : std::uint8_t { none, any, solicited };

    void arm(bool solicited_only) noexcept { mode_ = solicited_only ? mode::solicited : mode::any; }
    bool armed() const noexcept { return mode_ != mode::none; }
    /// Whether `c` (a receive the peer marked solicited: `solicited`) wakes the waiter;
    /// a wake disarms.
    bool fire(const completion& c, bool solicited) noexcept
    {
        bool is_recv = c.opcode == opcode::recv || c.opcode == opcode::recv_with_imm;
        if (mode_ == mode::any || (mode_ == mode::solicited && (c.status || (is_recv && solicited)))) {
            mode_ = mode::none;
            return true;
        }
        return false;
    }

    /// Fires the arming for something other than a completion (work that only a poll
    /// does); false if nothing was armed.
    bool fire_any() noexcept
    {
        if (mode_ == mode::none)
            return false;
        mode_ = mode::none;
        return true;
    }

private:
    mode mode_ = mode::none;
};

} // namespace rdmx::tcp
