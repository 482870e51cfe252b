// The engine of one TCP "queue pair": send, receive and completion rings plus the transmit
// and receive state machines that give a byte stream the semantics of a verbs RC connection.
// Its methods are defined one concern per file (see each declaration group below).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "connection_events.hpp"
#include "cq_reservation.hpp"
#include "tcp/tcp_cma_peer.hpp"
#include "tcp/tcp_completion.hpp"
#include "tcp/tcp_completion_queue.hpp"
#include "tcp/tcp_connector.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_engine_work.hpp"
#include "tcp/tcp_handler_memory.hpp"
#include "tcp/tcp_link.hpp"
#include "tcp/tcp_poll_ownership.hpp"
#include "tcp/tcp_queue_membership.hpp"
#include "tcp/tcp_recv_queue.hpp"
#include "tcp/tcp_reliability.hpp"
#include "tcp/tcp_response_queue.hpp"
#include "tcp/tcp_ring.hpp"
#include "tcp/tcp_rx_frame.hpp"
#include "tcp/tcp_send_queue.hpp"
#include "tcp/tcp_shared_map.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_srq.hpp"
#include "tcp/tcp_srq_claim.hpp"
#include "tcp/tcp_target.hpp"
#include "tcp/tcp_thread_safety.hpp"
#include "tcp/tcp_transmit_gate.hpp"
#include "tcp/tcp_tx_frame.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{

/// The initiator's completion status for a NAK the peer sent (or this side sends).
std::error_code nak_status(nak_code c) noexcept;

/// One connection's engine: everything its handlers touch. Shared between the connection
/// object and the handlers in flight, so that destroying the connection never leaves a
/// handler dangling. Each member says what guards it (mu_, or the engine thread's role for
/// the asio descriptor and the engine's own timers), and each method which thread may call
/// it (tcp_thread_safety.hpp): the clang build checks both.

/// Process-wide counts of the CMA path (shm://), for tests and statistics: CMA requests
/// that this process sent and that completed successfully, and refusals it received
/// (NAK CMA_REFUSED: a peer that cannot reach this process's memory).
std::uint64_t cma_requests_completed() noexcept;
std::uint64_t cma_refusals() noexcept;
void note_cma_completed() noexcept; ///< one more for cma_requests_completed()

class connection_engine : public std::enable_shared_from_this<connection_engine>
{
public:
    /// `shared`: the room this connection took on the shared completion queues of `opts`
    /// (taken before connecting, so that a connection without room is refused before the
    /// peer hears of it).
    connection_engine(tcp_domain& dom, unique_fd fd, const connection_limits& lim,
                      const connection_options& opts, std::uint32_t peer_max_rd,
                      detail::cq_reservation shared);
    ~connection_engine();
    connection_engine(const connection_engine&) = delete;
    connection_engine& operator=(const connection_engine&) = delete;

    /// Starts receiving on the engine. Called once, after construction.
    void start() RDMX_EXCLUDES(mu_);
    /// Never reused: what a window bound through this connection records (`via`).
    std::uint64_t id() const noexcept { return id_; }
    /// Reports this connection's state changes to `q` (connection_events.hpp) as `conn`.
    /// Before start() or start_client().
    void bind_events(std::shared_ptr<event_queue> q, connection* conn, std::uint64_t context,
                     bool started) noexcept RDMX_EXCLUDES(mu_);
    /// The private data of the peer's reply. Set before the state leaves `connecting` and
    /// unchanged afterwards.
    std::span<const std::byte> peer_private_data() const noexcept
    {
        return state() == connection_state::connecting ? std::span<const std::byte>{} : peer_pdata_;
    }
    void set_peer_private_data(std::vector<std::byte> d) noexcept { peer_pdata_ = std::move(d); }
    /// The peer's handshake carried handshake_flag_goodbye: it ends connections with a
    /// GOODBYE frame, so EOF without one means errc::peer_lost. Before start().
    void set_peer_says_goodbye(bool yes) noexcept RDMX_EXCLUDES(mu_)
    {
        engine_lock lk(mu_);
        goodbye_ = yes ? goodbye::promised : goodbye::not_promised;
    }

    /// shm:// listener: the connection's frames go through `rings`; `memfd` goes to the
    /// client with the ACCEPT. Before start_server().
    void use_rings(std::unique_ptr<byte_ring_pair> rings, unique_fd memfd) noexcept RDMX_EXCLUDES(mu_);
    /// Frames go through shared-memory rings (shm://, tcp_ring.hpp), not the socket.
    bool uses_rings() noexcept RDMX_EXCLUDES(mu_)
    {
        engine_lock lk(mu_);
        return link_.uses_rings();
    }

    // --- start_connect (tcp_handshake.cpp): the handshake on the engine thread, its steps
    // those of a connector (tcp_connector.hpp) ---
    using dial_plan = connector::dial_plan;
    /// The socket's connect() is in progress: in state `connecting`, waits for it on the
    /// engine (the next address of `rest` while it fails), sends `hello`, reads the reply,
    /// and becomes established (and starts as start() does) or error (connection_refused,
    /// unreachable, rejected with the reply's private data, protocol_error, timed_out at
    /// `deadline`; await_handshake's error says what happened). `connect_err`: connect()
    /// failed at once with that errno. Called once instead of start().
    void start_client(std::span<const std::byte> hello, clock::time_point deadline, int connect_err,
                      dial_plan rest) RDMX_EXCLUDES(mu_);
    /// What a blocking connect() and accept() wait for: until start_client's or
    /// start_server's handshake ends, or `bound` passes. Returns if it succeeded, even if
    /// the connection ended since (a peer that disconnected at once: the caller gets it,
    /// and its state says so). Otherwise throws rdmx::error "<what> <address>: <why>" (no
    /// address where it is empty; the text is built only then) with the cause
    /// the engine recorded ("connect(): Connection refused", "rejected by the listener",
    /// ...; timed_out if it did not end) and a reject's private data.
    void await_handshake(std::string_view what, std::string_view address, clock::time_point bound)
        RDMX_EXCLUDES(mu_);
    /// start_accept: in state `connecting`, sends the ACCEPT `reply` on the engine and then
    /// becomes established (or error: the client left, timed_out). Instead of start().
    void start_server(std::span<const std::byte> reply, clock::time_point deadline) RDMX_EXCLUDES(mu_);

