// The engine of one TCP "queue pair": send, receive and completion rings plus the transmit
// and receive state machines that give a byte stream the semantics of a verbs RC connection.
// Its methods are defined one concern per file (see each declaration group below).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "tcp/tcp_completion.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_handler_memory.hpp"
#include "tcp/tcp_poll_ownership.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"

namespace rdmx::tcp
{

/// The initiator's completion status for a NAK the peer sent (or this side sends).
std::error_code nak_status(nak_code c) noexcept;

/// Everything the engine's handlers touch. Shared between the connection object and the
/// handlers in flight, so that destroying the connection never leaves a handler dangling.
/// `mu_` guards all of it; the socket is used under `mu_` by the application thread (the
/// transmit pump in post) and by the engine thread, the asio descriptor only by the engine.
class connection_engine : public std::enable_shared_from_this<connection_engine>
{
public:
    connection_engine(tcp_domain& dom, unique_fd fd, const connection_limits& lim,
                      const connection_options& opts, std::uint32_t peer_max_rd);
    ~connection_engine();
    connection_engine(const connection_engine&) = delete;
    connection_engine& operator=(const connection_engine&) = delete;

    /// Starts receiving on the engine. Called once, after construction.
    void start();

    connection_state state() const noexcept { return state_.load(std::memory_order_acquire); }
    std::error_code last_error() noexcept
    {
        std::lock_guard lk(mu_);
        return cause_;
    }
    const connection_limits& limits() const noexcept { return lim_; }
    int event_fd() const noexcept { return efd_.get(); }

    std::error_code post(std::span<const work_request> wrs, std::size_t* posted) noexcept;
    std::error_code post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept;
    std::size_t poll(std::span<completion> out) noexcept;
    std::error_code request_notify(bool solicited_only) noexcept;
    std::error_code ack_notify() noexcept;
    void disconnect() noexcept;
    /// The connection object is going away: disconnect and let the engine close the socket.
    void close() noexcept;

private:
    // Fixed batch sizes of one sendmsg / recvmsg; a frame that does not fit continues in
    // the next call. 128 iovecs hold a header plus the largest SGE list (32) several times over.
    static constexpr int max_iov = 128;
    static constexpr int max_batch_frames = 16;
    static_assert(max_iov >= 2 * (1 + 32), "a batch must hold at least one full frame");
    // Receive steps (frames, or reads) per run before yielding to other connections.
    static constexpr int rx_budget = 64;
    // Bytes one pump may send from the application thread / from the engine thread.
    static constexpr std::uint64_t app_tx_budget = 1u << 20;
    static constexpr std::uint64_t engine_tx_budget = 4u << 20;
    // Receive ownership and the busy-poll heuristics: poll_ownership (tcp_poll_ownership.hpp).
    // The engine's read wait in the middle of a payload of at least rcvlowat_min bytes left
    // wakes when min(left, rcvlowat_max) have arrived (SO_RCVLOWAT), not at the first byte.
    // Whichever thread reads while that wait is armed lowers the mark with what it consumed
    // (keep_rcvlowat_reachable): it never exceeds the payload bytes still to come.
    static constexpr std::uint64_t rcvlowat_min = 64u << 10;
    static constexpr std::uint64_t rcvlowat_max = 256u << 10;

