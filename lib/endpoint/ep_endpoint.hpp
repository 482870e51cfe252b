// The endpoint's state: address vector, the peers' connection state machine, the pools of
// operations and receives, and the shared queues behind them (docs/endpoints.md).
// ep_connect.cpp drives connections (requests, events, dials), ep_timers.cpp their
// redials, deadlines and nudges; ep_datapath.cpp
// posts and takes completions, ep_receive.cpp delivers (matching, rendezvous reads, acks),
// ep_progress.cpp is poll(). One thread calls it all
// (the endpoint is thread-compatible, rdmx/endpoint.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <rdmx/endpoint.hpp>
#include <rdmx/queues.hpp>

#include "cq_reservation.hpp"
#include "endpoint/ep_address.hpp"
#include "endpoint/ep_wire.hpp"
#include "endpoint/tag_match.hpp"

struct epoll_event; // <sys/epoll.h>

namespace rdmx::ep
{

using clock = std::chrono::steady_clock;

/// SGEs an operation or receive keeps (copied at issue: the caller's span is gone after it).
inline constexpr std::size_t max_sges = 8;
/// First redial delay after refused / unreachable / duplicate; doubles up to the maximum.
inline constexpr std::chrono::milliseconds first_backoff{10};
inline constexpr std::chrono::milliseconds max_backoff{500};
/// iWARP: the dialler's nudges until its acceptor answers (on_connected).
inline constexpr std::chrono::milliseconds first_nudge{20};
inline constexpr std::chrono::milliseconds max_nudge{1000};

/// What a work request id names (its top byte); the low 32 bits are a pool index.
enum class wr_kind : std::uint8_t { srq = 1, op = 2, rndv_read = 3, ack = 4, ready = 5, delivered = 6 };
constexpr std::uint64_t make_wr_id(wr_kind k, std::uint32_t i) noexcept
{
    return (static_cast<std::uint64_t>(k) << 56) | i;
}

/// An outgoing operation: send (eager or rendezvous), write, read, an atomic, or a
/// window's bind or invalidation.
struct op_slot {
    enum class state : std::uint8_t { free, queued, posted };
    state st = state::free;
    endpoint_op kind = endpoint_op::send;
    bool rndv = false;
    bool awaiting_local = false; ///< its work request's completion is not polled yet
    bool awaiting_ack = false;   ///< rendezvous: the receiver's ack has not come
    std::uint8_t nsge = 0;
    std::uint32_t gen = 0; ///< with the index, the id an ack names
    std::uint32_t seq = 0; ///< an eager send on iWARP: its number on the connection (delivered counts)
    std::uint32_t peer = nil;
    std::uint32_t prev = nil, next = nil; ///< in its peer's queued or outstanding chain
    std::uint64_t context = 0, tag = 0, length = 0;
    std::array<sge, max_sges> sges{};
    remote_buffer remote{};
    /// fetch_add: the value added; compare_swap: the value compared with, and the swap.
    std::uint64_t compare_add = 0, swap = 0;
    /// bind_window / invalidate_window: the caller's window; bind_window: its rights (the
    /// region and range it covers are sges[0]).
    memory_window* window = nullptr;
    access rights = access::none;
    connection* conn = nullptr; ///< where it was posted
    std::error_code status;
};

/// A posted tagged receive (and, once matched, its rendezvous reads and ack).
struct recv_slot {
    enum class state : std::uint8_t { free, posted, reading, ack_pending, ack_sent };
    state st = state::free;
    std::uint8_t nsge = 0, ndesc = 0;
    std::uint32_t from = nil; ///< peer index, nil for any_peer
    std::uint32_t from_gen = 0;
    std::uint64_t tag = 0, ignore = 0, context = 0;
    std::array<sge, max_sges> sges{};
    // matched:
    std::uint32_t peer = nil;
    std::uint64_t msg_tag = 0, msg_length = 0, remote_id = 0;
    connection* conn = nullptr;
    std::array<remote_buffer, max_rts_desc> desc{};
    std::uint64_t to_read = 0, posted_bytes = 0; ///< rendezvous: bytes to read, and posted so far
    std::uint32_t reads_outstanding = 0;
    std::error_code status;
};

/// A message held in its receive buffer until a receive matches it (or a claim takes it).
struct unexpected_msg {
    std::uint32_t peer = nil;
    connection* conn = nullptr;
    msg_header hdr;
    std::uint32_t byte_len = 0;
    std::uint32_t claim_gen = 0;
    bool held = false;    ///< on the unexpected list
    bool claimed = false; ///< taken by peek(claim)
};

/// A doubly linked chain of op slots (per peer), the links in the slots.
struct op_chain {
    std::uint32_t head = nil, tail = nil, size = 0;
};

/// One entry of the address vector. Its connection state: idle (no connection), connecting
/// (dial and/or accepted set, chosen null), connected (chosen set; only the chosen one
/// carries data). `dial` is ours, `accepted` the peer's; at most one is chosen. A dial is
/// chosen when it is established; an accepted connection when it is established AND the
/// dialler's first message came over it (its `ready`): an acceptor can see `established`
/// for a connection that its dialler then loses (siw under load), and what it posted there
/// would be lost without an error (docs/endpoints.md, "Connections").
struct peer_entry {
    bool live = false;
    std::uint32_t gen = 1;
    resolved_address addr;
    std::uint64_t remote_inc = 0; ///< 0: not known yet
    std::unique_ptr<connection> dial, accepted;
    connection* chosen = nullptr;
    bool accepted_up = false;    ///< `accepted`'s established event was seen
    bool accepted_heard = false; ///< a message came over `accepted`
    /// On iWARP (siw's accept race, on_connected): whether anything came over `dial`;
    /// until it does, a `delivered` message (nudge_due) at nudge_at, with backoff.
    bool dial_heard = false, nudge_due = false;
    clock::time_point nudge_at = clock::time_point::max();
    std::chrono::milliseconds nudge_every{0};
    std::uint32_t posted_wrs = 0; ///< on `chosen`, all signalled
    std::uint32_t user_budget = 0, sq_depth = 0;
    op_chain queued, outstanding;
    clock::time_point deadline = clock::time_point::max(); ///< of the oldest queued op
    clock::time_point next_dial = clock::time_point::max();
    std::chrono::milliseconds backoff = first_backoff;
    std::error_code last_cause;
    /// Since the last connection or the last connect deadline: dials started, and of them
    /// those the peer refused as duplicates (what the deadline's warning says).
    std::uint32_t dials = 0, duplicates = 0;
    bool in_timers = false, in_kick = false;
    // Credits, and on iWARP delivery acknowledgements, of data messages (eager and rts;
    // docs/endpoints.md, "Flow control" and "Completion semantics"). Counts are per
    // connection, mod 2^32.
    std::uint32_t rx_dial = 0, rx_accepted = 0; ///< data messages received over each
    std::uint32_t tx = 0;                       ///< data messages posted on `chosen` (each one's seq)
    std::uint32_t peer_delivered = 0;           ///< of those, what the peer said it holds
    std::uint32_t peer_credit = initial_credit; ///< how many more the peer said it takes
    std::uint32_t told = 0;                     ///< what we last said over `chosen` (of rx on it)
    std::uint32_t told_grant = initial_credit;  ///< told + the credit we last gave
    std::uint32_t held = 0;                     ///< its messages held (unexpected or claimed)
    bool delivered_posted = false;              ///< a `delivered` message is in flight on `chosen`
    bool in_ack_due = false;
    // Peer events (endpoint_options::peer_events) not yet polled: at most one of each.
    std::error_code down_cause; ///< peer_down pending when set
    bool restarted = false;     ///< peer_restarted pending
    bool in_peer_events = false;
};

class endpoint_impl final : public endpoint
{
public:
    endpoint_impl(domain& d, std::string_view address, const endpoint_options& opts);
    ~endpoint_impl() override;