    connection_state state() const noexcept { return state_.load(std::memory_order_acquire); }
    std::error_code last_error() noexcept RDMX_EXCLUDES(mu_)
    {
        engine_lock lk(mu_);
        return cause_;
    }
    const connection_limits& limits() const noexcept { return lim_; }
    /// The eventfd of its own completions; -1 when both sides report to shared queues.
    int event_fd() const noexcept { return send_cq_ && recv_cq_ ? -1 : efd_.get(); }
    /// Over a UNIX socket (shm://, or auto:// to a listener on this host): backend::shm.
    bool local() const noexcept { return local_.load(std::memory_order_acquire); }
    /// The connection object the application holds, named in each completion. Set once,
    /// before the engine starts.
    void set_owner(connection* c) noexcept RDMX_EXCLUDES(mu_)
    {
        engine_lock lk(mu_);
        conn_ = c;
    }
    // The application's calls (tcp_post.cpp): any application thread. Each takes mu_
    // itself, so no engine code (which holds it) may call them.
    std::error_code post(std::span<const work_request> wrs, std::size_t* posted) noexcept RDMX_EXCLUDES(mu_);
    std::error_code post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept
        RDMX_EXCLUDES(mu_);
    std::size_t poll(std::span<completion> out) noexcept RDMX_EXCLUDES(mu_);
    /// poll() of this connection's own completions alone, without the domain's progress,
    /// begun at `now`; `end`: when it ended (poll_ownership::call_end).
    std::size_t poll_own(std::span<completion> out, clock::time_point now, clock::time_point& end) noexcept
        RDMX_EXCLUDES(mu_);
    std::error_code request_notify(bool solicited_only) noexcept RDMX_EXCLUDES(mu_);
    /// Any thread, no lock: it only drains the eventfd.
    std::error_code ack_notify() noexcept;
    void disconnect() noexcept RDMX_EXCLUDES(mu_);
    /// The connection object is going away: disconnect and let the engine close the socket.
    void close() noexcept RDMX_EXCLUDES(mu_);
    /// tcp_domain::deregister(), on its thread, after revoking the region (`st`, whose live
    /// tag was `tag`) and while its memory is still the caller's: if the rest of the frame
    /// on the wire reads it, copies that rest (cur_.keep_copy), from which the frame
    /// finishes (tcp_transmit.cpp). Allocates (this is no data path); without memory the
    /// stream ends inside the frame instead.
    void copy_frame_on_wire(const region_state* st, std::uint64_t tag) noexcept RDMX_EXCLUDES(mu_);

    // --- progress by the polls of its domain's queues (tcp_queue_progress.cpp) ---
    /// Joins the progress of its shared completion queues' domain (connection set-up;
    /// throws).
    void attach_queues();
    /// Before close(): leaves it, so that no poll progresses this engine again.
    void detach_queues() noexcept RDMX_EXCLUDES(mu_);
    /// A run of the domain's progress `p` (a poll of one of its queues) found the socket
    /// readable or the rings holding bytes, or ran this engine from its pending list
    /// (mark_pending; the caller's thread, `p`'s registration lock held): reads what came
    /// and sends what it owes. `queue_busy`: the previous run found data on some socket or
    /// ring (an ACK may wait a little longer). `now`: when the visit began (the poll's clock
    /// read, or the run's since); returns when it ended (poll_ownership::call_end).
    clock::time_point queue_progress(domain_progress& p, queue_visit why, bool queue_busy,
                                     clock::time_point now) noexcept RDMX_EXCLUDES(mu_);
    /// Whether its rings hold bytes it has not read (shm://, once they are in use and while
    /// the domain's polls read it): a hint, without the lock (domain_progress::run).
    bool ring_has_data() const noexcept
    {
        const byte_ring_pair* r = ring_peek_.load(std::memory_order_acquire);
        return r && r->rx_maybe_data();
    }
    /// A side of it reports to `q` (no lock: fixed at construction).
    bool reports_to(const tcp_completion_queue& q) const noexcept { return send_cq_ == &q || recv_cq_ == &q; }
    /// The engine stood down for a shared queue's poller (any thread, no lock).
    bool left_to_queue() const noexcept { return left_to_queue_.load(std::memory_order_seq_cst); }
    /// That poller is about to sleep on the queue's fd: the engine takes the socket back.
    void queue_sleeps() noexcept RDMX_EXCLUDES(mu_);
    /// A poller of the domain of `p` is about to sleep on a queue's fd and the sockets
    /// (request_notify_watching) and ran this engine from `p`'s pending list, its rings or
    /// its readable socket: staged frames are read and what is owed leaves now, nothing held
    /// back for a poll; a reader of rings raises its wake flag (the caller's thread, `p`'s
    /// registration lock held).
    void queue_flush(domain_progress& p, queue_visit why) noexcept RDMX_EXCLUDES(mu_);

private:
    // Fixed batch sizes of one sendmsg / recvmsg (tcp_tx_frame.hpp); a frame that does not
    // fit continues in the next call.
    static constexpr int max_iov = tx_batch::max_iov;
    static constexpr int max_batch_frames = tx_batch::max_frames;
    // Receive steps (frames, or reads) per run before yielding to other connections.
    static constexpr int rx_budget = 64;
    // Bytes one pump may send from the application thread / from the engine thread.
    static constexpr std::uint64_t app_tx_budget = 1u << 20;
    static constexpr std::uint64_t engine_tx_budget = 4u << 20;
    // (Receive ownership and the busy-poll heuristics: poll_ownership, tcp_poll_ownership.hpp.)

    /// A chunk that payload bound for staged memory is received into (tcp_staging.hpp),
    /// and the copies from it to their places still running.
    struct rx_chunk {
        std::byte* p = nullptr;
        copy_batch copy;
        region_state* pins[copy_batch::max_copies]; ///< the destinations, pinned till copied
        int npins = 0;
    };
    enum class rx_status : std::uint8_t { again, wait, stop };