    struct sq_entry {
        std::uint64_t wr_id = 0;
        std::uint64_t remote_addr = 0;
        std::uint64_t remote_key = 0;
        std::uint32_t length = 0;
        std::uint32_t imm = 0;
        rdmx::opcode op = opcode::send;
        bool signaled = false;
        bool fenced = false;
        bool solicited = false;
        std::uint32_t nseg = 0;
    };
    struct rq_entry {
        std::uint64_t wr_id = 0;
        std::uint64_t length = 0;
        std::uint32_t nseg = 0;
    };
    /// A response owed to the peer, sent in the order the requests arrived.
    struct response {
        frame_op op = frame_op::ack;
        nak_code code = nak_code::rnr;
        std::uint64_t seq = 0;
        seg data; ///< read_resp: the target memory to send
    };
    enum class frame_kind : std::uint8_t { none, request, response };
    struct tx_item {
        frame_kind kind = frame_kind::none;
        std::uint64_t pos = 0;   ///< SQ position (= sequence number) or response ring position
        std::uint64_t skip = 0;  ///< bytes of the frame sent before this batch
        std::uint64_t added = 0; ///< bytes of the frame in this batch
        std::uint64_t total = 0; ///< bytes of the whole frame, header included
        bool was_current = false;
    };
    struct tx_batch {
        iovec iov[max_iov];
        int niov = 0;
        tx_item items[max_batch_frames];
        int nitems = 0;
        std::byte headers[max_batch_frames][frame_header::wire_size];
        region_state* pinned[max_iov];
        int npinned = 0;
        bool closed = false;  ///< a frame could not be added whole: nothing may follow it
        bool revoked = false; ///< the last frame's memory was deregistered (pump withdraws it)
    };
    /// What the payload of the frame being received is for.
    enum class rx_action : std::uint8_t {
        none,          ///< reading a header
        recv,          ///< send: into the posted receive
        recv_overflow, ///< send larger than the receive: drain, local_length, NAK
        rnr,           ///< no receive posted: drain, then NAK rnr
        drop,          ///< after an RNR NAK, requests until the NAKed one are drained silently
        write,         ///< into target memory, then ACK
        write_imm,     ///< into target memory, then consume a receive and ACK
        write_bad,     ///< access violation: drain, then NAK remote_access
        read_resp,     ///< into the read's local SGEs
    };
    enum class rx_status : std::uint8_t { again, wait, stop };

    // --- data path helpers (mu_ held) ---
    seg* sq_segs(std::uint64_t pos) noexcept
    {
        return &sq_segs_[(pos % lim_.send_queue_depth) * lim_.max_send_sge];
    }
    seg* rq_segs(std::uint64_t pos) noexcept
    {
        return &rq_segs_[(pos % lim_.recv_queue_depth) * lim_.max_recv_sge];
    }
    sq_entry& sq_at(std::uint64_t pos) noexcept { return sq_[pos % lim_.send_queue_depth]; }
    rq_entry& rq_at(std::uint64_t pos) noexcept { return rq_[pos % lim_.recv_queue_depth]; }
    response& resp_at(std::uint64_t pos) noexcept { return resp_[pos % resp_.size()]; }
    bool on_engine() const noexcept;

    /// post() / post_recv()'s common start: checks every request, and on a connection that
    /// left `established` completes them all as flushed. A value is what the call returns;
    /// nullopt: the caller queues the requests.
    template <class Request, class Check>
    std::optional<std::error_code> validate_or_flush(std::span<const Request> wrs, std::size_t* posted,
                                                     Check check) noexcept;
    void push_cq(const completion& c, bool solicited = false) noexcept;
    void complete_sq_head(std::error_code status, std::uint32_t byte_len) noexcept;
    void complete_rq_head(const completion& c, bool solicited) noexcept;
    /// Leaves `established` for `to`; `cause` (default: errc::disconnected or, for error,
    /// errc::completion_error) is what last_error() reports.
    void fail(connection_state to, std::error_code cause = {}) noexcept;
    void push_ack(std::uint64_t seq) noexcept;
    void push_response(const response& r) noexcept;
    void target_fail(nak_code code, std::uint64_t seq) noexcept;
    void protocol_violation(const char* why, bool blame_head) noexcept;
    void peer_gone() noexcept;

    // --- transmit ---
    void pump() noexcept;
    void add_frame(tx_batch& b, frame_kind kind, std::uint64_t pos, std::uint64_t skip) noexcept;
    void advance(tx_batch& b, std::uint64_t sent) noexcept;
    /// Continues transmitting on the engine: `would_block` after EAGAIN, else after the
    /// budget ran out or on the application thread.
    void arm_write(bool would_block) noexcept;
    void maybe_shutdown() noexcept;
    /// A frame could not be added because its memory was deregistered: `kind` and `pos`
    /// name one not started yet, frame_kind::none the frame on the wire (cur_).
    void revoked_frame(frame_kind kind, std::uint64_t pos) noexcept;
    // --- after the connection object is gone (engine thread) ---
    void start_linger() noexcept;
    void linger_check() noexcept; ///< closes the socket once everything owed is out and EOF read
    void close_socket() noexcept;

