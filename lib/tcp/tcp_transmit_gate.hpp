// Who may write a connection's stream now: the transmit side's state as a socket-free part
// of the engine (tcp_transmit.cpp's pump drives it; tests/tcp/transmit_gate_test.cpp runs
// it).
#pragma once

#include <cstdint>

namespace rdmx::tcp
{

/// The write side of one connection's stream. Frames go out from the pump, on the
/// application's thread (post, poll) or on the engine's; the gate says when a pump may run:
/// - while the side is `open`; once `shut` (FIN went out, or the socket broke) never again;
/// - one pump at a time (what a pump calls may come back to it);
/// - while the engine's continuation is queued (a wait for writability, or the rest of a
///   spent budget posted to the engine), the engine leaves the sending to it, but an
///   application thread still sends: on a shared CPU the engine runs only when the
///   application yields it, so an application that left large transfers to it would halve
///   its own bandwidth. The continuation then finds less or nothing left to do.
class transmit_gate
{
public:
    enum class state : std::uint8_t {
        open, ///< frames may go out
        shut, ///< nothing more is written: FIN went out, or the write side broke
    };

    /// Whether a pump may start now, on the engine's thread or an application's.
    bool may_pump(bool on_engine) const noexcept
    {
        return state_ == state::open && !in_pump_ && !(continuation_ && on_engine);
    }
    /// A pump starts (once may_pump said so) and ends.
    void enter() noexcept { in_pump_ = true; }
    void leave() noexcept { in_pump_ = false; }

    /// The engine's continuation is to be queued: false when one is queued already (it
    /// will find what is left, so no second one).
    bool queue_continuation() noexcept
    {
        if (continuation_)
            return false;
        continuation_ = true;
        return true;
    }
    /// The queued continuation runs now (and pumps).
    void continuation_ran() noexcept { continuation_ = false; }
    /// A continuation is queued: its wait may hold the descriptor, which must then stay in
    /// the engine's reactor (no standing down meanwhile).
    bool continuation_queued() const noexcept { return continuation_; }

    /// The write side ends, for good.
    void shut() noexcept { state_ = state::shut; }
    bool is_shut() const noexcept { return state_ == state::shut; }
    state current() const noexcept { return state_; }

private:
    state state_ = state::open;
    bool in_pump_ = false;
    bool continuation_ = false;
};

} // namespace rdmx::tcp