    // Annotations (tcp_thread_safety.hpp): RDMX_REQUIRES(mu_) runs on any thread that holds
    // the lock; RDMX_REQUIRES(mu_, engine_thread_) on the engine thread only.

    /// The engine thread's claim, in a handler that asio runs: checked at run time, and
    /// from here on the analysis knows this thread has the engine's role.
    void assert_on_engine() const noexcept RDMX_ASSERT_CAPABILITY(engine_thread_);
    bool on_engine() const noexcept;

    // --- rings (any thread, mu_ held) ---
    /// Whether a receive is there for the peer's next send or write with immediate: the
    /// head of this connection's queue, or one taken from its shared receive queue (kept
    /// until it completes). False: receiver not ready.
    bool recv_ready() noexcept RDMX_REQUIRES(mu_) { return srq_.shared() ? srq_.ready() : !rq_.empty(); }
    /// The receive recv_ready() found, and its SGEs.
    recv_queue::entry& recv_head() noexcept RDMX_REQUIRES(mu_)
    {
        return srq_.shared() ? srq_.head() : rq_.front();
    }
    seg* recv_head_segs() noexcept RDMX_REQUIRES(mu_)
    {
        return srq_.shared() ? srq_.segs() : rq_.front_segs();
    }

    // --- the application's calls' helpers (tcp_post.cpp; application thread, mu_ held) ---
    /// A bind_window or invalidate_window (validated): carried out in the domain's table at
    /// once, so that the key works (or stops) for whatever is sent after it, and completed
    /// in send-queue order (send_queue::push_local). Only getrandom can fail it.
    std::error_code post_local(const work_request& wr) noexcept RDMX_REQUIRES(mu_);
    /// post() / post_recv()'s common start: checks every request, and on a connection that
    /// left `established` completes them all as flushed. A value is what the call returns;
    /// nullopt: the caller queues the requests.
    template <class Request, class Check>
    std::optional<std::error_code> validate_or_flush(cq_side side, std::span<const Request> wrs,
                                                     std::size_t* posted, Check check) noexcept
        RDMX_REQUIRES(mu_);

    // --- completions and the flush (tcp_completion.cpp; any thread, mu_ held) ---
    /// Completes `c` of `side`: into the connection's own ring, or into the shared queue
    /// of that side. `from_srq`: a receive taken from the shared receive queue, whose slot
    /// there is freed when this completion is polled (or dropped).
    void push_cq(cq_side side, completion c, bool solicited = false, bool from_srq = false) noexcept
        RDMX_REQUIRES(mu_);
    void push_shared(tcp_completion_queue& q, cq_side side, const completion& c, bool solicited,
                     bool from_srq) noexcept RDMX_REQUIRES(mu_);
    /// Requests of `side` that may still complete without overrunning its queue: on a
    /// shared queue, its slots that neither a queued request nor an unpolled completion
    /// holds; unbounded on the own ring (which holds both depths).
    std::uint64_t shared_room(cq_side side) const noexcept RDMX_REQUIRES(mu_);
    /// Its queues' completions that wait, unpolled, on a shared queue (0 for the own ring).
    std::uint32_t held_in_cq(cq_side side) const noexcept { return slots_.held(side); }
    void complete_sq_head(std::error_code status, std::uint32_t byte_len) noexcept RDMX_REQUIRES(mu_);
    /// Completes the binds and invalidations whose turn came (send_queue::pop_local_due);
    /// `status` flushed: all those due, as flushed.
    void complete_local(std::error_code status = {}) noexcept RDMX_REQUIRES(mu_);
    void complete_rq_head(const completion& c, bool solicited) noexcept RDMX_REQUIRES(mu_);
    /// Leaves `established` for `to`; `cause` (default: errc::disconnected or, for error,
    /// errc::completion_error) is what last_error() reports.
    void fail(connection_state to, std::error_code cause = {}) noexcept RDMX_REQUIRES(mu_);

    // --- transmit (tcp_transmit.cpp; any thread, mu_ held) ---
    void pump() noexcept RDMX_REQUIRES(mu_);
    void add_frame(tx_batch& b, frame_kind kind, std::uint64_t pos, std::uint64_t skip) noexcept
        RDMX_REQUIRES(mu_);
    /// add_frame, whole or not at all: false if its memory was deregistered (then the batch
    /// is as before).
    bool add_whole_frame(tx_batch& b, frame_kind kind, std::uint64_t pos, std::uint64_t skip) noexcept
        RDMX_REQUIRES(mu_);
    void advance(tx_batch& b, std::uint64_t sent) noexcept RDMX_REQUIRES(mu_);
    /// Staged memory [src, src + n) of `st` (pinned by the caller) for the batch: where a
    /// chunk holds its first `n` bytes (n shrinks where a chunk ends first). Null with
    /// b.closed when no chunk has room left, with b.stage_failed when no chunk or copy
    /// could be had.
    std::byte* stage_tx(tx_batch& b, region_state* st, std::uint64_t tag, const std::byte* src,
                        std::uint64_t& n) noexcept RDMX_REQUIRES(mu_);
    /// Starts copying what follows the batch's cut (if any) into a chunk it does not use.
    void prefetch_tx(tx_batch& b) noexcept RDMX_REQUIRES(mu_);
    /// Waits for `c`'s copy in flight (unpinning its region); false if it failed.
    bool settle(tx_chunk& c) noexcept RDMX_REQUIRES(mu_);
    /// The memory a frame's payload comes from, in order (empty: no payload).
    std::span<const seg> payload_segs(frame_kind kind, std::uint64_t pos) noexcept RDMX_REQUIRES(mu_);
    /// Continues transmitting on the engine: `would_block` after EAGAIN, else after the
    /// budget ran out or on the application thread.
    void arm_write(bool would_block) noexcept RDMX_REQUIRES(mu_);
    void maybe_shutdown() noexcept RDMX_REQUIRES(mu_);
    /// A frame could not be added because its memory was deregistered: `kind` and `pos`
    /// name one not started yet, frame_kind::none the frame on the wire (cur_) when its
    /// rest could not be copied (copy_frame_on_wire).
    void revoked_frame(frame_kind kind, std::uint64_t pos) noexcept RDMX_REQUIRES(mu_);

