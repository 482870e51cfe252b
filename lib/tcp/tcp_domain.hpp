// The TCP domain: one progress engine (an io_context on one thread) and the table of
// registered regions and bound memory windows that peers reach by key. It is shared
// (enable_shared_from_this): every region, listener, request and connection made from it holds it, so that it
// and its engine thread go with the last of them, whatever the order (rdmx::domain).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <rdmx/connection.hpp>

#include "cq_reservation.hpp"
#include "tcp/tcp_poll_ownership.hpp"
#include "tcp/tcp_progress.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_staging.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{

namespace asio = boost::asio;

/// What the engine checks around every socket call that touches registered memory, so that
/// deregistration revokes access at once. States live in a pool owned by the domain and
/// are reused, never freed before it: a work request that outlived its region still points
/// to valid state, and the generation in `tag` tells it the region is gone.
struct region_state {
    /// generation << 1 | live. A pinner compares the whole word with the tag it was given.
    std::atomic<std::uint64_t> tag{0};
    /// Socket calls in progress on this memory (and copies of it that the deregistration
    /// of another region makes); deregistration waits for zero.
    std::atomic<std::uint32_t> users{0};
    // Written under the domain's table mutex before the key is published.
    std::byte* base = nullptr;
    std::uint64_t size = 0;
    rdmx::access rights = access::none;
    std::uint64_t key = 0;
    /// Reached through host chunks (device memory; tcp_staging.hpp), not by socket calls.
    tcp::staging stage = staging::none;
    int device = -1; ///< the CUDA device of staging::cuda memory
};

struct window_state;

/// What a key names: a region, or a memory window (over a region).
struct key_entry {
    region_state* region = nullptr; ///< set for a region's key
    window_state* window = nullptr; ///< set for a window's key
};
using key_table = std::unordered_map<std::uint64_t, key_entry>;

/// A memory window as the domain sees it (docs/memory-windows.md). In a pool owned by the
/// domain, like region_state; every field is guarded by the domain's table mutex.
struct window_state {
    region_state* region = nullptr; ///< the region bound over
    std::uint64_t region_tag = 0;   ///< its live tag at the bind: a later deregistration revokes
    std::uint64_t base = 0;         ///< absolute address of the window's first byte
    std::uint64_t length = 0;
    rdmx::access rights = access::none;
    std::uint64_t key = 0;
    /// The connection bound through (its engine's id, never reused): only its peer may use the key.
    std::uint64_t via = 0;
    bool bound = false; ///< the key is in the table (else `node` holds its entry)
    /// This window's entry of the key table while it is not in the table: made when the
    /// window is allocated, so that binding and invalidating (on the data path) only move
    /// it in and out of the table, and never allocate.
    key_table::node_type node;

    /// Bound, over a region still registered: a window whose region was destroyed is free.
    bool live() const noexcept { return bound && region->tag.load() == region_tag; }
};

/// Makes the memory behind `st` safe to touch until unpin(); false if the region was
/// deregistered since `tag` was taken. seq_cst on both sides: either deregister() sees
/// our count or we see its cleared tag.
inline bool pin(region_state* st, std::uint64_t tag) noexcept
{
    st->users.fetch_add(1);
    if (st->tag.load() == tag)
        return true;
    st->users.fetch_sub(1);
    return false;
}
inline void unpin(region_state* st) noexcept
{
    st->users.fetch_sub(1, std::memory_order_release);
}

/// A range of registered memory as the engine sees it.
struct seg {
    region_state* st = nullptr; ///< nullptr: memory owned by the connection (inline copy)
    std::uint64_t tag = 0;
    std::byte* ptr = nullptr;
    std::uint64_t len = 0;
};

class connection_engine;
class tcp_connection;

class tcp_domain final : public domain, public std::enable_shared_from_this<tcp_domain>
{
public:
    /// `b`: backend::tcp, or backend::shm for the same engine over UNIX sockets (shm://).
    /// `local_peers` (a TCP domain that auto:// chose): its auto:// listeners open a UNIX
    /// socket beside their TCP one, and its auto:// connections to a listener on this host
    /// take it (docs/shm.md, "auto://").
    explicit tcp_domain(rdmx::backend b = backend::tcp, bool local_peers = false);
    ~tcp_domain() override;