    const std::string& address() const noexcept override { return self_.text; }
    std::uint64_t incarnation() const noexcept override { return incarnation_; }
    rdmx::peer insert(std::string_view address) override;
    void remove(rdmx::peer p) noexcept override;
    std::optional<std::string> address_of(rdmx::peer p) const override;
    std::error_code send(rdmx::peer to, std::uint64_t tag, std::span<const sge> local,
                         std::uint64_t context) noexcept override;
    std::error_code recv(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore, std::span<const sge> local,
                         std::uint64_t context) noexcept override;
    std::error_code recv(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore, std::span<const sge> local,
                         std::uint64_t context, bool& matched) noexcept override;
    std::optional<message_info> peek(rdmx::peer from, std::uint64_t tag, std::uint64_t ignore,
                                     bool claim) noexcept override;
    std::error_code recv_claimed(std::uint64_t claim, std::span<const sge> local,
                                 std::uint64_t context) noexcept override;
    std::error_code write(rdmx::peer to, std::span<const sge> local, const remote_buffer& remote,
                          std::uint64_t context) noexcept override;
    std::error_code read(rdmx::peer from, std::span<const sge> local, const remote_buffer& remote,
                         std::uint64_t context) noexcept override;
    std::error_code fetch_add(rdmx::peer to, const sge& local, const remote_buffer& remote, std::uint64_t add,
                              std::uint64_t context) noexcept override;
    std::error_code compare_swap(rdmx::peer to, const sge& local, const remote_buffer& remote,
                                 std::uint64_t compare, std::uint64_t swap,
                                 std::uint64_t context) noexcept override;
    std::error_code bind_window(rdmx::peer to, memory_window& window, const memory_region& region,
                                std::uint64_t offset, std::uint64_t length, rdmx::access rights,
                                std::uint64_t context) noexcept override;
    std::error_code invalidate_window(rdmx::peer to, memory_window& window,
                                      std::uint64_t context) noexcept override;
    std::size_t poll(std::span<endpoint_completion> out) noexcept override;
    int fd() const noexcept override;
    std::size_t wait(std::span<endpoint_completion> out, std::chrono::milliseconds timeout) noexcept override;
    std::error_code cancel_recv(std::uint64_t context) noexcept override;
    stats statistics() const noexcept override;

private:
    // --- address vector (ep_connect.cpp) ---
    std::uint32_t index_of(rdmx::peer p) const noexcept; ///< nil for a stale handle or any_peer
    rdmx::peer handle_of(std::uint32_t i) const noexcept;
    std::uint32_t find_or_add(const resolved_address& a);
    // --- connection management (ep_connect.cpp) ---
    void take_requests() noexcept;
    void on_request(connection_request& req);
    void poll_events() noexcept;
    void on_event(const event& ev) noexcept;
    void start_dial(std::uint32_t pi) noexcept;
    void on_connected(std::uint32_t pi, connection* c) noexcept;
    /// A message came over `c`: when it is the accepted connection, not chosen yet, its
    /// dialler is up; it is chosen once its established event was seen too.
    void heard_on(std::uint32_t pi, connection* c) noexcept;
    void nudge(std::uint32_t pi) noexcept;
    bool nudging(const peer_entry& p) const noexcept;
    void on_dial_failed(std::uint32_t pi, std::error_code cause, reject_reason why) noexcept;
    /// Ends `c` (one of the peer's): fails what was posted on it with `cause`, drops it.
    void drop_connection(std::uint32_t pi, connection* c, std::error_code cause) noexcept;
    // (timers: ep_timers.cpp)
    void schedule_redial(std::uint32_t pi) noexcept;
    void need_timers(std::uint32_t pi) noexcept;
    void run_timers() noexcept;
    void arm_timerfd() noexcept;
    void fail_queued(std::uint32_t pi, std::error_code cause) noexcept;
    /// Notes a peer event for poll() (endpoint_options::peer_events).
    void note_peer_event(std::uint32_t pi, endpoint_op what, std::error_code cause) noexcept;
    /// poll(): the pending peer events into the ring, while it has room beyond what the
    /// operations in flight may still need.
    void emit_peer_events() noexcept;
    // --- credits, and delivery acknowledgements on iWARP (ep_delivery.cpp) ---
    /// Data messages received over `c`, one of peer p's connections.
    static std::uint32_t& rx_count(peer_entry& p, const connection* c) noexcept
    {
        return c == p.dial.get() ? p.rx_dial : p.rx_accepted;
    }
    static std::uint32_t rx_count(const peer_entry& p, const connection* c) noexcept
    {
        return c == p.dial.get() ? p.rx_dial : p.rx_accepted;
    }
    /// Stamps a header for p's chosen connection with our delivered count and the credit
    /// we give; note_told() records them once the header is posted.
    void stamp(const peer_entry& p, msg_header& h) const noexcept;
    static void note_told(peer_entry& p, const msg_header& h) noexcept
    {
        p.told = h.delivered;
        p.told_grant = h.delivered + h.credit;
    }
    /// The credit peer p gets now: its window less what it holds beyond its share of
    /// unexpected_limit (docs/endpoints.md, "Flow control").
    std::uint32_t credit_for(const peer_entry& p) const noexcept;
    /// Whether p's chosen connection needs a `delivered` message: on iWARP when our count
    /// moved, everywhere when the credit we could give is well past what we told.
    bool ack_wanted(const peer_entry& p) const noexcept;
    /// A header over p's chosen connection said `delivered` and `credit`: the eager sends
    /// the count covers complete (iWARP), and sends waiting for credit go.
    void on_delivered(std::uint32_t pi, const msg_header& h) noexcept;
    void need_ack(std::uint32_t pi) noexcept;
    /// Peer `pi`'s credit may have grown (a message of its was taken, or came): a
    /// `delivered` message is due if ack_wanted.
    void credit_moved(std::uint32_t pi) noexcept;
    /// A held message of buffer `buf` is no longer held (received, or released).
    void unhold(std::uint32_t buf) noexcept;
    /// poll()'s end: a `delivered` message to each peer whose count no header carried yet.
    void send_due_acks() noexcept;
    /// Moves completions from the ring into `out`; returns how many.
    std::size_t take_ready(std::span<endpoint_completion> out) noexcept;
    /// The registered header slot of peer `i` for its `delivered` messages (grows in blocks).
    void ensure_delivered_slot(std::uint32_t i);
    /// Completes the posted receives directed at peer `pi` (not yet matched) with `cause`.
    void fail_directed_recvs(std::uint32_t pi, std::error_code cause) noexcept;
    bool connecting(const peer_entry& p) const noexcept { return p.dial || p.accepted; }
    /// Puts peer `pi` on one of the endpoint's lists of peers (timers_, kick_, ack_due_,
    /// event_peers_) unless its flag `on` for that list says it is there; each list is
    /// reserved to the address vector's size in find_or_add, so this never allocates.
    static void list_once(std::vector<std::uint32_t>& list, bool& on, std::uint32_t pi) noexcept
    {
        if (!on) {
            on = true;
            list.push_back(pi);
        }
    }
    /// Takes peer `pi` off such a list (remove()).
    static void unlist(std::vector<std::uint32_t>& list, bool& on, std::uint32_t pi) noexcept
    {
        if (on) {
            list.erase(std::find(list.begin(), list.end(), pi));
            on = false;
        }
    }
    /// What statistics() counts a peer as; reclass() keeps the counts when it changes.
    enum class peer_class : std::uint8_t { idle, connecting, connected };
    static peer_class class_of(const peer_entry& p) noexcept
    {
        return p.chosen                 ? peer_class::connected
               : (p.dial || p.accepted) ? peer_class::connecting
                                        : peer_class::idle;
    }
    void reclass(peer_class before, const peer_entry& p) noexcept;
    // --- data path (ep_datapath.cpp) ---
    std::error_code check_sges(std::span<const sge> local, access need, std::uint64_t* total) const noexcept;
    /// A cleared op slot of `kind` for peer `pi`, or nil when the pools are full
    /// (would_block); the caller fills its operands and issues it.
    std::uint32_t take_op(std::uint32_t pi, endpoint_op kind, std::uint64_t context) noexcept;
    /// send / write / read's common end, once their checks passed: an op slot (would_block
    /// when the pools are full) filled and issued to peer `pi`.
    std::error_code start_op(std::uint32_t pi, endpoint_op kind, bool rndv, std::uint64_t tag,
                             std::span<const sge> local, std::uint64_t total, const remote_buffer& remote,
                             std::uint64_t context) noexcept;
    /// fetch_add / compare_swap's common end, once their checks passed.
    std::error_code start_atomic(std::uint32_t pi, endpoint_op kind, const sge& local,
                                 const remote_buffer& remote, std::uint64_t compare_add, std::uint64_t swap,
                                 std::uint64_t context) noexcept;
    std::error_code issue(std::uint32_t pi, std::uint32_t oi) noexcept;
    enum class post_result { posted, no_room, failed };
    /// Posts op `oi` on its connected peer (failed: it completed with the error).
    post_result post_op(std::uint32_t oi) noexcept;
    void flush_queue(std::uint32_t pi) noexcept;
    void complete_op(std::uint32_t oi) noexcept;
    void poll_cq() noexcept;
    /// poll()'s look at fd()'s set: one epoll_wait(0), then what it found ready.
    void scan_fds() noexcept;
    /// What scan_fds() does with the descriptors epoll reported ready (wait() hands it its own).
    void take_ready_fds(const epoll_event* evs, int nready) noexcept;
    /// Arms the queue's notification before a sleep on fd(), for a sleeper that watches the
    /// queue's progress descriptor too where it has one (TCP: its sockets).
    void arm_cq() noexcept;
    void on_completion(const completion& c) noexcept;
    void on_message(std::uint32_t buf, std::uint32_t byte_len, std::uint32_t pi, connection* c) noexcept;
    void deliver(std::uint32_t ri, std::uint32_t buf) noexcept;
    void progress_rndv(std::uint32_t ri) noexcept;
    void finish_recv(std::uint32_t ri) noexcept;
    void post_ack(std::uint32_t ri) noexcept;
    void repost(std::uint32_t buf) noexcept;
    /// Gives back the buffers that back-pressure kept, while fewer than unexpected_limit
    /// messages are held.
    void give_back_deferred() noexcept;
    /// The end of every call that can leave poll() work outside poll() (a completion pushed
    /// by recv(), remove() or a failed post, a buffer freed, a deadline set): gives the
    /// freed buffers back, keeps fd() readable while poll() has something to return, and
    /// sets the timerfd for a new deadline, so that a caller asleep on fd() wakes.
    void settle() noexcept;
    /// Makes fd() readable (the eventfd) unless it is already, or busy_poll.
    void raise_wake() noexcept;
    void release_unexpected(std::uint32_t buf) noexcept;
    void push(const endpoint_completion& c) noexcept;
    /// A failed work request's status as the operation's cause: a flush is replaced by why
    /// its connection `c` ended.
    std::error_code cause_of(std::error_code status, connection* c) const noexcept;
    std::uint32_t take_recv_slot() noexcept;
    /// recv / recv_claimed's common start: checks `local`, takes a receive slot (in *ri)
    /// posted from peer `from` with its SGEs and context; would_block when the pools are full.
    std::error_code new_recv(std::uint32_t from, std::span<const sge> local, std::uint64_t context,
                             std::uint32_t* ri) noexcept;
    /// The oldest held message from `pi` (nil: any peer) whose tag matches, or nil.
    std::uint32_t find_unexpected(std::uint32_t pi, std::uint64_t tag, std::uint64_t ignore) noexcept;
    /// Posts the header at `off` of the control area alone as a send (ack, ready).
    std::error_code send_header(connection& c, std::size_t off, std::uint64_t wr_id) noexcept;
    void free_recv(std::uint32_t ri) noexcept;
    void chain_push(op_chain& ch, std::uint32_t oi) noexcept;
    void chain_erase(op_chain& ch, std::uint32_t oi) noexcept;
    bool pools_full() const noexcept;

