// The engine thread's work a connection has outstanding: its socket's read wait, a posted
// continuation of reading, a posted take-back of the socket, the transmit check's timer.
// Each is outstanding at most once (a second would run the same work twice, or hold two
// handler slots of the connection's fixed handler memory); the handler says it ran before
// it does the work, so that the work may start the next one. Four engine flags before;
// socket-free and unit-tested (tests/tcp/engine_work_test.cpp).
#pragma once

#include <cstdint>

namespace rdmx::tcp
{

class engine_work
{
public:
    enum class kind : std::uint8_t {
        read_wait = 1,   ///< the socket's readiness wait (arm_read), woken by data or a doorbell
        rx_continue = 2, ///< a read run posted (continue_rx): staged frames, a ring, an end
        reclaim = 4,     ///< a take-back of the socket from a poller posted (post_reclaim)
        tx_check = 8,    ///< the transmit check's timer (arm_tx_check)
    };

    /// Starts `k` unless it is outstanding: true when the caller must now post or arm it.
    bool start(kind k) noexcept
    {
        const auto bit = static_cast<std::uint8_t>(k);
        if (out_ & bit)
            return false;
        out_ = static_cast<std::uint8_t>(out_ | bit);
        return true;
    }
    /// Its handler runs (first thing, before the work, which may start it again).
    void ran(kind k) noexcept { out_ = static_cast<std::uint8_t>(out_ & ~static_cast<std::uint8_t>(k)); }
    bool outstanding(kind k) const noexcept { return (out_ & static_cast<std::uint8_t>(k)) != 0; }
    /// Whether the engine thread will read this socket soon: its wait is armed or a read
    /// run is on its way.
    bool reading_soon() const noexcept
    {
        return outstanding(kind::read_wait) || outstanding(kind::rx_continue);
    }

private:
    std::uint8_t out_ = 0;
};

} // namespace rdmx::tcp