    rdmx::backend backend() const noexcept override { return backend_; }
    /// Whether auto:// connections of this TCP domain go over UNIX sockets to peers on this host.
    bool local_peers() const noexcept { return local_peers_; }
    const device_limits& limits() const noexcept override { return limits_; }
    std::unique_ptr<memory_window> allocate_window() override;
    std::unique_ptr<memory_region> register_placed(void* addr, std::size_t length, rdmx::access rights,
                                                   rdmx::memory_type type, int device) override;
    std::unique_ptr<memory_region> register_allocated(detail::shared_memory& mem,
                                                      rdmx::access rights) override;
    std::unique_ptr<listener> listen(std::string_view address, const listen_options& opts) override;
    std::unique_ptr<connection> connect(std::string_view address, const connection_options& opts,
                                        std::span<const std::byte> private_data,
                                        std::span<const recv_request> initial_recvs) override;
    std::unique_ptr<connection> start_connect(std::string_view address, const connection_options& opts,
                                              std::span<const std::byte> private_data,
                                              std::span<const recv_request> initial_recvs) override;
    std::shared_ptr<completion_queue> create_completion_queue(const completion_queue_options& opts) override;
    std::shared_ptr<shared_receive_queue>
    create_shared_receive_queue(const shared_receive_queue_options& opts) override;

    // --- for the engine and the regions ---
    asio::io_context& io() noexcept { return io_; }
    /// The owner identity given to regions and checked by validate.hpp.
    const void* owner() const noexcept { return this; }
    /// Resolves a peer's access of [addr, addr + len) under `key` needing `right`, arriving
    /// on the connection whose engine id is `via`. A region's key serves every connection; a window's only
    /// the one it was bound through, within its range and rights, while its region lives.
    /// On success `out` names the memory (not pinned: the engine pins per socket call).
    bool find_remote(std::uint64_t key, std::uint64_t addr, std::uint64_t len, rdmx::access right, seg& out,
                     std::uint64_t via) noexcept;
    /// opcode::bind_window, posted through the connection `via` (validate.hpp checked it; a
    /// window still bound is invalid_argument: invalidate it first): a fresh
    /// random key over the range, the old one (if bound) gone from the table; sets
    /// window.remote(). No allocation; fails only if getrandom does.
    std::error_code bind_window(memory_window& window, const memory_region& region, std::uint64_t offset,
                                std::uint64_t length, rdmx::access rights, std::uint64_t via) noexcept;
    /// opcode::invalidate_window: the window's key leaves the table; invalid_argument if it
    /// was not bound (or its region is gone, which freed it).
    std::error_code invalidate_window(memory_window& window) noexcept;
    /// Whether `window` is free (for a bind) or bound (for an invalidation) now.
    bool window_state_allows(const memory_window& window, bool bind) noexcept;
    /// A peer's send_with_invalidate arriving on `via`: revokes the window with `key` if it
    /// is bound through `via`; false if no such window (the caller fails the connection).
    bool invalidate_remote(std::uint64_t key, std::uint64_t via) noexcept;
    /// The connection `via` is destroyed: the windows bound through it are free (their
    /// keys leave the table), as on verbs (docs/memory-windows.md, "Revocation").
    void release_windows_of(std::uint64_t via) noexcept;
    /// A window object is gone: revoked, and its state back to the pool.
    void free_window(window_state* w) noexcept;
    /// Revokes the region, copies the rest of every frame on the wire that still needs its
    /// bytes (connection_engine::copy_frame_on_wire), and returns once no socket call
    /// touches it. Bounded: it never waits for a peer.
    void deregister(region_state* st) noexcept;
    /// Makes a connection's frame on the wire reachable by deregister(). Once per engine,
    /// at set-up (it may allocate).
    void track(std::weak_ptr<connection_engine> engine);
    /// A connection object is gone and its engine lingers, at most `bound`, to send what it
    /// owes (docs/wire-format.md section 6); linger_end() when it closed the socket. The
    /// domain's destructor waits for the lingering engines, at most the longest bound.
    void linger_begin(std::chrono::steady_clock::duration bound) noexcept;
    void linger_end() noexcept;
    /// How many engines linger now (tests).
    std::size_t lingering() noexcept
    {
        std::lock_guard lk(linger_mu_);
        return lingering_;
    }
    /// The application's polls of this domain's connections (their own completions): an
    /// engine's read wake that finds it polling another connection counts towards standing
    /// down (tcp_poll_ownership.hpp).
    poll_activity& polls() noexcept { return polls_; }
    /// The progress of its connections on shared queues, which a poll of any of its
    /// completion queues runs (tcp_progress.hpp).
    domain_progress& progress() noexcept { return *progress_; }
    /// The host chunks that socket calls on staged memory go through (tcp_staging.hpp).
    bounce_pool& bounce() noexcept { return bounce_; }
    /// Sink for payload bytes that must be read and dropped. Engine thread only.
    std::span<std::byte> discard_buffer() noexcept { return discard_; }
    /// shm://: a pidfd of process `pid` (a connected peer's, SO_PEERCRED), shared by this
    /// domain's connections to that process, so that a server holds one per peer process,
    /// not per connection; null if none could be had (tcp_cma.cpp). A cached one whose
    /// process has exited is replaced: the pid now names another process.
    std::shared_ptr<const unique_fd> peer_process(pid_t pid);

private:
    /// register_placed and register_allocated: `shared` (null for memory not allocated by
    /// this domain) gets a key that names its memfd, and publishes it (tcp_shared_map.hpp).
    std::unique_ptr<memory_region> register_region(void* addr, std::size_t length, rdmx::access rights,
                                                   rdmx::memory_type type, int device,
                                                   detail::shared_memory* shared);
    /// connect() and start_connect()'s common start, all before the peer hears of us: the
    /// address and options checked, room reserved on shared completion queues, the HELLO
    /// encoded into `buf`. `verb` names the call in errors.
    struct client_start {
        uri address;
        std::string what;
        connection_limits lim;
        detail::cq_reservation shared;
        std::span<const std::byte> hello;
    };
    /// connect() and start_connect(): the connection in `connecting`, its handshake
    /// started on the engine; `started`: the established event goes to opts.events.
    std::unique_ptr<tcp_connection> dial(const char* verb, std::string_view address,
                                         const connection_options& opts,
                                         std::span<const std::byte> private_data,
                                         std::span<const recv_request> initial_recvs, bool started);
    client_start begin_client(const char* verb, std::string_view address, const connection_options& opts,
                              std::span<const std::byte> private_data,
                              std::span<std::byte, handshake::reply_size> buf);

