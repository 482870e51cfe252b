// Queues that one server thread shares between many connections: completion queues,
// shared receive queues and the event queue of connection management (libfabric's shared
// CQ, SRX and EQ; UCX's worker wakeup fd). The same semantics on both backends.
//
// Ownership: the domain creates them as shared_ptr; each connection that uses one holds a
// reference through connection_options, so that a queue outlives every
// connection that reports to it, whatever the order the application destroys them in.
// Threading: like a connection's data path, a queue is thread-compatible: the thread that
// polls a shared completion queue also posts on its connections (or the application
// serialises them). An event queue may be polled by any one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>

#include <rdmx/connection.hpp>

struct ibv_cq;
struct ibv_srq;

namespace rdmx
{

/// A completion queue that many connections report to (connection_options::send_cq /
/// recv_cq). Each completion carries the connection it belongs to (`conn`) and the
/// context given to that connection (connection_options::context).
///
/// Overrun is impossible by construction: each connection reserves its queue depth
/// (send_queue_depth + 1 on its send CQ, the one for rdmx's own goodbye before a verbs
/// disconnect; recv_queue_depth on its receive CQ, or, with a shared
/// receive queue, that queue's depth once per CQ) and frees it when destroyed. A connection
/// whose reservation does not fit in depth() - reserved() is refused: connect() and
/// accept() throw errc::no_resources naming the queue.
class completion_queue
{
public:
    virtual ~completion_queue() = default;
    completion_queue(const completion_queue&) = delete;
    completion_queue& operator=(const completion_queue&) = delete;

    virtual rdmx::backend backend() const noexcept = 0;
    /// Entries in effect (the requested depth, clamped to the device's max_cqe).
    virtual std::uint32_t depth() const noexcept = 0;
    /// Entries reserved by the connections using it now.
    virtual std::uint32_t reserved() const noexcept = 0;

    /// Moves up to out.size() completions of any of its connections into `out` (never
    /// allocates). Completions of a connection already destroyed are not returned.
    virtual std::size_t poll(std::span<completion> out) noexcept = 0;

    /// Event mode, as on a connection: arm with request_notify(), poll again, wait for fd()
    /// to become readable, ack_notify() (which consumes every pending notification), poll.
    virtual int fd() const noexcept = 0;
    virtual std::error_code request_notify(bool solicited_only = false) noexcept = 0;
    virtual std::error_code ack_notify() noexcept = 0;
    /// Polls; if nothing is there, arms, re-polls, and sleeps on fd() up to `timeout`.
    std::size_t wait(std::span<completion> out, std::chrono::milliseconds timeout) noexcept;

    /// verbs: the ibv_cq; nullptr on TCP.
    virtual ibv_cq* native() const noexcept { return nullptr; }

protected:
    completion_queue() = default;
};

struct completion_queue_options {
    std::uint32_t depth = 4096;
};

/// Kinds of events an event_queue delivers.
enum class event_type : std::uint8_t {
    established,       ///< a connection started with start_connect / start_accept is up
    disconnected,      ///< the connection ended cleanly (`by_peer`: the peer disconnected)
    error,             ///< the connection failed or could not be set up; `cause` says why
    srq_limit_reached, ///< a shared receive queue fell below its armed limit (see arm_limit)
};
const char* to_string(event_type t) noexcept;

/// One event. The pointers name live objects: destroying a connection or shared receive
/// queue removes its events that were not polled yet.
struct event {
    event_type type = event_type::error;
    std::uint64_t context = 0; ///< the context of the connection or queue
    rdmx::connection* conn = nullptr;
    rdmx::shared_receive_queue* srq = nullptr;
    /// error: the cause (connection_refused, rejected, unreachable, timed_out for a start
    /// that failed; transport_retry_exceeded, remote_access, ... for an established
    /// connection; peer_lost for an rdmx peer that vanished without disconnecting: its
    /// process died. Both backends tell it from a clean disconnect by a goodbye each side
    /// sends before it disconnects, TCP in a frame, verbs as an RDMA write).
    /// disconnected: errc::disconnected.
    std::error_code cause;
    bool by_peer = false; ///< disconnected: the peer disconnected (false: this side did)
};

/// Connection-management events of many connections, and the low-watermark
/// events of shared receive queues, behind one file descriptor that is readable while an
/// event is queued (level-triggered), so that a server waits on it with its completion
/// queues in one epoll set or io_context. Not tied to a domain or backend.
class event_queue
{
public:
    static std::shared_ptr<event_queue> create();