    // --- the byte stream (link_, tcp_link.hpp): the socket, or the rings with the socket
    // as their doorbell ---
    /// link_.recv for whoever reads now (rx_waiter); doorbells go to app_discard_, which
    /// whoever holds mu_ may use.
    ssize_t link_recv(const iovec* iov, int n) noexcept RDMX_REQUIRES(mu_)
    {
        return link_.recv(iov, n, rx_waiter(), app_discard_);
    }
    /// How a reader that finds the rings empty waits. The engine sleeps on the socket once
    /// the ring is empty (and so does an application that reads while the engine's wait is
    /// armed). An application that the engine stood down for polls the rings itself and is
    /// never woken: its peer need not ring. Nor while a shared queue's poller polls (each
    /// run of the domain's progress looks at the rings); once it arms a notification it may
    /// sleep: armed to watch the sockets, its flush() raises the flag (through link_.recv)
    /// before the sleep; a plain arming gives the socket back to the engine, which raises it
    /// (arm_read).
    link_waiter rx_waiter() const noexcept RDMX_REQUIRES(mu_)
    {
        if (!ownership_.app_owns())
            return link_waiter::sleeps;
        return on_shared_cq_ && queues_armed_either_way() ? link_waiter::sleeps_flag_kept
                                                          : link_waiter::polls;
    }
    /// Where the reader now discards a stream's rest (rx_drain): the domain's buffer on the
    /// engine thread, the engine's own on an application's.
    std::span<std::byte> rx_sink() noexcept RDMX_REQUIRES(mu_);
    /// The send ring is full: pump() again shortly (rings only; the engine's thread;
    /// tcp_transmit.cpp).
    void wait_ring_space() noexcept RDMX_REQUIRES(mu_, engine_thread_);

    // --- receive framing (tcp_receive.cpp) ---
    // Waiting for the socket is the engine's; reading frames is any thread's under mu_ (the
    // engine's rx_run, or a polling application's rx_read).
    void arm_read() noexcept RDMX_REQUIRES(mu_, engine_thread_);
    void rx_run() noexcept RDMX_REQUIRES(mu_, engine_thread_);
    /// The one loop of both readers: up to rx_budget steps of framing while established;
    /// once the connection left it, the rest of the stream is drained (`drain`, the
    /// engine) or left (an application's read) and never interpreted. The last step's
    /// status; `again` when the budget ran out.
    rx_status rx_steps(bool drain) noexcept RDMX_REQUIRES(mu_);
    rx_status rx_drain() noexcept RDMX_REQUIRES(mu_);
    /// Finishes the copies from the receive chunks to staged memory (a failed one faults
    /// the frame); with `release`, gives the chunks back too (the end of a read run).
    void settle_rx(bool release) noexcept RDMX_REQUIRES(mu_);
    /// Finishes `c`'s copies and unpins their destinations (a failed copy faults the frame).
    void settle(rx_chunk& c) noexcept RDMX_REQUIRES(mu_);
    rx_status rx_step() noexcept RDMX_REQUIRES(mu_);
    rx_status rx_payload() noexcept RDMX_REQUIRES(mu_);
    rx_status rx_staged_payload() noexcept RDMX_REQUIRES(mu_);
    std::size_t staged() const noexcept RDMX_REQUIRES(mu_) { return stage_.staged(); }
    /// Staged bytes that can be processed without reading: a whole header, or payload.
    bool staged_work() const noexcept RDMX_REQUIRES(mu_) { return tcp::staged_work(stage_, rx_); }
    void continue_rx() noexcept
        RDMX_REQUIRES(mu_); ///< the engine goes on with staged frames (no socket event will come)
    void resume_rx() noexcept
        RDMX_REQUIRES(mu_); ///< a response went out after a stall: the engine reads again
    rx_status rx_error(ssize_t n, int err) noexcept RDMX_REQUIRES(mu_);
    void begin_frame(const frame_header& h) noexcept RDMX_REQUIRES(mu_);
    // The engine's read wait in the middle of a large payload wakes at a mark
    // (stream_link::wake_mark_for). Whichever thread reads while that wait is armed lowers
    // the mark with what it consumed (keep_rcvlowat_reachable): it never exceeds the
    // payload bytes still to come.
    /// The payload bytes of the frame being received still to come from the socket (0
    /// between frames, or once the connection left `established`).
    std::uint64_t rx_to_come() const noexcept RDMX_REQUIRES(mu_);
    /// After a read: an armed wait's mark <= what is to come. Otherwise, if the application
    /// then sleeps (request_notify), the rest of the payload and the frames after it lie
    /// below the mark, no wake comes, and the peer's requests wait until it declares us dead.
    void keep_rcvlowat_reachable() noexcept RDMX_REQUIRES(mu_)
    {
        if (work_.outstanding(engine_work::kind::read_wait) && link_.wake_mark() > 1)
            link_.keep_wake_mark_reachable(rx_to_come());
    }

    // --- the one-sided target service (tcp_target.cpp; any thread, mu_ held) ---
    void begin_request(const frame_header& h) noexcept RDMX_REQUIRES(mu_); ///< the peer's request arrived