    const rdmx::backend backend_; ///< tcp, or shm (UNIX sockets)
    const bool local_peers_;      ///< local_peers()
    device_limits limits_;
    std::mutex regions_mu_;
    std::deque<region_state> region_pool_; ///< deque: elements never move
    std::vector<region_state*> free_regions_;
    std::deque<window_state> window_pool_; ///< deque: elements never move
    std::vector<window_state*> free_windows_;
    key_table keys_;
    /// Regions plus windows: the most entries keys_ can hold, for which it keeps buckets
    /// (so that a bind's insertion never rehashes).
    std::size_t key_slots_ = 0;
    std::vector<std::byte> discard_;
    /// RDMX_TCP_FORCE_STAGING=1 (or 2: copies deferred to their wait) when the domain was
    /// made: host memory is staged as device memory is, so that tests without a GPU run
    /// every path of the staging.
    bool force_staging_ = false;
    bounce_pool bounce_;
    poll_activity polls_;
    /// Shared with every completion queue made here (which may outlive the domain).
    const std::shared_ptr<domain_progress> progress_ = std::make_shared<domain_progress>();
    // Every engine made here (expired ones pruned on track()), for deregister(). Lock
    // order: engines_mu_, an engine's mutex, regions_mu_ (find_remote runs under the
    // engine's); deregister() never holds regions_mu_ while it takes the others.
    std::mutex engines_mu_;
    std::vector<std::weak_ptr<connection_engine>> engines_;
    std::mutex processes_mu_; ///< a leaf (peer_process)
    std::unordered_map<pid_t, std::weak_ptr<const unique_fd>> processes_;
    std::mutex linger_mu_; ///< a leaf: taken under an engine's mutex, nothing under it
    std::condition_variable linger_cv_;
    std::size_t lingering_ = 0;
    std::chrono::steady_clock::duration linger_bound_{};
    // The engine last: it is joined first, then the io_context destroys what handlers
    // remain (releasing connection state), and only then the region pool goes.
    asio::io_context io_;
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::thread engine_;
};

/// The engine's view of [offset, offset + length) of a region of this domain (validated by
/// validate.hpp before, so the region is known to be a TCP one).
seg region_seg(const memory_region& mr, std::size_t offset, std::size_t length) noexcept;

/// Listening side, in tcp_listener.cpp.
std::unique_ptr<listener> make_listener(std::shared_ptr<tcp_domain> dom, std::string_view address,
                                        int backlog);
/// Times a listener of this process paused accepting because accept4 found no descriptor
/// or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM); for tests.
std::uint64_t listener_accept_pauses() noexcept;

/// The handshake message of `type` with this side's read depth and `private_data`, encoded
/// into `out`; returns the bytes to send. Throws errc::invalid_argument naming `verb` when
/// the private data is over the limit of the message (detail::check_private_data).
std::span<const std::byte> encode_handshake(handshake_type type, std::uint32_t max_rd_atomic,
                                            std::span<const std::byte> private_data,
                                            std::span<std::byte, handshake::reply_size> out,
                                            std::string_view verb, bool ring = false);

} // namespace rdmx::tcp