    // --- receive (engine thread) ---
    void arm_read() noexcept;
    void rx_run() noexcept;
    rx_status rx_step() noexcept;
    rx_status rx_drain() noexcept;
    rx_status rx_payload() noexcept;
    rx_status rx_staged_payload() noexcept;
    void rx_advance(std::uint64_t n) noexcept;
    std::size_t staged() const noexcept { return stage_end_ - stage_begin_; }
    /// Consumes n staged bytes; an emptied stage starts again at its front.
    void unstage(std::size_t n) noexcept
    {
        stage_begin_ += n;
        if (stage_begin_ == stage_end_)
            stage_begin_ = stage_end_ = 0;
    }
    /// Staged bytes that can be processed without reading: a whole header, or payload.
    bool staged_work() const noexcept
    {
        return staged() > 0 && (rx_action_ != rx_action::none || staged() >= frame_header::wire_size);
    }
    void continue_rx() noexcept; ///< the engine goes on with staged frames (no socket event will come)
    bool payload_to_memory() const noexcept
    {
        return rx_action_ == rx_action::recv || rx_action_ == rx_action::write ||
               rx_action_ == rx_action::write_imm || rx_action_ == rx_action::read_resp;
    }
    rx_status rx_error(ssize_t n, int err) noexcept;
    void begin_frame(const frame_header& h) noexcept;
    void begin_request(const frame_header& h) noexcept;  ///< the peer's request (tcp_target.cpp)
    void begin_response(const frame_header& h) noexcept; ///< a response to ours (tcp_reliability.cpp)
    void finish_frame() noexcept;
    void on_ack(std::uint64_t seq) noexcept;
    void on_nak(std::uint64_t seq, nak_code code) noexcept;
    void resume_rx() noexcept;
    bool rx_poll() noexcept; ///< application thread, from poll(); true if it ran pump()
    bool rx_read() noexcept; ///< rx_poll without the sending; false if it could not read
    bool app_may_read() const noexcept;
    bool app_took_data(bool app_in_call) noexcept; ///< engine, on a read wake: stand down?
    bool app_keeps_tx() noexcept;                  ///< transmission left to the busy application?
    void set_rcvlowat(int bytes) noexcept;         ///< the socket's SO_RCVLOWAT, when it changes
    int wanted_rcvlowat() const noexcept;          ///< the mark for a read wait armed now
    void keep_rcvlowat_reachable() noexcept;       ///< after a read: an armed wait's mark <= what is to come
    void arm_tx_check() noexcept;
    bool coalesce_post() noexcept; ///< leave this post()'s requests for the next call?
    bool only_acks_owed() const noexcept;
    void stand_down() noexcept; ///< engine: leave the socket to the polling application
    void reclaim_rx() noexcept; ///< engine: take the socket back into the epoll set
    void arm_standdown_check() noexcept;
    // --- liveness (engine thread) ---
    void arm_progress_check() noexcept;
    void check_progress() noexcept;

    tcp_domain& dom_;
    const connection_limits lim_;
    const std::uint8_t rnr_limit_;
    const std::chrono::microseconds rnr_delay_;
    const std::uint32_t max_rd_out_; ///< reads this side may have outstanding at the peer
    const int fd_;
    unique_fd efd_;
    std::atomic<connection_state> state_{connection_state::established};
    std::error_code cause_; ///< why state_ left established (under mu_)

    std::mutex mu_;
    // Send queue: [sq_head_, tx_next_) started and awaiting a response, [tx_next_, sq_tail_)
    // not started. Positions are also the request sequence numbers.
    std::vector<sq_entry> sq_;
    std::vector<seg> sq_segs_;
    std::vector<std::byte> sq_inline_;
    std::uint64_t sq_head_ = 0, tx_next_ = 0, sq_tail_ = 0;
    std::uint32_t reads_in_flight_ = 0;
    std::uint64_t rnr_seq_ = UINT64_MAX;
    std::uint32_t rnr_tries_ = 0;
    bool rnr_active_ = false; ///< waiting out an RNR delay: no request may start

