// Endpoints without connections: one endpoint reaches any number of peers through an
// address vector, connects to a peer the first time it is used, and moves tagged messages
// (eager for small ones, rendezvous by RDMA read for large ones) and one-sided operations
// by peer handle. The model is libfabric's reliable-datagram endpoint over connections
// (ofi_rxm), as DAOS uses it through Mercury. Built on rdmx's connections, a shared
// completion queue and a shared receive queue (rdmx/queues.hpp), so the same on both
// backends and every provider. The protocol is in docs/endpoints.md.
//
// Threading: an endpoint is thread-compatible, as a connection is: one thread calls it
// (or the application serialises its calls). All progress happens in poll() / wait():
// accepting peers, connecting, retrying, matching, the rendezvous reads and
// acknowledgements; there is no second object to poll and no hidden thread of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include <rdmx/connection.hpp>

namespace rdmx
{

/// A peer of an endpoint: an entry of its address vector. Compact (as libfabric's fi_addr_t
/// in FI_AV_TABLE): the low 32 bits index the vector, the high 32 bits are a generation
/// that makes a handle stale once its peer is removed (a stale handle is
/// errc::invalid_argument, never another peer).
enum class peer : std::uint64_t {};
/// In recv() and peek(): a message from any peer.
inline constexpr peer any_peer{~std::uint64_t{0}};

/// What an endpoint_completion completes.
enum class endpoint_op : std::uint8_t {
    send,              ///< a tagged send: eager, once the message left (the local completion of its send);
                       ///< rendezvous, once the receiver acknowledged that it has read the data
    recv,              ///< a tagged receive matched a message and holds its bytes
    write,             ///< a one-sided write by peer handle
    read,              ///< a one-sided read by peer handle
    fetch_add,         ///< an atomic fetch-and-add by peer handle (the old value is in `local`)
    compare_swap,      ///< an atomic compare-and-swap by peer handle (the old value is in `local`)
    bind_window,       ///< a memory window bound for a peer: its remote() is valid now
    invalidate_window, ///< a memory window revoked
    /// endpoint_options::peer_events: the connection to `peer` ended (`status` says why:
    /// peer_lost, disconnected, ...). Its held messages stay; the next operation to it
    /// redials; remove() retires it. Not for remove() itself.
    peer_down,
    /// endpoint_options::peer_events: a new incarnation of `peer` (the same address, a
    /// restarted process) made contact; what the old one had is gone.
    peer_restarted,
};
const char* to_string(endpoint_op op) noexcept;

/// One completion of an endpoint, polled into a caller-supplied array.
struct endpoint_completion {
    std::uint64_t context = 0; ///< the caller's, given with the operation (0 for peer events)
    endpoint_op op = endpoint_op::send;
    /// Empty on success. recv: errc::local_length when the message was longer than the
    /// buffer (the buffer holds its first bytes, `length` says how long it was). Any op:
    /// the cause when its peer's connection failed (connection_refused, timed_out after
    /// the connect deadline, peer_lost, transport_retry_exceeded, ...), errc::canceled when
    /// the application removed the peer or destroyed the endpoint. Always in rdmx's own
    /// category (rdmx::errc), the same code for the same cause on every backend: a work
    /// request flushed by a connection's end completes with that end's cause, never as
    /// errc::flushed.
    std::error_code status;
    rdmx::peer peer{};        ///< recv: the source; otherwise the target
    std::uint64_t tag = 0;    ///< send / recv: the message's tag
    std::uint64_t length = 0; ///< recv: the message's length; read / write: the bytes moved
};

/// How an endpoint is set up. Connection settings (depths, timeouts, retries) come from
/// `connection`, whose queue-sharing fields (send_cq, recv_cq, srq, events, context) the
/// endpoint sets itself and ignores from here.
struct endpoint_options {
    connection_options connection;
    /// Tagged messages up to this many bytes go eager (copied through a receive buffer at
    /// the receiver); longer ones by rendezvous (the receiver reads them from the sender's
    /// memory, which must then be registered with access::remote_read).
    std::uint32_t eager_limit = 8192;
    /// Receive buffers of eager_limit bytes (plus a header) in the shared receive queue of
    /// all peers. Unexpected messages (no matching receive posted yet) stay in their
    /// buffer. Senders are held back by per-peer credits (docs/endpoints.md, "Flow
    /// control"): each connected peer may hold its share of `unexpected_limit` and have a
    /// window of the other buffers in flight; beyond that its sends wait in its queue
    /// (max_queued_ops) until a receive takes its messages. So a flooder stalls itself, and
    /// the shared receive queue does not run dry for the other peers.
    std::uint32_t receive_buffers = 512;
    std::uint32_t unexpected_limit = 256;
    /// Posted tagged receives not matched yet, at most (beyond: would_block).
    std::uint32_t max_posted_recvs = 1024;
    /// Operations issued to a peer that is not connected yet are queued (at most this many
    /// per endpoint; beyond: would_block) until the connection is up, and fail with the
    /// cause (timed_out, connection_refused, unreachable, rejected) if it is not up within
    /// `connect_deadline` of the first of them. A refused or unreachable peer (a client
    /// started before its server) is redialled with backoff until that deadline.
    std::uint32_t max_queued_ops = 1024;
    std::chrono::milliseconds connect_deadline{10000};
    /// Entries of the one completion queue behind all peers.
    std::uint32_t completion_queue_depth = 16384;
    /// poll() keeps no completion notification armed (re-arming after each completion
    /// costs two system calls on verbs, and on TCP keeps the engine thread waking for each
    /// burst), raises no eventfd, and takes new connection requests every 16th call (the
    /// queue, events and deadlines every call). That is what poll() does anyway until
    /// fd() is first asked for; this option keeps it so afterwards. wait() still sleeps:
    /// it arms before it sleeps. fd() alone is then not woken by completions.
    bool busy_poll = false;
    /// poll() also reports peer_down and peer_restarted (endpoint_op), so that a service
    /// can retire the state of clients that died or restarted. Off by default: a caller
    /// that does not expect them never sees them.
    bool peer_events = false;
};

/// A connectionless endpoint over rdmx connections. Not movable.
class endpoint
{
public:
    /// Listens on `address` (a host, not a wildcard, since the address is how peers name
    /// this endpoint: "tcp://10.0.0.1:0", "rdma://10.0.0.1:7471"; port 0 picks one) and
    /// draws a random 64-bit incarnation id. Throws rdmx::error.
    static std::unique_ptr<endpoint> open(domain& d, std::string_view address,
                                          const endpoint_options& opts = {});