    virtual ~event_queue() = default;
    event_queue(const event_queue&) = delete;
    event_queue& operator=(const event_queue&) = delete;

    /// Moves up to out.size() queued events into `out`, oldest first; never blocks.
    virtual std::size_t poll(std::span<event> out) noexcept = 0;
    /// Readable while at least one event is queued.
    virtual int fd() const noexcept = 0;
    /// Polls; if nothing is queued, sleeps on fd() up to `timeout`.
    std::size_t wait(std::span<event> out, std::chrono::milliseconds timeout) noexcept;

protected:
    event_queue() = default;
};

/// A receive queue that many connections consume from (connection_options::srq). Receive
/// completions arrive on each connection's receive completion queue, naming the connection;
/// the wr_id is the one given here. A connection on a shared receive queue has no receive
/// queue of its own: its post_recv() fails with errc::invalid_argument.
///
/// Receiver not ready: when a send (or write with immediate) finds the queue empty, the
/// receiver answers receiver-not-ready and the sender retries per its own rnr_retry_count
/// (and the min_rnr_timer, as connection_options describes it), the same on both
/// backends; with 7 (the default: forever) a sender only waits until the server refills.
/// Arm the limit to refill in time. iWARP has no receiver-not-ready: there a send that
/// finds the queue empty ends its connection.
class shared_receive_queue
{
public:
    virtual ~shared_receive_queue() = default;
    shared_receive_queue(const shared_receive_queue&) = delete;
    shared_receive_queue& operator=(const shared_receive_queue&) = delete;

    virtual rdmx::backend backend() const noexcept = 0;
    virtual std::uint32_t depth() const noexcept = 0;
    virtual std::uint32_t max_sge() const noexcept = 0;

    /// Posts receives; as connection::post_recv (validation first, would_block when
    /// depth() receives are outstanding, `*posted` exact). A receive stays outstanding
    /// until its completion is polled from a completion queue.
    virtual std::error_code post_recv(std::span<const recv_request> wrs,
                                      std::size_t* posted = nullptr) noexcept = 0;
    std::error_code post_recv(std::span<const sge> local, std::uint64_t wr_id) noexcept
    {
        recv_request wr{.wr_id = wr_id, .local = local};
        return post_recv({&wr, 1});
    }

    /// Arms the low watermark (verbs: ibv_modify_srq with IBV_SRQ_LIMIT): when fewer than
    /// `limit` posted receives remain unconsumed, one srq_limit_reached event goes to the
    /// event queue given at creation, and the limit disarms (arm again after refilling).
    /// As on the devices, it is checked as a message consumes a receive, not when arming.
    /// Fails with errc::invalid_argument without an event queue, or for a limit of 0 or
    /// above depth().
    virtual std::error_code arm_limit(std::uint32_t limit) noexcept = 0;

    /// verbs: the ibv_srq; nullptr on TCP.
    virtual ibv_srq* native() const noexcept { return nullptr; }

protected:
    shared_receive_queue() = default;
};

struct shared_receive_queue_options {
    std::uint32_t depth = 1024;
    std::uint32_t max_sge = 4;
    std::shared_ptr<rdmx::event_queue> events; ///< receives srq_limit_reached
    std::uint64_t context = 0;                 ///< the `context` of its events
};

} // namespace rdmx
