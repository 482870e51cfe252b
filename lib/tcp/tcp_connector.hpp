// The handshake of one TCP connection (docs/wire-format.md section 2) as a state machine of
// its own: the client's connect() completing, its HELLO going out and the listener's ACCEPT
// or REJECT coming back; or, on the listener's side, its reply going out. It never blocks
// and knows nothing of the engine: step() does what the socket allows now and says what it
// needs next. Its driver (connection_engine, tcp_handshake.cpp) waits for the socket as
// asked, redials the next address, bounds the whole by a timer, and starts the data path
// once it is established. The listener reads HELLO itself (tcp_listener.cpp: many
// clients at once, eviction under a flood) and hands the reply to a connector.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "resolve.hpp"
#include "tcp/tcp_ring.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{

class connector
{
public:
    enum class phase : std::uint8_t {
        idle,    ///< no handshake: the data path owns the socket (before begin, once established)
        connect, ///< client: the socket's connect() is in progress
        hello,   ///< client: sending HELLO
        reply,   ///< client: reading ACCEPT or REJECT
        accept,  ///< listener: sending the reply
        failed,  ///< ended without a connection (cause(), why())
    };
    /// What step() needs next from its driver.
    enum class next : std::uint8_t {
        wait_read,      ///< call step() again once the socket is readable
        wait_write,     ///< ... once it is writable
        connect_failed, ///< connect() failed with connect_error(): redial, or fail()
        failed,         ///< phase failed: cause() and why() say what happened
        established,    ///< phase idle; a client's reply() holds the ACCEPT
    };
    /// The addresses a client's name resolved to after the first, tried in turn while
    /// connect() fails (one handshake, one deadline), and what each new socket is given.
    struct dial_plan {
        std::vector<detail::socket_address> addrs;
        std::string congestion; ///< connection_options::tcp.congestion
        /// An auto:// client that dials a listener's UNIX socket (this host) before TCP:
        /// the call and address for the log line that says which it took, and why not
        /// the UNIX socket (the errno of its connect()).
        bool local_first = false;
        std::string what;
        int local_error = 0;
    };

    /// Starts in `p` (connect or accept) with `out` to send (the HELLO, or the reply; at
    /// most handshake::reply_size bytes).
    void begin(phase p, std::span<const std::byte> out) noexcept;
    /// Runs on the socket `fd` (non-blocking) as far as it allows. Only in phases connect,
    /// hello, reply and accept; otherwise returns failed (after fail) or established.
    next step(int fd) noexcept;
    /// Ends it: phase failed with `cause`; `why` (printf format and arguments) says how.
    void fail(std::error_code cause, const char* why, ...) noexcept __attribute__((format(printf, 3, 4)));

    phase current() const noexcept { return phase_; }
    /// The handshake owns the socket, or it failed: the data path leaves the socket alone.
    bool owns_socket() const noexcept { return phase_ != phase::idle; }
    /// The errno of the failed connect() (next::connect_failed).
    int connect_error() const noexcept { return connect_err_; }
    std::error_code cause() const noexcept { return cause_; }
    const char* why() const noexcept { return why_.data(); }
    /// The reply a client read, ACCEPT (established) or REJECT (failed, errc::rejected).
    const std::optional<handshake>& reply() const noexcept { return reply_; }
    dial_plan& dial() noexcept { return dial_; }
    /// Listener: `fd` (the rings' memfd) goes with the reply's first byte (SCM_RIGHTS).
    void pass_fd(unique_fd fd) noexcept { pass_ = std::move(fd); }
    /// Client: the rings an ACCEPT with handshake_flag_ring brought (mapped, checked), once.
    std::unique_ptr<byte_ring_pair> take_rings() noexcept { return std::move(rings_); }

private:
    /// Sends what is left of buf_ without blocking: 0 once all of it went out, EAGAIN when
    /// the socket is full, otherwise the errno that ended it, or -1 for a send that moved
    /// nothing.
    int send_rest(int fd) noexcept;
    next read_reply(int fd) noexcept;
    next failed(std::error_code cause, const char* why) noexcept;

    phase phase_ = phase::idle;
    std::array<std::byte, handshake::reply_size> buf_{};
    std::size_t len_ = 0;  ///< bytes to send in buf_ (while sending)
    std::size_t done_ = 0; ///< bytes sent / received in this phase
    int connect_err_ = 0;
    std::error_code cause_;
    std::array<char, 160> why_{};
    std::optional<handshake> reply_;
    dial_plan dial_;
    unique_fd pass_;             ///< listener: the memfd still to send
    unique_fd came_;             ///< client: a memfd that came with the reply
    bool offered_rings_ = false; ///< client: its HELLO carries handshake_flag_ring
    std::unique_ptr<byte_ring_pair> rings_;
};

} // namespace rdmx::tcp