    virtual ~endpoint() = default;
    endpoint(const endpoint&) = delete;
    endpoint& operator=(const endpoint&) = delete;

    /// This endpoint's address, with the port in effect: what peers insert.
    virtual const std::string& address() const noexcept = 0;
    /// Random per open(): a restarted process at the same address has another one.
    virtual std::uint64_t incarnation() const noexcept = 0;

    // --- address vector ---
    /// Inserts a peer's address and returns its handle; connects nothing yet. Inserting an
    /// address already present (inserted, or a peer that contacted this endpoint first)
    /// returns the same handle. Throws rdmx::error for a malformed address or another
    /// backend's scheme, and (invalid_argument) for this endpoint's own address: sending to
    /// itself is not supported.
    virtual rdmx::peer insert(std::string_view address) = 0;
    /// Removes a peer: closes its connection deliberately (the peer sees a clean
    /// disconnect), completes its queued and outstanding operations with errc::canceled
    /// and drops its unexpected messages. Its handle becomes stale. No-op for a stale handle.
    virtual void remove(rdmx::peer p) noexcept = 0;
    /// The address of a live handle (nullopt for a stale one).
    virtual std::optional<std::string> address_of(rdmx::peer p) const = 0;

    // --- tagged messages ---
    /// Sends `local` (at most connection.max_send_sge - 1 entries: the endpoint
    /// prepends a header) with `tag` to `to`, eager
    /// or by rendezvous per eager_limit. The memory must stay untouched until completion.
    /// would_block: too many operations outstanding or queued; invalid_argument: a stale
    /// peer, any_peer, a bad region, or a rendezvous send from memory without remote_read.
    virtual std::error_code send(rdmx::peer to, std::uint64_t tag, std::span<const sge> local,
                                 std::uint64_t context) noexcept = 0;
    /// Posts a receive for the first message from `from` (or any_peer) whose tag equals
    /// `tag` in every bit not set in `ignore`. Receives match in the order they were posted,
    /// messages in the order they arrived (per peer, the order they were sent). `local`
    /// needs access::local_write. Completes at once (in the next poll) when a held
    /// unexpected message matches. A receive directed at a peer completes with the cause
    /// (peer_lost, disconnected, ...) when that peer's connection ends (also when a new
    /// incarnation of it replaces it); one posted while no connection is up waits for the
    /// next. errc::canceled on remove().
    virtual std::error_code recv(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore,
                                 std::span<const sge> local, std::uint64_t context) noexcept = 0;
    /// As above; `matched` says whether a held message matched it at once (its completion
    /// is waiting in poll() already), false when it was posted to wait for one.
    virtual std::error_code recv(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore,
                                 std::span<const sge> local, std::uint64_t context,
                                 bool& matched) noexcept = 0;