    domain& dom_;
    endpoint_options opts_;
    std::uint64_t incarnation_ = 0;
    resolved_address self_;
    bool automatic_ = false;       ///< opened with auto://: peers are dialled by auto:// (to_text)
    std::uint32_t send_sge_ = 2;   ///< max_send_sge in effect (with the header's)
    std::uint32_t buf_size_ = 0;   ///< of each receive buffer: header + payload
    std::uint32_t ctrl_size_ = 0;  ///< of each op's header / rts area
    std::uint64_t max_chunk_ = 0;  ///< of one rendezvous read
    std::size_t ready_offset_ = 0; ///< in ctrl_mem_: the ready message's header (one for all)

    // Pools, sized at open.
    std::vector<op_slot> ops_;
    free_list free_ops_;
    std::vector<recv_slot> recvs_;
    free_list free_recvs_;
    index_list posted_recvs_;          ///< in posting order
    index_list pending_recvs_;         ///< rendezvous reads or acks waiting for send-queue room
    std::vector<unexpected_msg> held_; ///< per receive buffer
    index_list unexpected_;            ///< held messages in arrival order (not claimed)
    std::uint32_t held_count_ = 0;     ///< buffers held (unexpected and claimed)
    std::vector<std::uint32_t> deferred_reposts_;
    std::vector<endpoint_completion> ring_;
    std::size_t ring_head_ = 0, ring_count_ = 0;
    /// poll_cq's batch, built once: 64 completions constructed on every call (4.5 kB of
    /// stores) cost more than a poll of a queue that has nothing. in_poll_cq_ checks (in
    /// builds with assertions) that no call comes from within another.
    std::array<completion, 64> cq_batch_{};
    bool in_poll_cq_ = false;
    /// poll_events()'s batch, built once: an array on its stack was 32 events (1.8 kB)
    /// zeroed at every poll, mostly to find the queue empty.
    std::array<event, 32> ev_batch_{};
    std::uint32_t queued_total_ = 0;
    std::uint32_t ops_in_use_ = 0, recvs_in_use_ = 0;

