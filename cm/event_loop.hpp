// The rdma_cm event flow of a verbs domain. One event channel and one thread per domain
// receive the events of every connecting and connected cm_id; a switch over
// rdma_cm_event_type turns each into a state change of that connection (rping's pattern),
// then a connecting one's driver takes its next step (cm_flow.cpp); a thread that called
// connect() or accept() waits for the state to settle.
#pragma once

#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include <rdmx/connection.hpp>

#include "cm/cm_handles.hpp"
#include "cm/private_data.hpp"
#include "connection_events.hpp"
#include "verbs/qp_end.hpp"

namespace rdmx::verbs
{
class shared_receive_queue;
}

namespace rdmx::cm
{

/// The active side's resolution steps, as rdma_cm reports them. Internal: the public
/// connection_state is `connecting` throughout (TCP has no such steps, and a user of either
/// backend can do nothing with them).
enum class resolve_step : std::uint8_t { none, addr_resolved, route_resolved };

/// Connection-management state of one cm_id, written by the event thread.
struct cm_state {
    std::mutex mutex;
    std::condition_variable changed;
    connection_state state = connection_state::connecting;
    resolve_step resolved = resolve_step::none;
    std::error_code error; ///< set with state == error
    std::string what;      ///< the event and status that caused `error`
    /// The user's bytes from CONNECT_RESPONSE / ESTABLISHED (cm/private_data.hpp), or all
    /// of a REJECTED's.
    std::vector<std::byte> private_data;
    /// Where the peer wants this side's goodbye (from its connect or accept); none: the
    /// peer is not rdmx and sends none either.
    std::optional<goodbye_target> peer_goodbye;
    /// This side's goodbye flag: the peer writes it nonzero before it disconnects.
    const std::uint64_t* goodbye_flag = nullptr;
    bool responded = false; ///< CONNECT_RESPONSE arrived (active side)
    /// iWARP: rdma_connect or rdma_accept went out and no event of the id came since. Until
    /// the provider answers, the kernel holds the QP and the id (destroying either waits
    /// for the answer: siw's MPA timer), so the connection's destructor leaves them to the
    /// domain's reaper (cm/reaper.hpp).
    bool connect_unanswered = false;
    /// The active side has another address to try (a name that resolved to several): a
    /// failed address resolution, or its deadline, sets addr_failed instead of failing the
    /// connection, and the driver's step() goes on with the next address.
    bool spare_address = false;
    bool addr_failed = false;
    /// disconnect() was called here: a later asynchronous event is no news (otherwise one
    /// that follows a disconnect still names its cause, state error).
    bool local_disconnect = false;
    ibv_qp* qp = nullptr; ///< moved to the error state when the peer leaves
    /// IBV_EVENT_QP_LAST_WQE_REACHED arrived: the QP (attached to a shared receive queue)
    /// consumes no more of its receives and may be destroyed.
    bool last_wqe_reached = false;
    /// The connection's event queue; report() after every change of `state`.
    detail::connection_events events;
    /// Set true when the connection becomes established (verbs_connection::sendable_).
    std::atomic<bool>* sendable = nullptr;
    /// Raised by report() once `state` says the connection ended (verbs/qp_end.hpp).
    verbs::qp_end* end = nullptr;
    /// The connection's limits().max_rd_atomic, lowered by ESTABLISHED on iWARP's active side.
    std::uint32_t* max_rd_atomic = nullptr;

    // --- a connection started without waiting (start_connect / start_accept) ---
    /// The flow's next step, run on the event loop thread after each event of the id
    /// (outside this mutex, with the loop's own held, so the connection cannot go away).
    struct driver {
        virtual void step() noexcept = 0;
    };
    driver* drive = nullptr;
    /// While `connecting`: the deadline of the current step; the loop fails the connection
    /// with errc::timed_out when it passes. Written before attach() and then by the loop.
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

    /// Tells the event queue (if any) about `state`; with `mutex` held.
    void report() noexcept
    {
        events.report(state, error, !local_disconnect);
        if (end && (state == connection_state::error || state == connection_state::disconnected))
            end->raise();
    }