    // --- cross-memory attach, shm:// only (tcp_cma.cpp; any thread, mu_ held) ---
    /// Payloads from this size on go by CMA where the peer can reach this process. Below
    /// it the socket is as fast or faster (16 KiB: CMA 0.8x; 32 KiB: 1.2-3x; bench/results/
    /// 2026-12-06-shm-cma.txt).
    static constexpr std::uint64_t cma_min_bytes = 32 * 1024;
    /// The same through rings, which copy twice but cache-hot and without a system call:
    /// writes and reads from 64 KiB on, sends from 128 KiB on (bench/results/
    /// 2026-12-06-shm-ring.txt).
    static constexpr std::uint64_t cma_min_bytes_ring = 64 * 1024;
    static constexpr std::uint64_t cma_min_send_bytes_ring = 128 * 1024;
    /// False if RDMX_SHM_CMA is "off" or "0" (read once).
    static bool cma_allowed() noexcept;
    /// Whether request `pos` (not sent yet) goes as a CMA request: sets its via_cma and,
    /// if so, writes its descriptors. False with `revoked` if its memory was deregistered.
    bool choose_cma(std::uint64_t pos, bool& revoked) noexcept RDMX_REQUIRES(mu_);
    /// The peer's CMA request whose descriptors are in (rx_.cma): checked against our
    /// registration exactly as write/read, then the data moved by process_vm_readv /
    /// process_vm_writev, and answered (ACK, READ_CMA_RESP, or a NAK).
    void serve_cma(const frame_header& h) noexcept RDMX_REQUIRES(mu_);
    /// The kernel refused CMA to the peer (`err`): NAK CMA_REFUSED for `h`, the requests
    /// behind it dropped until it comes again (as after an RNR NAK), logged.
    void refuse_cma(const frame_header& h, int err) noexcept RDMX_REQUIRES(mu_);
    /// process_vm_readv of the `total` bytes of `remote` into the receive's `segs` (staged
    /// ones through a host chunk): 0, -1 if a seg's region was deregistered, or the errno.
    int cma_into_receive(pid_t pid, const seg* segs, std::uint32_t nseg, const iovec* remote,
                         unsigned long count, std::uint64_t total) noexcept RDMX_REQUIRES(mu_);
    /// serve_cma's SEND_CMA: the `total` bytes of the initiator's `remote` ranges into the
    /// posted receive (as a send frame's payload would land), then its completion and ACK.
    void serve_cma_send(const frame_header& h, const iovec* remote, unsigned long count,
                        std::uint64_t total) noexcept RDMX_REQUIRES(mu_);
    /// The peer's process, for CMA: its pid (SO_PEERCRED) while a pidfd says that it has
    /// not exited (so that the pid names it, not a later process); 0 otherwise.
    pid_t cma_peer_pid() noexcept RDMX_REQUIRES(mu_)
    {
        return cma_.pid(fd_, [this](pid_t pid) { return dom_.peer_process(pid); });
    }
    /// The connection is set up on its final socket: whether it is a UNIX one (local_:
    /// shm://, or auto:// to a listener on this host), and for one the peer's process
    /// (cma_peer_pid) and whether to send CMA requests; an auto:// client says which it took.
    void settle_transport() noexcept RDMX_REQUIRES(mu_);
    /// READ_CMA_RESP for the read at the head: complete it.
    void finish_read_cma(const frame_header& h) noexcept RDMX_REQUIRES(mu_);
    /// False if RDMX_SHM_MAP is "off" or "0" (read once): peers' allocated regions are then
    /// never mapped (for comparison runs).
    static bool map_allowed() noexcept;
    /// A write or read `wr` (checked) into a peer's allocated region, made by this side's own
    /// copy into its mapping (tcp_shared_map.hpp) and completed at once: true if so. Only
    /// on a local connection with nothing of its send queue outstanding (so that it is
    /// ordered after everything posted before it, and its completion too); false, nothing
    /// done, where the usual way must take it (any doubt: the target then checks and answers).
    /// `now`: post()'s clock reading.
    bool post_mapped(const work_request& wr, clock::time_point now) noexcept RDMX_REQUIRES(mu_);
    /// NAK CMA_REFUSED of the head: no CMA request again; the head and what follows go again.
    void on_cma_refused(std::uint64_t seq) noexcept RDMX_REQUIRES(mu_);
    void finish_frame() noexcept RDMX_REQUIRES(mu_); ///< its payload is in: carry it out
    void push_ack(std::uint64_t seq) noexcept RDMX_REQUIRES(mu_);
    void push_response(const response& r) noexcept RDMX_REQUIRES(mu_);
    void target_fail(nak_code code, std::uint64_t seq) noexcept RDMX_REQUIRES(mu_);
    /// Carries out the atomic request `h` (operands in rx_.operands) on the target memory
    /// and returns the old value; nullopt: bad key, bounds, rights or alignment, or the
    /// region went (NAK REMOTE_ACCESS, target untouched).
    std::optional<std::uint64_t> execute_atomic(const frame_header& h) noexcept RDMX_REQUIRES(mu_);
    /// The old value of the atomic at the head (in rx_.operands) arrived: into its SGE.
    void finish_atomic_response() noexcept RDMX_REQUIRES(mu_);

    // --- reliability (tcp_reliability.cpp; any thread, mu_ held) ---
    void begin_response(const frame_header& h) noexcept RDMX_REQUIRES(mu_); ///< a response to our request
    void on_ack(std::uint64_t seq) noexcept RDMX_REQUIRES(mu_);
    void on_nak(std::uint64_t seq, nak_code code) noexcept RDMX_REQUIRES(mu_);
    void protocol_violation(const char* why, bool blame_head) noexcept RDMX_REQUIRES(mu_);
    void peer_gone() noexcept RDMX_REQUIRES(mu_);
    /// An RNR wait that is over at `now`: the retry goes now, on the caller's thread (a poll),
    /// without waiting for the engine's timer, whose thread may be kept off the CPU by busy
    /// pollers for milliseconds (docs/performance.md, "An RNR retry left to the engine").
    void retry_rnr_if_due(clock::time_point now) noexcept RDMX_REQUIRES(mu_)
    {
        if (rnr_.due(now)) {
            rnr_.waited();
            pump();
        }
    }
    // --- liveness (tcp_reliability.cpp; engine thread) ---
    void arm_progress_check() noexcept RDMX_REQUIRES(mu_, engine_thread_);
    void check_progress() noexcept RDMX_REQUIRES(mu_, engine_thread_);