    /// An unexpected message, as peek() finds it.
    struct message_info {
        rdmx::peer source{};
        std::uint64_t tag = 0;
        std::uint64_t length = 0;
        std::uint64_t claim = 0; ///< with claim = true: what recv_claimed() takes
    };
    /// Looks for the oldest held message that recv(from, tag, ignore) would match, without
    /// taking it; with `claim`, takes it out of matching for a later recv_claimed() (as
    /// libfabric's FI_PEEK | FI_CLAIM). nullopt when there is none.
    virtual std::optional<message_info> peek(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore,
                                             bool claim = false) noexcept = 0;
    /// Receives a claimed message into `local`; invalid_argument for an unknown claim.
    virtual std::error_code recv_claimed(std::uint64_t claim, std::span<const sge> local,
                                         std::uint64_t context) noexcept = 0;
    /// Cancels the oldest posted receive with `context` that no message has matched yet (as
    /// libfabric's fi_cancel): it completes with errc::canceled, as any completion, in the
    /// next poll(), and fd() is readable for it. With a timer of its own, this is how an
    /// application times out one request. invalid_argument when no such receive is posted
    /// (it matched already: its completion is or will be in poll()).
    virtual std::error_code cancel_recv(std::uint64_t context) noexcept = 0;

    // --- one-sided by peer handle (bulk data to descriptors shipped in messages) ---
    virtual std::error_code write(rdmx::peer to, std::span<const sge> local, const remote_buffer& remote,
                                  std::uint64_t context) noexcept = 0;
    virtual std::error_code read(rdmx::peer from, std::span<const sge> local, const remote_buffer& remote,
                                 std::uint64_t context) noexcept = 0;
    /// Atomics by peer handle, as connection::post_fetch_add / post_compare_swap
    /// (docs/atomics.md): 8 aligned bytes at `remote` (access::remote_atomic), the old
    /// value lands in `local` (8 bytes, access::local_write). not_supported on a device
    /// without atomics.
    virtual std::error_code fetch_add(rdmx::peer to, const sge& local, const remote_buffer& remote,
                                      std::uint64_t add, std::uint64_t context) noexcept = 0;
    virtual std::error_code compare_swap(rdmx::peer to, const sge& local, const remote_buffer& remote,
                                         std::uint64_t compare, std::uint64_t swap,
                                         std::uint64_t context) noexcept = 0;
    /// Binds `window` over [offset, offset + length) of `region` (access::bind_window)
    /// with `rights` for peer `to` alone, through its connection (made first if needed, as
    /// for any operation). window.remote() is valid once this completes. The window lives
    /// on that connection: if it is replaced (the peer restarted, or was removed and
    /// inserted again) the window is revoked with it; bind it again. not_supported without
    /// device_limits::memory_windows.
    virtual std::error_code bind_window(rdmx::peer to, memory_window& window, const memory_region& region,
                                        std::uint64_t offset, std::uint64_t length, rdmx::access rights,
                                        std::uint64_t context) noexcept = 0;
    /// Revokes `window`, bound for `to` by bind_window; completes as invalidate_window.
    /// Goes on `to`'s connection like any operation (made first if needed), also after the
    /// one the window was bound on was replaced: a window revoked that way is still bound
    /// for the verbs backend, which binds it again only after this.
    virtual std::error_code invalidate_window(rdmx::peer to, memory_window& window,
                                              std::uint64_t context) noexcept = 0;

    // --- progress ---
    /// Makes all progress (new peers, connection events, retries and deadlines, matching,
    /// rendezvous) and moves up to out.size() completions into `out`. Never blocks and
    /// never allocates once the endpoint's pools exist. When completions already waiting
    /// fill `out`, it only hands them out (no system call), progressing at the latest on
    /// the 16th such call in a row.
    virtual std::size_t poll(std::span<endpoint_completion> out) noexcept = 0;
    /// Readable when poll() has something to do (level-triggered; it may wake with nothing
    /// to return): one fd for an epoll set or an io_context. This includes what the calls
    /// above completed or made possible outside poll() (a recv() that matched a held
    /// message, a remove() that canceled work, a send() whose post failed), so an
    /// application may post from anywhere and sleep on fd() alone. Not with busy_poll.
    /// The first call is what makes poll() keep the queue armed for a sleeper (it is
    /// readable once at once, so that the first sleep polls and arms): a caller that never
    /// asks for fd() spins on poll() or sleeps in wait() without paying for it.
    virtual int fd() const noexcept = 0;
    /// Polls; if nothing completed, sleeps on fd() until something does or `timeout` has
    /// passed (never less: a 1 ms wait that finds nothing takes 1 ms), and polls again.
    virtual std::size_t wait(std::span<endpoint_completion> out,
                             std::chrono::milliseconds timeout) noexcept = 0;

    /// Peers in the address vector now (inserted or met), and of those, connected, and
    /// connecting (a connection under way, or one the peer dialled that it has not yet
    /// shown to be up on its side: docs/endpoints.md, "Connections").
    struct stats {
        std::size_t peers = 0;
        std::size_t connected = 0;
        std::size_t connecting = 0;
        std::size_t unexpected = 0; ///< messages held without a matching receive
    };
    virtual stats statistics() const noexcept = 0;

protected:
    endpoint() = default;
};

} // namespace rdmx