    /// The peer left without the goodbye an rdmx peer writes before it disconnects: its
    /// process died, or its connection was torn down under it. With `mutex` held.
    bool peer_vanished() const noexcept
    {
        if (local_disconnect || !peer_goodbye || !goodbye_flag)
            return false;
        // Written by the device (the peer's RDMA write), read here.
        return std::atomic_ref<const std::uint64_t>(*goodbye_flag).load(std::memory_order_acquire) == 0;
    }
    /// Marks the connection `error` (errc::peer_lost) for a peer that vanished; with
    /// `mutex` held.
    void lose_peer(const char* why) noexcept
    {
        state = connection_state::error;
        error = make_error_code(errc::peer_lost);
        what = why;
    }
    /// The connection ended for a reason this side could only guess (a disconnect it did
    /// not ask for, or a lost peer), and `cause` (an error completion's status or an
    /// access event, arriving later) is more precise, so it replaces the guess: either can
    /// be overtaken by the DISCONNECTED or flush it caused (siw terminates the connection
    /// first and tells the cause after). A peer that vanished explains retries running out,
    /// this side's QP failing its operation and a generic failure, so those do not replace
    /// peer_lost. With `mutex` held.
    bool guess_yields_to(std::error_code cause) const noexcept
    {
        if (local_disconnect)
            return false;
        if (state == connection_state::disconnected)
            return true;
        return state == connection_state::error && error == errc::peer_lost &&
               cause != errc::completion_error && cause != errc::transport_retry_exceeded &&
               cause != errc::rnr_retry_exceeded && cause != errc::local_qp_operation;
    }
};

/// Routes the device's asynchronous events (ibv_get_async_event) of `qp` to `st`, and
/// those of its CQs too (`send_cq`, `recv_cq`: the same one, or a shared one that many
/// QPs report to). One process-wide table: librdmacm opens each device once per
/// process, so every domain on a device shares its context and its async event queue,
/// and whichever domain's event loop reads an event finds the QP it names here.
/// `id` gets rdma_notify(COMM_EST). Call unregister_qp before destroying the QP.
void register_qp(ibv_qp* qp, ibv_cq* send_cq, ibv_cq* recv_cq, rdma_cm_id* id, cm_state* st);
void unregister_qp(ibv_qp* qp) noexcept;
/// Routes IBV_EVENT_SRQ_LIMIT_REACHED of `srq` to `q` (the same process-wide table).
/// Call unregister_srq before destroying it.
void register_srq(ibv_srq* srq, verbs::shared_receive_queue* q);
void unregister_srq(ibv_srq* srq) noexcept;

/// Tests only: `hook` runs on every event loop thread each time poll() has found its
/// channel readable, before the events are read (null: none). It widens, on purpose, the
/// window in which rdma_destroy_id can discard an event that poll() announced.
void set_after_poll_hook(void (*hook)()) noexcept;

/// Sets O_NONBLOCK on `fd` (an event channel's); throws naming `what` on failure.
void set_nonblocking(int fd, const char* what);

/// "RDMA_CM_EVENT_REJECTED" etc.
const char* event_name(rdma_cm_event_type t) noexcept;

/// Maps a failure event (and its status) to an rdmx code.
std::error_code event_error(const rdma_cm_event& ev) noexcept;

class event_loop
{
public:
    /// `ctx`: the device whose asynchronous events this loop reads too.
    explicit event_loop(ibv_context* ctx);
    ~event_loop();
    event_loop(const event_loop&) = delete;
    event_loop& operator=(const event_loop&) = delete;

    rdma_event_channel* channel() const noexcept { return channel_.get(); }

    /// Routes events of `id` to `state` (call before the first rdma_cm call on the id).
    void attach(rdma_cm_id* id, cm_state* state);
    /// Stops routing; waits for a handler running on `id` to finish. Events that arrive
    /// afterwards are acknowledged and dropped, so rdma_destroy_id cannot block forever.
    void detach(rdma_cm_id* id);
    /// detach() of the id that `owner` holds now, read under the loop's lock: a driver's
    /// step (on the loop thread, with that lock) may replace it by a fresh id meanwhile
    /// (cm_connection::resolve_address). After it no step of that driver runs.
    void detach_current(const cm_id_ptr& owner);
    /// For a driver's step on the loop thread (which holds the loop's lock already): the
    /// id's events go to `state` from now on, instead of to the id's previous state.
    void attach_from_loop(rdma_cm_id* id, cm_state* state) { ids_[id] = state; }
    /// detach() for a driver's step on the loop thread.
    void detach_from_loop(rdma_cm_id* id) { ids_.erase(id); }
    /// Wakes the loop so that it sees a new deadline.
    void kick() noexcept;

    /// Waits until `st` reaches `target` (true), fails (throws rdmx::error naming `verb`
    /// and the event), or `timeout` passes (throws errc::timed_out).
    static void wait_for(cm_state& st, connection_state target, const char* verb,
                         std::chrono::milliseconds timeout);

private:
    void run() noexcept;
    void handle(rdma_cm_event& ev, cm_state& st) noexcept;
    /// Reads the device's pending asynchronous events (non-blocking) and acknowledges each.
    void drain_async() noexcept;

    ibv_context* ctx_;
    event_channel_ptr channel_;
    /// Fails the connecting states whose deadline passed; returns the poll timeout (ms, -1:
    /// none) until the next one. With mutex_ held.
    int expire_deadlines() noexcept;

    int wake_fd_ = -1; ///< eventfd that wakes run(): to stop (stop_), or for a new deadline
    std::atomic<bool> stop_{false};
    std::mutex mutex_; ///< guards ids_ and serialises handlers with detach()
    std::unordered_map<rdma_cm_id*, cm_state*> ids_;
    std::thread thread_; ///< last: started after everything it uses exists
};

} // namespace rdmx::cm