    // --- busy-poll ownership (tcp_busy_poll.cpp) ---
    bool rx_poll() noexcept RDMX_REQUIRES(mu_); ///< application thread, from poll(); true if it ran pump()
    bool rx_read() noexcept RDMX_REQUIRES(mu_); ///< rx_poll without the sending; false if it could not read
    bool app_may_read() const noexcept RDMX_REQUIRES(mu_);
    bool app_keeps_tx() noexcept RDMX_REQUIRES(mu_);  ///< transmission left to the busy application?
    bool coalesce_post() noexcept RDMX_REQUIRES(mu_); ///< leave this post()'s requests for the next call?
    bool only_acks_owed() const noexcept RDMX_REQUIRES(mu_);
    void arm_tx_check() noexcept RDMX_REQUIRES(mu_);
    bool app_took_data(bool app_in_call) noexcept
        RDMX_REQUIRES(mu_, engine_thread_); ///< on a read wake: stand down?
    /// Leaves the socket to the polling application; false: a shared queue's poller went to
    /// sleep meanwhile, and the engine reads on.
    bool stand_down() noexcept RDMX_REQUIRES(mu_, engine_thread_);
    /// Posts reclaim_rx() to the engine (once): the application is about to sleep.
    void post_reclaim() noexcept RDMX_REQUIRES(mu_);
    // The shared queues' part (tcp_queue_progress.cpp).
    /// The polls of their domains' queues since the previous look count as the
    /// application's (poll_ownership).
    void sync_queue_polls() noexcept RDMX_REQUIRES(mu_);
    /// The distinct shared queues of its sides (null where a side has none, or shares the
    /// send side's): each once, for what is done per queue.
    std::array<tcp_completion_queue*, 2> shared_queues() const noexcept
    {
        return {send_cq_, recv_cq_ != send_cq_ ? recv_cq_ : nullptr};
    }
    /// The distinct progresses of those queues' domains (the second null unless the two
    /// queues come from two domains): each once, for what is done per set of sockets.
    std::array<domain_progress*, 2> progresses() const noexcept
    {
        domain_progress* s = send_cq_ ? &send_cq_->progress() : nullptr;
        domain_progress* r = recv_cq_ ? &recv_cq_->progress() : nullptr;
        if (!s)
            return {r, nullptr};
        return {s, r != s ? r : nullptr};
    }
    /// `p`'s run took this engine from its pending list: it may be marked there again.
    void unmark(const domain_progress& p) noexcept RDMX_REQUIRES(mu_)
    {
        membership_.unmark(&p == progresses()[0] ? 0 : 1);
    }
    /// A notification armed on one of them: its poller is going to sleep.
    bool queues_armed() const noexcept RDMX_REQUIRES(mu_);
    /// A shared queue of its sides is armed for a sleeper that watches its sockets too.
    bool queues_watched() const noexcept RDMX_REQUIRES(mu_);
    /// queues_armed() || queues_watched(), one look per queue.
    bool queues_armed_either_way() const noexcept RDMX_REQUIRES(mu_);
    /// Whether `pred` holds for one of its shared queues (none once detached).
    template <class Pred> bool any_shared_queue(Pred pred) const noexcept RDMX_REQUIRES(mu_)
    {
        if (!on_shared_cq_ || detached_)
            return false;
        for (tcp_completion_queue* q : shared_queues())
            if (q && pred(*q))
                return true;
        return false;
    }
    /// Instead of waiting for data, leave the socket to that sleeper (arm_read)?
    bool sleeper_takes_over() noexcept RDMX_REQUIRES(mu_, engine_thread_);
    /// An application thread is in (or just out of) a poll of a queue of their domains
    /// (poll_activity).
    bool queues_polling(std::chrono::steady_clock::time_point now) const noexcept RDMX_REQUIRES(mu_);
    /// The socket stops being read for good, or closes: out of the progress sets (once).
    void unwatch_queues() noexcept RDMX_REQUIRES(mu_);
    /// Reading stalled (rx_state::stalled): out of the progress sets until
    /// resume_queue_watch(), so that a socket nobody may read does not keep the polls and
    /// sleepers waking.
    void pause_queue_watch() noexcept RDMX_REQUIRES(mu_);
    /// The stall is over: back in the sets (epoll reports what waits). If a set refuses
    /// it, the connection fails: its queues' pollers could not see it any more.
    void resume_queue_watch() noexcept RDMX_REQUIRES(mu_);
    /// Puts this engine on its domain's pending list (mark_pending; once until a run took
    /// it from there), so that the next poll of a queue of the domain progresses it without
    /// a readable socket: frames a read left staged, requests post() held back. False, and
    /// the caller does without, where the socket left the sets or a list had no room.
    bool mark_on_queues() noexcept RDMX_REQUIRES(mu_);
    /// A read left frames staged: who goes on with them. Stood down for the shared queues'
    /// poller, their next polls (mark_on_queues); otherwise the engine (continue_rx), unless
    /// an application that polls this connection owns the socket (its next poll() goes on).
    void continue_staged() noexcept RDMX_REQUIRES(mu_);
    void reclaim_rx() noexcept
        RDMX_REQUIRES(mu_, engine_thread_); ///< take the socket back into the epoll set
    void arm_standdown_check() noexcept RDMX_REQUIRES(mu_, engine_thread_);

    // --- driving the handshake (tcp_handshake.cpp; engine thread) ---
    /// Runs the connector's next step and does what it asks.
    void handshake_step() noexcept RDMX_REQUIRES(mu_, engine_thread_);
    /// The next step once the socket is ready for `w`.
    void handshake_wait(asio::posix::stream_descriptor::wait_type w) noexcept
        RDMX_REQUIRES(mu_, engine_thread_);
    /// start_client / start_server's common part: `connecting`, the connector begun in
    /// `p` with `out`, the timer armed, the first step (or connect_failed(connect_err)) on
    /// the engine.
    void start_handshake(connector::phase p, std::span<const std::byte> out, clock::time_point deadline,
                         int connect_err) RDMX_EXCLUDES(mu_);
    /// The connector failed (its cause() and why() say how): to error, the socket closed,
    /// a blocking connect() woken.
    void handshake_failed() noexcept RDMX_REQUIRES(mu_, engine_thread_);
    /// Wakes await_handshake (the state left `connecting`).
    void wake_settled() noexcept;
    /// connect() of the socket failed with `err`: the next address of the connector's dial
    /// plan if any is left (redial), else the handshake fails.
    void connect_failed(int err) noexcept RDMX_REQUIRES(mu_, engine_thread_);
    /// A fresh socket for the next address of the dial plan, connecting, under fd_'s number
    /// (so that nothing holding the number goes stale): out of the reactor and the shared
    /// queues' epoll sets, dup3, back in. False (err: the last errno) if no address is left.
    bool redial(int& err) noexcept RDMX_REQUIRES(mu_, engine_thread_);
    /// The connector is established: the connection is, started as start() does.
    void begin_established() noexcept RDMX_REQUIRES(mu_, engine_thread_);