    std::vector<rq_entry> rq_;
    std::vector<seg> rq_segs_;
    std::uint64_t rq_head_ = 0, rq_tail_ = 0;

    completion_ring cq_;
    notify_arm notify_;

    // Responses owed to the peer: bounded; when full, reading stops (TCP backpressure).
    std::vector<response> resp_;
    std::uint64_t resp_head_ = 0, resp_tail_ = 0;

    // Transmit state.
    tx_item cur_; ///< the frame partly on the wire; it must finish before another starts
    tx_batch batch_;
    bool write_armed_ = false;
    bool tx_done_ = false; ///< write side shut down or broken: nothing more is sent
    bool in_pump_ = false;

    // Receive state.
    // Staging: a read that starts a frame goes here, so that headers, frames without a
    // payload (ACKs, read requests) and small payloads arrive several to one system call.
    // Payload bytes that came with their header are copied out (at most stage_size per
    // frame); the rest of a payload is read straight into its destination.
    static constexpr std::size_t stage_size = 1024;
    std::byte stage_[stage_size];
    std::size_t stage_begin_ = 0, stage_end_ = 0; ///< unconsumed bytes: [begin, end)
    bool rx_short_ = false;       ///< a read in this receive run returned less than asked: drained
    bool rx_cont_posted_ = false; ///< continue_rx() is on its way
    frame_header rx_hdr_;
    rx_action rx_action_ = rx_action::none;
    std::uint64_t rx_left_ = 0;
    const seg* rx_segs_ = nullptr;
    std::uint32_t rx_nseg_ = 0, rx_seg_i_ = 0;
    std::uint64_t rx_seg_off_ = 0;
    bool rx_fault_ = false; ///< a destination region vanished during the payload
    seg rx_target_;
    std::uint64_t rx_expect_ = 0; ///< next request sequence number from the peer
    bool rnr_wait_ = false;       ///< we NAKed rx_expect_ with RNR: drop later requests
    bool read_armed_ = false;
    int rcvlowat_ = 1;               ///< the socket's SO_RCVLOWAT (set_rcvlowat)
    std::uint64_t rx_bytes_ = 0;     ///< bytes read from the socket (frames, not the drain)
    std::uint64_t tx_bytes_ = 0;     ///< bytes the socket took
    std::uint64_t arrived_seen_ = 0; ///< rx_bytes_ + unread bytes at the progress check's last look
    bool reclaim_posted_ = false;    ///< request_notify() asked the engine to take it back
    poll_ownership ownership_;       ///< who reads and sends: the engine or a polling application
    bool rx_stalled_ = false;        ///< stopped reading because the response ring is full
    bool rx_done_ = false;           ///< EOF, error, or violation: nothing more is read
    bool lingering_ = false;         ///< the connection object is gone: finishing what is owed
    bool closed_ = false;            ///< the socket is closed (or being closed): nothing more happens
    bool violation_logged_ = false;
    std::byte app_discard_[4096]; ///< rx_poll's sink for payload that is dropped

    // Asio operations of this connection come from here (never the heap); declared before
    // the objects whose waits use it.
    handler_memory hmem_;
    asio::posix::stream_descriptor desc_; ///< engine thread only: readiness waits and close
    asio::steady_timer rnr_timer_;
    /// The stand-down and transmit checks' interval (connection_options::tcp_takeover_check).
    const std::chrono::microseconds takeover_check_;
    asio::steady_timer standdown_timer_;
    asio::steady_timer tx_check_timer_; ///< app_keeps_tx() outside a stand-down
    asio::steady_timer linger_timer_;   ///< bounds start_linger() by progress_timeout_
    bool tx_check_armed_ = false;

    // Liveness: while requests are outstanding, some byte must move (either way) at least
    // every progress_timeout_ (ack_timeout * (retry_count + 1)), or the peer is declared
    // dead (transport_retry_exceeded), as a verbs QP does after its retries.
    const std::chrono::steady_clock::duration progress_timeout_;
    std::chrono::steady_clock::time_point last_progress_ = std::chrono::steady_clock::now();
    std::uint64_t progress_seen_ = 0; ///< rx_bytes_ + tx_bytes_ at the progress check's last look
    asio::steady_timer progress_timer_;
};

} // namespace rdmx::tcp
