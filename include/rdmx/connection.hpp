// Connections, listeners and the data path shared by both backends.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <rdmx/error.hpp>
#include <rdmx/memory.hpp>
#include <rdmx/uri.hpp>

struct rdma_cm_id;
struct ibv_qp;
struct ibv_pd;
struct ibv_cq;
struct ibv_context;

namespace rdmx
{

class connection;
class listener;
class completion_queue;
class shared_receive_queue;
class event_queue;
struct completion_queue_options;
struct shared_receive_queue_options;
namespace detail
{
class shared_memory;
}

/// Operation of a work request or completion.
enum class opcode : std::uint8_t {
    send,           ///< two-sided send (consumes a posted receive at the peer)
    write,          ///< one-sided RDMA write
    write_with_imm, ///< RDMA write that also consumes a receive at the peer, carrying `imm`
    read,           ///< one-sided RDMA read
    recv,           ///< receive completion of a send
    recv_with_imm,  ///< receive completion of a write_with_imm (byte_len = bytes written)
    unknown,        ///< error completions: verbs leaves the opcode undefined, so both backends say unknown
    /// Atomic fetch-and-add on 8 bytes at the peer: adds work_request::compare_add to the
    /// target and returns its old value in `local` (docs/atomics.md).
    fetch_add,
    /// Atomic compare-and-swap on 8 bytes at the peer: if the target equals
    /// work_request::compare_add it becomes work_request::swap; the old value comes back
    /// in `local` either way (docs/atomics.md).
    compare_swap,
    /// Binds work_request::window over [bind_offset, bind_offset + bind_length) of
    /// work_request::bind_region with rights bind_access, for this connection's peer only;
    /// the window gets a new key (memory_window::remote()). Local: nothing travels.
    bind_window,
    /// Revokes work_request::window locally (verbs IBV_WR_LOCAL_INV); later accesses with
    /// its key fail.
    invalidate_window,
    /// A send (it consumes a receive at the peer) that also revokes the peer's window whose
    /// key is work_request::invalidate_key before the receive completes; the receive's
    /// completion says which (completion::invalidated_key). A key that names no window of
    /// the peer bound through this connection fails the connection (remote_invalid_request
    /// or, on iWARP, tear-down).
    send_with_invalidate,
};
const char* to_string(opcode op) noexcept;

/// Send-queue flags (a bit set).
enum class send_flags : std::uint32_t {
    none = 0,
    signaled = 1u << 0, ///< produce a completion for this request
    fence = 1u << 1,    ///< start only after all earlier reads and atomics on this connection completed
    /// Copy the payload into the request (size <= limits().max_inline). Not from CUDA device
    /// memory on verbs (invalid_argument: the provider copies with the CPU); TCP stages it.
    inline_data = 1u << 2,
    solicited = 1u << 3, ///< wake a peer waiting with request_notify(solicited_only)
};
constexpr send_flags operator|(send_flags a, send_flags b) noexcept
{
    return static_cast<send_flags>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr bool has(send_flags set, send_flags f) noexcept
{
    return (static_cast<std::uint32_t>(set) & static_cast<std::uint32_t>(f)) != 0;
}

/// One scatter/gather element: a range of a registered region.
struct sge {
    const memory_region* region = nullptr;
    std::size_t offset = 0;
    std::size_t length = 0;
};

/// The one wr_id that is rdmx's own (the goodbye a verbs connection writes to its peer
/// before it disconnects, docs/wire-format.md): post() and post_recv() refuse it with
/// errc::invalid_argument, on every backend, and no completion the user polls carries it.
inline constexpr std::uint64_t reserved_wr_id = ~std::uint64_t{0};

/// A send-queue work request. `local` must stay valid only during `post()`; the memory it
/// names must stay untouched until the completion (or a later signalled one) is polled.
///
/// Atomics (fetch_add, compare_swap; docs/atomics.md): `local` is one sge of exactly 8
/// bytes in a region with local_write, where the target's old value lands as a native
/// std::uint64_t (host byte order); `remote` names 8-byte-aligned memory (addr % 8 == 0,
/// length >= 8; the first 8 bytes are the target) in a region the peer registered with
/// access::remote_atomic, which it holds as a native std::uint64_t. No inline_data.
struct work_request {
    rdmx::opcode opcode = opcode::send;
    std::uint64_t wr_id = 0;
    std::span<const sge> local;
    remote_buffer remote{}; ///< write / read / atomics: where at the peer (addr is absolute)
    send_flags flags = send_flags::signaled;
    std::uint32_t imm = 0; ///< write_with_imm only
    /// fetch_add: the value added (modulo 2^64); compare_swap: the value compared with.
    std::uint64_t compare_add = 0;
    /// compare_swap only: what the target becomes if it equalled compare_add.
    std::uint64_t swap = 0;
    /// bind_window, invalidate_window: the window (allocated by this connection's domain).
    memory_window* window = nullptr;
    /// bind_window: the region the window covers part of (registered with
    /// access::bind_window by this connection's domain), the range and the rights
    /// (remote_read, remote_write, remote_atomic: a subset of the region's).
    const memory_region* bind_region = nullptr;
    std::uint64_t bind_offset = 0;
    std::uint64_t bind_length = 0;
    rdmx::access bind_access = rdmx::access::none;
    /// send_with_invalidate: the key of the peer's window to revoke (its remote().key).
    std::uint64_t invalidate_key = 0;
};

/// A receive-queue work request.
struct recv_request {
    std::uint64_t wr_id = 0;
    std::span<const sge> local;
};

/// One completion, polled into a caller-supplied array.
struct completion {
    std::uint64_t wr_id = 0;
    rdmx::opcode opcode = opcode::unknown;
    std::error_code status;     ///< empty on success; an rdmx::errc otherwise
    std::uint32_t byte_len = 0; ///< recv / recv_with_imm / read: bytes transferred; atomics: 8
    std::uint32_t imm = 0;      ///< valid when with_imm
    bool with_imm = false;
    /// recv of a send_with_invalidate: the peer revoked this side's window with this key
    /// before the receive completed.
    bool with_invalidate = false;
    std::uint64_t invalidated_key = 0;
    /// The connection it belongs to and that connection's connection_options::context;
    /// what tells the connections of a shared completion_queue apart.
    std::uint64_t context = 0;
    rdmx::connection* conn = nullptr;
};

/// Queue sizes and protocol knobs of one connection. Requests beyond the device's limits
/// are clamped; the values in effect are in `connection::limits()`. The fields at the top
/// mean the same on both backends; settings that only one backend has live in a struct of
/// their own (`tcp`), which the other backend ignores. No setting is verbs-only: each verbs
/// knob here has a TCP meaning too.
struct connection_options {
    std::uint32_t send_queue_depth = 128;
    std::uint32_t recv_queue_depth = 128;
    std::uint32_t max_send_sge = 4;
    std::uint32_t max_recv_sge = 4;
    std::uint32_t max_inline = 64;
    /// Outstanding RDMA reads and atomics per direction (verbs: initiator_depth /
    /// responder_resources; atomics and reads share them).
    std::uint32_t max_rd_atomic = 16;
    /// How long a request may wait for the peer's acknowledgement before it is retried
    /// (verbs: the QP's local ACK timeout, rounded up to 4.096 us * 2^n; TCP: how long the
    /// engine waits without any byte moving while requests are outstanding, divided by
    /// retry_count + 1). A dead, stopped or unreachable peer is thus detected within about
    /// ack_timeout * (retry_count + 1) (TCP: 1 to 1.25 times that after the last byte moved,
    /// docs/wire-format.md section 6): outstanding requests then complete with
    /// errc::transport_retry_exceeded (the first) and errc::flushed (the rest). On TCP the
    /// product is at least 1 s, above the kernel's own retransmission timeouts.
    std::chrono::milliseconds ack_timeout{500};
    /// Transport retries before errc::transport_retry_exceeded (verbs retry_count, 0..7).
    /// rxe takes 7 for "retry forever": there rdmx asks for at most 6.
    std::uint8_t retry_count = 7;
    /// Receiver-not-ready retries before errc::rnr_retry_exceeded (0..7, 7 = forever).
    std::uint8_t rnr_retry_count = 7;
    /// How long a sender waits before retrying after a receiver-not-ready NAK, in the IBTA
    /// encoding (0..31): 12 = 0.64 ms (perftest's choice), 1 = 0.01 ms, 31 = 491.52 ms,
    /// 0 = 655.36 ms (what rdma_cm leaves on a QP). verbs: set on our QP, so it is what our
    /// NAKs tell the peer; TCP: the delay this side waits before retransmitting.
    std::uint8_t min_rnr_timer = 12;
    /// Bound on each connection-management step (resolve, connect, accept).
    std::chrono::milliseconds timeout{5000};

    // --- sharing (rdmx/queues.hpp); null: the connection has queues of its own ---
    /// Where the completions of this connection's send queue go (shared with others).
    std::shared_ptr<completion_queue> send_cq;
    /// Where its receive completions go; may be the same queue as send_cq.
    std::shared_ptr<completion_queue> recv_cq;
    /// The receive queue it consumes from instead of its own (recv_queue_depth and
    /// max_recv_sge are then those of the shared queue; it must come from the same
    /// domain, else errc::invalid_argument). Its receive completions go to recv_cq if
    /// given, else to the connection's own CQ, which is then sized for the shared queue's
    /// whole depth on the receive side: any number of its receives may complete on this
    /// one connection, and none can overrun the CQ.
    std::shared_ptr<shared_receive_queue> srq;
    /// Where its connection events go: established (after start_connect / start_accept),
    /// disconnected, error. Without one, state() and last_error() tell the same.
    std::shared_ptr<event_queue> events;
    /// Given back in each completion and event of this connection.
    std::uint64_t context = 0;

    /// Settings of the TCP backend alone; the verbs backend ignores them.
    struct tcp_options {
        /// How often the engine checks whether an application that busy-polls (and so
        /// reads and writes the socket in its own post() and poll() calls) has stopped
        /// calling; it then takes the socket back and serves one-sided requests and
        /// pending transfers without the application, at most about two checks after the
        /// last call. Each check wakes the engine thread, on the application's CPU when the
        /// two share one: a shorter interval hands the socket back to the engine sooner, a
        /// longer one disturbs a busy-polling application less (docs/tuning.md).
        /// Clamped to 100 us .. 1 s.
        std::chrono::microseconds takeover_check{1000};
        /// The congestion control algorithm of this side's socket (TCP_CONGESTION, as in
        /// /proc/sys/net/ipv4/tcp_available_congestion_control: "cubic", "reno", "bbr",
        /// ...); each side sets its own, which governs what it sends. For a system whose
        /// default suits its other traffic but not this link (docs/tuning.md). Empty (the
        /// default) keeps the system's (net.ipv4.tcp_congestion_control). One the kernel
        /// does not have, or does not allow an unprivileged process, fails connect() /
        /// accept() with the errno of setsockopt (ENOENT, EPERM); one over 15 bytes (the
        /// kernel's limit) with errc::invalid_argument.
        std::string congestion;
    };
    tcp_options tcp;
};

/// Limits in effect for a connection (after clamping to the device).
struct connection_limits {
    std::uint32_t send_queue_depth = 0;
    std::uint32_t recv_queue_depth = 0;
    std::uint32_t max_send_sge = 0;
    std::uint32_t max_recv_sge = 0;
    std::uint32_t max_inline = 0;
    std::uint32_t max_rd_atomic = 0; ///< reads/atomics outstanding at the peer: the smaller offer
};

/// Handles for low-level control on the verbs backend; all null on TCP. rdmx keeps its own
/// accounting of the QP and CQ (docs/failure-semantics.md, "Escape hatches"): query them
/// and read the cm_id freely; register memory on the pd and build objects of your own on it.
/// Do not post to `qp` or poll `cq` (rdmx counts queue slots and takes every completion;
/// a raw post or poll desynchronises both), nor disconnect, destroy or modify them: use the
/// connection's own calls.
struct native_handles {
    rdma_cm_id* cm_id = nullptr;
    ibv_qp* qp = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
};

/// What a connection's user can act on, the same on both backends. connect() and accept()
/// return a connection only once it is established and throw otherwise (a failed set-up
/// step is that exception), so an application sees `established` first and then, when the
/// connection ends, `disconnected` or `error`. The steps of setting up (rdma_cm's address
/// and route resolution on verbs, the handshake on TCP) differ between the backends and
/// leave the caller nothing to do: they are all `connecting`, which no connection that
/// connect() or accept() returned is in. `error` is final; `disconnected` is final after a
/// disconnect() of this side, while one the peer or the network caused may still become
/// `error` when its cause arrives later (verbs: an asynchronous event of the device).
enum class connection_state : std::uint8_t {
    connecting,   ///< being set up (internal to connect() and accept())
    established,  ///< post and poll
    disconnected, ///< either side disconnected; posted work is flushed
    error,        ///< failed (last_error() says why); posted work is flushed
};
const char* to_string(connection_state s) noexcept;

/// An RC connection. Not movable: its queue pair has posted work that refers to it.
/// Data-path calls are noexcept and thread-compatible (one thread posts and polls).
/// Destroying it disconnects; on TCP the engine still sends the peer what this side owed
/// it (read responses, a NAK) and closes the socket afterwards, within
/// ack_timeout * (retry_count + 1), at least 1 s (docs/wire-format.md section 6), as long
/// as the engine runs (see domain: it stops with the last object of its domain).
class connection
{
public:
    virtual ~connection() = default;
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    virtual rdmx::backend backend() const noexcept = 0;
    virtual connection_state state() const noexcept = 0;
    /// Why the connection left `established`: empty while it is up (or still connecting),
    /// otherwise the cause, readable with message(): errc::disconnected (either side
    /// disconnected), the status of the error completion that broke it
    /// (errc::transport_retry_exceeded, errc::remote_access, ...), or, on verbs, what the
    /// device reported as an asynchronous event (a peer's access violation on this side's
    /// memory, a fatal QP error: on iWARP such failures tear the connection down instead
    /// of completing a request with an error).
    virtual std::error_code last_error() const noexcept = 0;
    virtual const connection_limits& limits() const noexcept = 0;
    /// Private data the peer sent with its accept (client side) or connect (server side).
    virtual std::span<const std::byte> peer_private_data() const noexcept = 0;

    /// Posts a list of send-queue requests with one doorbell. Validates every request
    /// first (regions, bounds, access, sge count, inline size; for atomics the 8-byte
    /// local sge and the 8-byte-aligned remote address): on a validation error nothing is
    /// posted; an operation the device lacks (write_with_imm on iWARP, atomics where
    /// device_limits::atomics is false) is errc::not_supported, also before anything is
    /// posted. `would_block` means the send queue is full (rdmx counts the outstanding
    /// requests against limits().send_queue_depth itself, on every provider: a signalled
    /// request's completion frees its slot and those of the unsignalled ones before it);
    /// `*posted` (if given) says exactly how many were posted before it or before any error.
    virtual std::error_code post(std::span<const work_request> wrs,
                                 std::size_t* posted = nullptr) noexcept = 0;
    virtual std::error_code post_recv(std::span<const recv_request> wrs,
                                      std::size_t* posted = nullptr) noexcept = 0;

    // Convenience wrappers over post() for single requests. Inline, so that a single
    // request costs the application one (virtual) call into the library, not two.
    std::error_code post_send(std::span<const sge> local, std::uint64_t wr_id,
                              send_flags flags = send_flags::signaled) noexcept
    {
        work_request wr{.opcode = opcode::send, .wr_id = wr_id, .local = local, .flags = flags};
        return post({&wr, 1});
    }
    std::error_code post_write(std::span<const sge> local, const remote_buffer& remote, std::uint64_t wr_id,
                               send_flags flags = send_flags::signaled) noexcept
    {
        work_request wr{
            .opcode = opcode::write, .wr_id = wr_id, .local = local, .remote = remote, .flags = flags};
        return post({&wr, 1});
    }
    std::error_code post_write_imm(std::span<const sge> local, const remote_buffer& remote, std::uint32_t imm,
                                   std::uint64_t wr_id, send_flags flags = send_flags::signaled) noexcept
    {
        work_request wr{.opcode = opcode::write_with_imm,
                        .wr_id = wr_id,
                        .local = local,
                        .remote = remote,
                        .flags = flags,
                        .imm = imm};
        return post({&wr, 1});
    }
    std::error_code post_read(std::span<const sge> local, const remote_buffer& remote, std::uint64_t wr_id,
                              send_flags flags = send_flags::signaled) noexcept
    {
        work_request wr{
            .opcode = opcode::read, .wr_id = wr_id, .local = local, .remote = remote, .flags = flags};
        return post({&wr, 1});
    }
    /// Adds `add` to the 8 bytes at `remote`; their old value lands in `local` (8 bytes).
    std::error_code post_fetch_add(const sge& local, const remote_buffer& remote, std::uint64_t add,
                                   std::uint64_t wr_id, send_flags flags = send_flags::signaled) noexcept
    {
        work_request wr{.opcode = opcode::fetch_add,
                        .wr_id = wr_id,
                        .local = {&local, 1},
                        .remote = remote,
                        .flags = flags,
                        .compare_add = add};
        return post({&wr, 1});
    }
    /// Sets the 8 bytes at `remote` to `swap` if they equal `compare`; their old value
    /// lands in `local` (8 bytes) either way, so the swap happened iff it equals `compare`.
    std::error_code post_compare_swap(const sge& local, const remote_buffer& remote, std::uint64_t compare,
                                      std::uint64_t swap, std::uint64_t wr_id,
                                      send_flags flags = send_flags::signaled) noexcept
    {
        work_request wr{.opcode = opcode::compare_swap,
                        .wr_id = wr_id,
                        .local = {&local, 1},
                        .remote = remote,
                        .flags = flags,
                        .compare_add = compare,
                        .swap = swap};
        return post({&wr, 1});
    }
    /// Binds `window` over [offset, offset + length) of `region` with `rights`, for this
    /// connection's peer; window.remote() is the new descriptor at once (send it after).
    std::error_code post_bind_window(memory_window& window, const memory_region& region, std::uint64_t offset,
                                     std::uint64_t length, rdmx::access rights, std::uint64_t wr_id,
                                     send_flags flags = send_flags::signaled) noexcept
    {
        // Assigned, not designated: -Wmissing-field-initializers would want every field named.
        work_request wr;
        wr.opcode = opcode::bind_window;
        wr.wr_id = wr_id;
        wr.flags = flags;
        wr.window = &window;
        wr.bind_region = &region;
        wr.bind_offset = offset;
        wr.bind_length = length;
        wr.bind_access = rights;
        return post({&wr, 1});
    }
    /// Revokes `window` (bound through this connection).
    std::error_code post_invalidate_window(memory_window& window, std::uint64_t wr_id,
                                           send_flags flags = send_flags::signaled) noexcept
    {
        work_request wr;
        wr.opcode = opcode::invalidate_window;
        wr.wr_id = wr_id;
        wr.flags = flags;
        wr.window = &window;
        return post({&wr, 1});
    }
    /// Sends `local` and revokes the peer's window whose key is `peer_window_key`.
    std::error_code post_send_invalidate(std::span<const sge> local, std::uint64_t peer_window_key,
                                         std::uint64_t wr_id,
                                         send_flags flags = send_flags::signaled) noexcept
    {
        work_request wr;
        wr.opcode = opcode::send_with_invalidate;
        wr.wr_id = wr_id;
        wr.local = local;
        wr.flags = flags;
        wr.invalidate_key = peer_window_key;
        return post({&wr, 1});
    }
    std::error_code post_recv(std::span<const sge> local, std::uint64_t wr_id) noexcept
    {
        recv_request wr{.wr_id = wr_id, .local = local};
        return post_recv({&wr, 1});
    }

    /// Moves up to out.size() completions into `out`; returns how many (never allocates).
    /// Only those of the sides without a shared completion queue (connection_options::
    /// send_cq / recv_cq): a shared side's completions are polled from its queue.
    virtual std::size_t poll(std::span<completion> out) noexcept = 0;

    // Event mode: wait for completion_fd() to become readable, then ack_notify().
    /// A file descriptor that becomes readable after request_notify() when a completion arrives;
    /// -1 when both sides report to shared completion queues (request_notify() then fails
    /// with errc::invalid_argument: wait on the queues).
    virtual int completion_fd() const noexcept = 0;
    /// Arms the notification (ibv_req_notify_cq). Poll again after arming to close the race.
    virtual std::error_code request_notify(bool solicited_only = false) noexcept = 0;
    /// Consumes the pending notifications, all of them (ibv_get_cq_event + ibv_ack_cq_events
    /// until none is left), so that the descriptor is quiet until the next arming fires;
    /// no-op if none is pending.
    virtual std::error_code ack_notify() noexcept = 0;

    /// Event-mode helper: polls; if nothing is there, arms, re-polls, and sleeps on
    /// completion_fd() up to `timeout`. Returns the number polled (0 on timeout).
    std::size_t wait(std::span<completion> out, std::chrono::milliseconds timeout) noexcept;

    /// Disconnects; all posted work completes with errc::flushed. Idempotent. The peer
    /// sees `disconnected` (by_peer), not errc::peer_lost as for a process that died: on
    /// verbs this side first writes a goodbye to the peer and waits for it, at most
    /// 200 ms, polling the CQ its send side reports to and keeping what it polls for the
    /// next poll(); so call it (and destroy the connection) on the thread that polls the
    /// connection's own CQ, or while no thread does. Destroying does the same.
    virtual void disconnect() noexcept = 0;

    virtual native_handles native() const noexcept { return {}; }

protected:
    connection() = default;
};

/// An incoming connection request, taken from a listener.
class connection_request
{
public:
    virtual ~connection_request() = default;
    /// Private data sent by the connecting peer.
    virtual std::span<const std::byte> private_data() const noexcept = 0;
    /// Accepts; waits (bounded by opts.timeout) until established. Throws rdmx::error.
    /// `initial_recvs` are posted before the peer is told it may send (so that its first
    /// message finds a receive), as post_recv would post them. On iWARP the connector
    /// speaks first: post nothing on an accepted connection before a message from the
    /// peer arrived (RFC 5044 7.1.2; docs/failure-semantics.md, "iWARP").
    virtual std::unique_ptr<connection> accept(const connection_options& opts = {},
                                               std::span<const std::byte> private_data = {},
                                               std::span<const recv_request> initial_recvs = {}) = 0;
    /// Accepts without waiting: returns the connection in state `connecting`; it becomes
    /// `established` (event established on opts.events) or `error` (event error with the
    /// cause) later, bounded by opts.timeout. Throws only for what fails at once (bad
    /// options, no room on a shared queue).
    virtual std::unique_ptr<connection> start_accept(const connection_options& opts,
                                                     std::span<const std::byte> private_data = {},
                                                     std::span<const recv_request> initial_recvs = {}) = 0;
    /// Rejects; the peer's connect fails with errc::rejected carrying `private_data`.
    virtual void reject(std::span<const std::byte> private_data = {}) = 0;
};

class listener
{
public:
    virtual ~listener() = default;
    /// Waits up to `timeout` for a connection request; nullptr on timeout. A timeout of 0
    /// takes a pending request, if there is one, and never blocks.
    virtual std::unique_ptr<connection_request> get_request(std::chrono::milliseconds timeout) = 0;
    /// A file descriptor that is readable while a request is pending (level-triggered), for
    /// epoll or an io_context; then take it with get_request(0ms). It may also wake when
    /// there is nothing to take (verbs: an event of a request already dropped; TCP: a
    /// client's HELLO still incomplete, a client gone, an internal timer): get_request(0ms)
    /// then returns nullptr. Take requests until it returns nullptr before waiting again.
    virtual int fd() const noexcept = 0;
    /// The port actually bound (useful after listening on port 0).
    virtual std::uint16_t port() const noexcept = 0;
    virtual rdmx::backend backend() const noexcept = 0;
};

/// Limits of the device (verbs: ibv_query_device; TCP: rdmx's own).
struct device_limits {
    std::string device_name; ///< "rxe0", "mlx5_0", or "tcp"
    std::uint32_t max_qp_wr = 0;
    std::uint32_t max_sge = 0;
    std::uint32_t max_inline = 0; ///< probed by creating a QP, never hard-coded
    std::uint32_t max_qp_rd_atom = 0;
    std::uint32_t max_qp_init_rd_atom = 0;
    std::uint64_t max_mr_size = 0;
    std::uint32_t max_msg_size = 0;
    /// SGEs in the local list of an RDMA read (verbs: max_sge_rd; iWARP devices may allow
    /// only 1). A read with more fails in post() with errc::invalid_argument.
    std::uint32_t max_sge_rd = 0;
    /// Whether opcode::write_with_imm exists (not on iWARP: post() refuses it with
    /// errc::not_supported).
    bool write_with_imm = true;
    /// Whether the atomics (opcode::fetch_add, compare_swap) exist (verbs: atomic_cap is
    /// not IBV_ATOMIC_NONE; not on siw); without them post() refuses them with
    /// errc::not_supported. Always on TCP.
    bool atomics = true;
    /// Whether memory windows exist (verbs: IBV_DEVICE_MEM_WINDOW_TYPE_2B; rxe has them,
    /// siw not): without them allocate_window() throws and access::bind_window, bind,
    /// invalidate and send_with_invalidate are refused with errc::not_supported. Always on
    /// TCP.
    bool memory_windows = true;
    /// An iWARP device (verbs): a remote error (bad key, no receive, overlong send) tears
    /// the connection down instead of failing the request; see docs/failure-semantics.md.
    bool iwarp = false;
};

/// How a listener is set up. It reports its requests through listener::fd() alone (wait on
/// it and an event queue in one set).
struct listen_options {
    int backlog = 64;
};

/// Limits of private data on connect / accept / reject, the same on every backend: those
/// of rdma_cm over RC (56, 196 and 148 bytes) less the 16 bytes rdmx keeps at the end of a
/// connect's and an accept's for its own use (on verbs, where the peer's goodbye is
/// written: docs/wire-format.md). A reject carries the user's bytes alone. The peer
/// receives exactly the bytes sent, on every provider.
inline constexpr std::size_t private_data_trailer = 16;
inline constexpr std::size_t max_connect_private_data = 56 - private_data_trailer;
inline constexpr std::size_t max_accept_private_data = 196 - private_data_trailer;
inline constexpr std::size_t max_reject_private_data = 148;

/// A protection domain on one device (verbs) or one TCP progress engine: registers
/// memory, listens and connects.
///
/// Lifetimes: connections, listeners, connection requests and memory regions keep what
/// they need of their domain alive (the verbs PD, device context and rdma_cm event thread;
/// the TCP engine thread and its region table), so they and the domain may be destroyed in
/// any order. Destroying the domain object only gives up the application's share: the
/// backend's resources, its thread included, go with the last object made from it. The
/// TCP engine first finishes what connections destroyed before still owed their peers
/// (read responses, a NAK, FIN; docs/wire-format.md section 6), so the last object's
/// destructor may wait for that, at most the longest `ack_timeout x (retry_count + 1)`
/// (at least 1 s) of those connections, plus half a second. On iWARP, a connection destroyed
/// before the provider answered its connect returns at once and leaves its QP to the
/// domain, which the provider holds until it gives the attempt up (siw: up to 10 s);
/// destroying the domain object waits for that (docs/failure-semantics.md, "iWARP").
class domain
{
public:
    /// Opens the domain that serves `address`: rdma:// needs an RDMA device (throws
    /// errc::no_device otherwise), tcp:// always works, auto:// (or no scheme) picks verbs
    /// when the address maps to an RDMA device and TCP otherwise; backend() says which.
    static std::unique_ptr<domain> open(std::string_view address,
                                        std::chrono::milliseconds timeout = std::chrono::seconds(2));

    virtual ~domain() = default;
    domain(const domain&) = delete;
    domain& operator=(const domain&) = delete;

    virtual rdmx::backend backend() const noexcept = 0;
    virtual const device_limits& limits() const noexcept = 0;

    /// Registers [addr, addr + length) with the given rights. Throws rdmx::error.
    /// Device memory is found by itself (memory_type::detect) or named; memory_region::
    /// memory_type() says which it was. CUDA device memory needs the NVIDIA driver, loaded
    /// at run time (errc::not_supported without it, naming what is missing); verbs
    /// registers it through dma-buf, else nvidia-peermem; TCP refuses it (not_supported)
    /// for now. docs/gpu.md.
    std::unique_ptr<memory_region> register_memory(void* addr, std::size_t length, rdmx::access rights,
                                                   rdmx::memory_type type = memory_type::detect);
    /// Allocates `length` bytes of zeroed, page-aligned host memory and registers them with
    /// `rights`; the region owns the memory (freed once it is deregistered, when the region
    /// is destroyed). A region like any other on every backend; over shm:// (and auto://
    /// connections that took it) a peer on this host maps its pages and moves its RDMA
    /// writes and reads with a copy of its own, no system call and no work for this
    /// process (docs/shm.md, "Allocated regions"). The memory is a shared mapping: a forked
    /// child shares it rather than copying it. Throws rdmx::error.
    std::unique_ptr<memory_region> allocate_memory(std::size_t length, rdmx::access rights);
    /// An unbound memory window (rdmx/memory.hpp). Throws rdmx::error: not_supported
    /// without device_limits::memory_windows, or the verb's errno.
    virtual std::unique_ptr<memory_window> allocate_window() = 0;
    /// Listens on host:port of `address` (port 0: any free port, see listener::port()).
    virtual std::unique_ptr<listener> listen(std::string_view address, const listen_options& opts) = 0;
    std::unique_ptr<listener> listen(std::string_view address, int backlog = 64)
    {
        listen_options opts;
        opts.backlog = backlog;
        return listen(address, opts);
    }
    /// Connects, bounded by opts.timeout per step. Throws rdmx::error: connection_refused,
    /// rejected (with the peer's private data), unreachable, timed_out. `initial_recvs`
    /// are posted before the connection is established, as post_recv would post them.
    virtual std::unique_ptr<connection> connect(std::string_view address, const connection_options& opts = {},
                                                std::span<const std::byte> private_data = {},
                                                std::span<const recv_request> initial_recvs = {}) = 0;
    /// Connects without waiting: returns the connection in state `connecting`, which
    /// becomes `established` (event established on opts.events) or `error` (event error:
    /// connection_refused, rejected with the peer's private data in peer_private_data(),
    /// unreachable, timed_out) later, bounded by opts.timeout per step. No thread blocks
    /// for it. Throws only for what fails at once (bad address or options, no room on a
    /// shared queue). Tries the first address a name resolves to. While connecting, post()
    /// returns errc::not_connected; post_recv() works once the QP exists (TCP: at once;
    /// verbs: after route resolution; `initial_recvs` are always in time) and
    /// peer_private_data() is valid once the state left `connecting`.
    virtual std::unique_ptr<connection> start_connect(std::string_view address,
                                                      const connection_options& opts,
                                                      std::span<const std::byte> private_data = {},
                                                      std::span<const recv_request> initial_recvs = {}) = 0;

    /// A completion queue for many connections (rdmx/queues.hpp).
    virtual std::shared_ptr<completion_queue>
    create_completion_queue(const completion_queue_options& opts) = 0;
    /// A receive queue for many connections (rdmx/queues.hpp).
    virtual std::shared_ptr<shared_receive_queue>
    create_shared_receive_queue(const shared_receive_queue_options& opts) = 0;

    virtual ibv_context* native_context() const noexcept { return nullptr; }
    virtual ibv_pd* native_pd() const noexcept { return nullptr; }

    /// register_memory's backend part, with the memory's place resolved: host, or cuda on
    /// CUDA device `device`. Call register_memory.
    virtual std::unique_ptr<memory_region> register_placed(void* addr, std::size_t length,
                                                           rdmx::access rights, rdmx::memory_type type,
                                                           int device) = 0;
    /// allocate_memory's backend part: registers `mem`'s data (host memory); the default
    /// is register_placed's. Call allocate_memory.
    virtual std::unique_ptr<memory_region> register_allocated(detail::shared_memory& mem,
                                                              rdmx::access rights);

protected:
    domain() = default;
};

} // namespace rdmx