    // --- after the connection object is gone (tcp_engine.cpp) ---
    void start_linger() noexcept RDMX_REQUIRES(mu_, engine_thread_);
    void linger_check() noexcept
        RDMX_REQUIRES(mu_); ///< closes the socket once everything owed is out and EOF read
    void close_socket() noexcept RDMX_REQUIRES(mu_, engine_thread_);

    tcp_domain& dom_;
    /// Fixed once the connection is established; the started connect's handshake writes
    /// max_rd_atomic (the peer's reply lowers it) before it says so.
    connection_limits lim_;
    const std::chrono::microseconds rnr_delay_;
    /// reads this side may have outstanding at the peer (start_client: known with the reply)
    std::uint32_t max_rd_out_ RDMX_GUARDED_BY(mu_);
    /// Room on the shared completion queues (it holds them); given back by close().
    detail::cq_reservation shared_ RDMX_GUARDED_BY(mu_);
    // The shared queues, typed (null: that side completes into cq_). Dereferenced only
    // under mu_ and until close() (detached_).
    tcp_completion_queue* const send_cq_;
    tcp_completion_queue* const recv_cq_;
    /// A side reports to a shared queue: the polls of its domain's queues read this socket
    /// (queue_progress) and count as the application's; transmission is never left to the
    /// application's next call (its next poll need not come to this connection).
    const bool on_shared_cq_;
    /// Stood down for a shared queue's poller (stand_down, reclaim_rx): queue_sleeps() asks.
    std::atomic<bool> left_to_queue_{false};
    /// Its socket's place in the progress sets of its shared queues' domain, where their
    /// polls and sleepers see it, its marks on their pending lists and the polls it counted.
    queue_membership membership_ RDMX_GUARDED_BY(mu_);
    /// The read wake being served found a shared queue armed for a sleeper that watches
    /// the sockets (queues_watched), before the run's own completions fired that arming.
    bool wake_saw_sleeper_ RDMX_GUARDED_BY(mu_) = false;
    /// How long a shared queue's poller keeps an ACK waiting (queue_progress).
    ack_hold ack_hold_ RDMX_GUARDED_BY(mu_);
    const std::uint64_t context_; ///< connection_options::context, in every completion
    /// Names this connection in the domain's window table (tcp_domain::find_remote): unlike
    /// the engine's address, never reused within the process.
    const std::uint64_t id_ = next_id();
    static std::uint64_t next_id() noexcept
    {
        static std::atomic<std::uint64_t> n{0};
        return n.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    const int fd_;
    unique_fd efd_;
    std::atomic<connection_state> state_{connection_state::established};
    std::error_code cause_ RDMX_GUARDED_BY(mu_); ///< why state_ left established (under mu_)
    detail::connection_events events_ RDMX_GUARDED_BY(mu_);
    bool local_disconnect_ RDMX_GUARDED_BY(mu_) = false; ///< this side disconnected (events' by_peer)
    /// How the peer ends the stream (docs/wire-format.md section 6).
    enum class goodbye : std::uint8_t {
        not_promised, ///< its handshake did not set the GOODBYE flag: EOF is a disconnect
        promised,     ///< it ends connections with a GOODBYE frame: EOF without one is peer_lost
        heard,        ///< its GOODBYE arrived: the EOF that follows is a clean disconnect
    };
    goodbye goodbye_ RDMX_GUARDED_BY(mu_) = goodbye::not_promised; ///< set_peer_says_goodbye, the reply
    std::size_t goodbye_sent_ RDMX_GUARDED_BY(mu_) = 0; ///< bytes of ours on the wire (maybe_shutdown)
    std::vector<std::byte> peer_pdata_;                 ///< see peer_private_data()
    /// The handshake (start_client, start_server): its connector owns the socket until it
    /// is established, and after it failed (owns_socket(): the application's calls then
    /// leave the socket alone).
    connector hs_ RDMX_GUARDED_BY(mu_);
    /// await_handshake's wake-up: notified (after mu_) when the handshake ends either way.
    std::mutex settle_mu_;
    std::condition_variable settled_;

    engine_mutex mu_;
    thread_role engine_thread_; ///< held by the domain's io thread (assert_on_engine)
    /// The send queue: its requests, the binds and invalidations behind them, where each
    /// request is (tcp_send_queue.hpp).
    send_queue sq_ RDMX_GUARDED_BY(mu_);
    rnr_retry rnr_ RDMX_GUARDED_BY(mu_); ///< RNR retries of the head (tcp_reliability.hpp)

    /// The receive queue (tcp_recv_queue.hpp); of depth 0 with a shared receive queue.
    recv_queue rq_ RDMX_GUARDED_BY(mu_);
    // With a shared receive queue (connection_options::srq) the rings above are empty and
    // receives come from it one at a time, as frames need them (tcp_srq_claim.hpp). The
    // connection object holds the queue (the engine must not: a queue holds its domain,
    // whose engine thread may not drop the last reference to it); close() lets go of it.
    srq_claim srq_ RDMX_GUARDED_BY(mu_);
    /// The slots its completions hold on its shared queues until polled; the queues'
    /// polls release them (and the shared receive queue's) without calling in here.
    queue_slots slots_;

    completion_ring cq_ RDMX_GUARDED_BY(mu_);
    notify_arm notify_ RDMX_GUARDED_BY(mu_);
    connection* conn_ RDMX_GUARDED_BY(mu_) = nullptr; ///< set_owner()
    /// close() ran, the connection object is gone: nothing of this connection goes to a
    /// shared queue any more, and the engine lingers to finish what the peer is owed
    /// (start_linger), counted by the domain while its socket is open.
    bool detached_ RDMX_GUARDED_BY(mu_) = false;

    // Responses owed to the peer: bounded; when full, reading stops (TCP backpressure).
    response_queue resp_ RDMX_GUARDED_BY(mu_);

    // Transmit state.
    wire_frame cur_ RDMX_GUARDED_BY(mu_); ///< the frame partly on the wire, and the copy of its rest
    tx_batch batch_ RDMX_GUARDED_BY(mu_); ///< what the pump's next sendmsg sends
    /// whether a pump may run: the write side open or shut, one pump at a time, the
    /// engine's continuation queued
    transmit_gate tx_ RDMX_GUARDED_BY(mu_);

    // Receive state.
    rx_stage stage_ RDMX_GUARDED_BY(mu_); ///< bytes read ahead of the frame being interpreted
    rx_frame rx_ RDMX_GUARDED_BY(mu_);    ///< the frame being received, and where its payload goes
    /// a read in this receive run returned less than asked: drained
    bool rx_short_ RDMX_GUARDED_BY(mu_) = false;
    /// Chunks that payload bound for staged memory is received into (rx_chunk), two so
    /// that one's copy to its place runs while the next recvmsg fills the other; held for
    /// one read run (rx_steps), their copies finished before a frame ends.
    rx_chunk rx_chunks_[2] RDMX_GUARDED_BY(mu_);
    int rx_turn_ RDMX_GUARDED_BY(mu_) = 0;      ///< the chunk the next staged read fills
    request_sequence seq_ RDMX_GUARDED_BY(mu_); ///< the peer's requests, as the target sees them
    /// The socket is a UNIX one (settle_transport): the peer shares this host, CMA may serve.
    std::atomic<bool> local_{false};
    /// shm://: whether this side sends CMA requests, and the peer's process that it serves
    /// the peer's in (tcp_cma_peer.hpp).
    cma_peer cma_ RDMX_GUARDED_BY(mu_);
    /// shm://: the peer's allocated regions this side has mapped (post_mapped).
    shared_map_cache mapped_ RDMX_GUARDED_BY(mu_);
    /// How often post_mapped looks at the peer's end of the socket at most.
    static constexpr std::chrono::microseconds mapped_peer_check{100};
    /// When post_mapped last saw the peer's end of the socket open.
    clock::time_point mapped_checked_ RDMX_GUARDED_BY(mu_){};
    /// The byte stream: the socket, or (shm://) the rings it takes with use_rings or the
    /// client's ACCEPT.
    stream_link link_ RDMX_GUARDED_BY(mu_);
    /// link_'s rings, for a look without the lock (ring_has_data): set while the domain's
    /// polls read it (it reports to a shared queue and its socket is in the progress sets).
    std::atomic<const byte_ring_pair*> ring_peek_{nullptr};
    /// link_'s rings in use: the domain's progress looks at them from now on (add_rings).
    void rings_ready() noexcept RDMX_REQUIRES(mu_);
    /// The engine thread's work outstanding for it, each at most once (tcp_engine_work.hpp).
    engine_work work_ RDMX_GUARDED_BY(mu_);
    std::uint64_t rx_bytes_ RDMX_GUARDED_BY(mu_) = 0;  ///< bytes read from the socket (frames, not the drain)
    std::uint64_t tx_bytes_ RDMX_GUARDED_BY(mu_) = 0;  ///< bytes the socket took
    std::uint64_t cma_bytes_ RDMX_GUARDED_BY(mu_) = 0; ///< bytes the peer's CMA requests asked us to move
    /// What this side has moved so far, for poll_ownership::call_end: bytes read and sent,
    /// and CMA copies served.
    std::uint64_t moved() const noexcept RDMX_REQUIRES(mu_) { return rx_bytes_ + tx_bytes_ + cma_bytes_; }
    /// who reads and sends: the engine or a polling application
    poll_ownership ownership_ RDMX_GUARDED_BY(mu_);
    /// The receive side of the stream.
    enum class rx_state : std::uint8_t {
        reading, ///< frames are read as they come
        stalled, ///< the responses owed fill their ring: no reading (the peer's TCP waits) until
                 ///< one goes out (resume_rx)
        done,    ///< EOF, an error or a violation: nothing more is read
    };
    rx_state rx_state_ RDMX_GUARDED_BY(mu_) = rx_state::reading;
    /// the socket is closed (or being closed): nothing more happens
    bool closed_ RDMX_GUARDED_BY(mu_) = false;
    bool violation_logged_ RDMX_GUARDED_BY(mu_) = false;
    /// where payload that is dropped goes on an application thread, and doorbells on any
    std::byte app_discard_[4096] RDMX_GUARDED_BY(mu_);

    // Asio operations of this connection come from here (never the heap); declared before
    // the objects whose waits use it.
    handler_memory hmem_;
    /// Readiness waits, stand-down (release) and close.
    asio::posix::stream_descriptor desc_ RDMX_GUARDED_BY(engine_thread_);
    asio::steady_timer rnr_timer_ RDMX_GUARDED_BY(mu_);
    /// The stand-down and transmit checks' interval (connection_options::tcp_options::takeover_check).
    const std::chrono::microseconds takeover_check_;
    asio::steady_timer standdown_timer_ RDMX_GUARDED_BY(engine_thread_);
    asio::steady_timer tx_check_timer_ RDMX_GUARDED_BY(mu_); ///< app_keeps_tx() outside a stand-down
    /// bounds start_linger() by progress_timeout_
    asio::steady_timer linger_timer_ RDMX_GUARDED_BY(engine_thread_);
    asio::steady_timer ring_timer_ RDMX_GUARDED_BY(engine_thread_); ///< wait_ring_space

    /// ack_timeout * (retry_count + 1), at least 1 s: the dead-peer rule's bound (live_),
    /// and the linger's.
    const std::chrono::steady_clock::duration progress_timeout_;
    liveness live_ RDMX_GUARDED_BY(mu_); ///< the dead-peer rule (tcp_reliability.hpp)
    asio::steady_timer progress_timer_ RDMX_GUARDED_BY(engine_thread_);
    asio::steady_timer handshake_timer_ RDMX_GUARDED_BY(engine_thread_); ///< start_handshake's deadline
};

} // namespace rdmx::tcp