    // Address vector (grows; not the data path).
    std::vector<std::unique_ptr<peer_entry>> peers_;
    std::vector<std::uint32_t> free_peers_;
    std::unordered_map<std::string, std::uint32_t> by_address_;
    std::vector<std::uint32_t> timers_, kick_, ack_due_, event_peers_;
    std::size_t live_peers_ = 0;
    std::size_t connected_peers_ = 0, connecting_peers_ = 0; ///< statistics(), kept by reclass()

    // The destructor ends the connections (in peers_) first; then, in reverse order of
    // these members, the listener, the regions, their memory and the queues.
    std::shared_ptr<event_queue> events_;
    std::shared_ptr<completion_queue> cq_;
    /// cq_ as every backend's shared queue is (TCP: its progress descriptor, below).
    detail::completion_queue_base* cqb_ = nullptr;
    /// cq_'s progress_fd() is in fd()'s set (nest_progress_fd gave it): arm_cq() arms
    /// for a sleeper that watches it.
    bool progress_nested_ = false;
    std::shared_ptr<shared_receive_queue> srq_;
    std::vector<std::byte> recv_mem_, ctrl_mem_;
    std::unique_ptr<memory_region> recv_mr_, ctrl_mr_;
    /// iWARP: eager sends complete on the receiver's delivered count, not on their own
    /// completion (which says only that TCP took the message).
    bool delivery_acks_ = false;
    /// Most credit one peer gets (its window), however many buffers are free.
    static constexpr std::uint32_t max_window = 128;
    /// One header slot per peer for its `delivered` messages, in registered blocks.
    static constexpr std::uint32_t delivered_block = 64;
    struct header_block {
        std::array<std::byte, delivered_block * header_size> mem{};
        std::unique_ptr<memory_region> mr;
    };
    std::vector<std::unique_ptr<header_block>> delivered_blocks_;
    std::unique_ptr<listener> listener_;
    int epoll_fd_ = -1, timer_fd_ = -1, wake_fd_ = -1;
    // What poll() knows without a system call (it makes one, epoll_wait(0), when nothing
    // needs more): the completion queue is armed (its event not yet seen), the eventfd is
    // raised, and the time the timerfd is set to.
    bool cq_armed_ = false, wake_raised_ = false;
    clock::time_point timer_set_ = clock::time_point::max();
    /// Spinning (busy_poll, or fd() never asked for), a poll() asks epoll about fd()'s set
    /// (connection requests) at its spin_scan_every-th call since the last look, once
    /// spin_scan_gap has passed since it: a system call costs more than a poll that finds
    /// nothing (1.1-1.2 us against 0.1-0.2 on this host), and this look and the domain
    /// progress's (ring_only_socket_gap) every 20 us cost an 8 B ping-pong over shm:// a
    /// tenth of its time (docs/performance.md). While a connection it dials is under way
    /// (timers_: dialled, backing off, not yet heard from its acceptor), or the last look
    /// found a connection request (more tend to follow in a burst of clients), the gap is
    /// spin_scan_gap_connecting. Where polls are slow (an emulated guest) the count rules
    /// (every 256th poll made 2000 connect-remove cycles on rxe take 136 s, not 16).
    bool spin_scan_due() noexcept;
    static constexpr std::uint32_t spin_scan_every = 16;
    static constexpr std::chrono::microseconds spin_scan_gap{200}, spin_scan_gap_connecting{20};
    std::uint32_t polls_since_scan_ = 0;
    bool scan_took_request_ = false; ///< the latest look at fd()'s set found the listener readable
    /// When a spinning poll() last looked (wait() sets it back to the epoch when it found
    /// nothing, so that the next poll() looks at once).
    clock::time_point scanned_at_{};
    /// wait() has just taken fd()'s ready descriptors: the next poll() does not look again.
    bool fds_taken_ = false;
    /// poll() calls in a row answered from the ring alone, without progress (at most 15).
    std::uint32_t polls_from_ring_ = 0;
    /// fd() was handed out: a caller may sleep on it, so poll() keeps the queue armed and
    /// the eventfd raised for it (unless busy_poll). Set by fd(), any thread.
    mutable std::atomic<bool> fd_out_{false};
    /// Nobody sleeps on fd() but wait(), which arms before it sleeps: poll() arms nothing.
    bool spinning() const noexcept { return opts_.busy_poll || !fd_out_.load(std::memory_order_acquire); }
};

} // namespace rdmx::ep
