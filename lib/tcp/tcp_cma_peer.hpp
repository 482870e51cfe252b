// The cross-memory-attach state of one connection (shm://, tcp_cma.cpp): whether this side
// sends its large payloads as CMA requests, and the peer's process, in which it serves the
// peer's. A part of the connection engine, used under its lock; no socket of its own (the
// caller names the connection's).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "tcp/tcp_socket.hpp"

namespace rdmx::tcp
{

/// Whether the process behind `pidfd` has exited (or the pidfd cannot say).
bool process_exited(int pidfd) noexcept;

class cma_peer
{
public:
    /// Whether this side sends CMA requests.
    enum class sending : std::uint8_t {
        no,      ///< not a local connection (yet), or RDMX_SHM_CMA=off
        yes,     ///< a local one: large payloads go as descriptors (choose_cma)
        refused, ///< the peer refused one (NAK CMA_REFUSED): in the frames, for good
    };
    /// The peer's process: looked up once, on the first pid().
    enum class lookup : std::uint8_t { not_yet, found, none };

    bool sends() const noexcept { return send_ == sending::yes; }
    sending send_state() const noexcept { return send_; }
    /// The connection settled on a local socket: send CMA requests if `allowed` (never
    /// again once the peer refused one).
    void settle(bool allowed) noexcept
    {
        if (send_ == sending::no && allowed)
            send_ = sending::yes;
    }
    /// The peer refused a CMA request: nothing of this connection goes by CMA any more.
    void refused() noexcept { send_ = sending::refused; }
    lookup looked_up() const noexcept { return lookup_; }
    /// The peer process's pidfd once pid() found it (-1 before, or without one).
    int pidfd() const noexcept { return pidfd_ ? pidfd_->get() : -1; }

    /// The peer's process for process_vm_*v: its pid while the pidfd says it has not
    /// exited (so that the pid names it, not a later process); 0 otherwise. Looked up on
    /// the first call (SO_PEERCRED of the UNIX socket `fd`; `open(pid)`: a pidfd for it,
    /// null where none can be had), which must come while the peer is surely connected
    /// (and so alive): the connection's set-up.
    template <class Open> pid_t pid(int fd, Open&& open) noexcept
    {
        if (lookup_ == lookup::not_yet) {
            lookup_ = lookup::none; // 0 where the peer is in a PID namespace ours does not see
            ucred cr{};
            socklen_t len = sizeof cr;
            if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.pid > 0) {
                try {
                    pidfd_ = open(cr.pid);
                } catch (...) { // no memory for it: no CMA served, as without a pidfd
                }
                if (pidfd_) {
                    pid_ = cr.pid;
                    lookup_ = lookup::found;
                }
            }
        }
        if (lookup_ != lookup::found)
            return 0;
        // The pid is that process's until it has exited and been reaped; a pidfd turns
        // readable when it exits. So while it is not readable, the pid cannot name another
        // process (the window left: the peer exits, is reaped and its pid wraps around
        // between this poll and the system call, microseconds).
        return process_exited(pidfd_->get()) ? 0 : pid_;
    }

private:
    sending send_ = sending::no;
    lookup lookup_ = lookup::not_yet;
    pid_t pid_ = 0;
    std::shared_ptr<const unique_fd> pidfd_; ///< tcp_domain::peer_process
};

} // namespace rdmx::tcp
