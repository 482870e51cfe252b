#include "cm/event_loop.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "log.hpp"
#include "verbs/shared_receive_queue.hpp"
#include "verbs/verbs_connection.hpp"

namespace rdmx::cm
{
namespace
{
// IB CM reject reasons (IBTA table 112) that rdma_cm reports as the REJECTED status.
// Every other reason, IB_CM_REJ_CONSUMER_DEFINED (28, rdma_reject) first of all, is a rejection.
constexpr int ib_rej_invalid_service_id = 8; // nobody listens on that port
} // namespace

namespace
{
std::atomic<void (*)()> after_poll_hook{nullptr};
} // namespace

void set_after_poll_hook(void (*hook)()) noexcept
{
    after_poll_hook.store(hook, std::memory_order_release);
}

void set_nonblocking(int fd, const char* what)
{
    int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        throw_errno(errno, what);
}

const char* event_name(rdma_cm_event_type t) noexcept
{
    // rdma_event_str() exists, but ours is noexcept and never returns null.
    const char* s = rdma_event_str(t);
    return s ? s : "RDMA_CM_EVENT_?";
}

std::error_code event_error(const rdma_cm_event& ev) noexcept
{
    switch (ev.event) {
    case RDMA_CM_EVENT_REJECTED:
        if (ev.status == ib_rej_invalid_service_id || ev.status == -ECONNREFUSED)
            return errc::connection_refused;
        return errc::rejected;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE: return ev.status == -ETIMEDOUT ? errc::timed_out : errc::unreachable;
    case RDMA_CM_EVENT_CONNECT_ERROR: return ev.status == -ETIMEDOUT ? errc::timed_out : errc::unreachable;
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return errc::no_device;
    default: return errc::disconnected;
    }
}

event_loop::event_loop(ibv_context* ctx) : ctx_(ctx), channel_(rdma_create_event_channel())
{
    if (!channel_)
        throw_errno(errno, "rdma_create_event_channel");
    // Non-blocking: poll() may report an event that rdma_destroy_id() discards before we
    // fetch it (the kernel drops a destroyed id's queued events), and a blocking
    // rdma_get_cm_event() would then sleep until some other event came, perhaps never,
    // and ~event_loop would wait for this thread forever.
    set_nonblocking(channel_->fd, "fcntl(rdma_cm event channel, O_NONBLOCK)");
    // The context's async fd too (shared by every domain on the device, so a second loop
    // that finds the event already taken gets EAGAIN instead of blocking).
    set_nonblocking(ctx_->async_fd, "fcntl(ibv_context async fd, O_NONBLOCK)");
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0)
        throw_errno(errno, "eventfd");
    thread_ = std::thread([this] { run(); });
}

event_loop::~event_loop()
{
    stop_.store(true);
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
    thread_.join();
    ::close(wake_fd_);
}

void event_loop::attach(rdma_cm_id* id, cm_state* state)
{
    std::lock_guard lock(mutex_);
    ids_[id] = state;
}

void event_loop::detach_current(const cm_id_ptr& owner)
{
    std::lock_guard lock(mutex_);
    if (owner)
        ids_.erase(owner.get());
}

void event_loop::detach(rdma_cm_id* id)
{
    std::lock_guard lock(mutex_);
    ids_.erase(id);
}

void event_loop::kick() noexcept
{
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

int event_loop::expire_deadlines() noexcept
{
    const auto now = std::chrono::steady_clock::now();
    auto next = std::chrono::steady_clock::time_point::max();
    // Drivers whose address resolution timed out with another address left: stepped after
    // the walk, since a step replaces its id in ids_.
    std::vector<cm_state::driver*> retry;
    for (auto& [id, st] : ids_) {
        std::lock_guard lock(st->mutex);
        if (st->state != connection_state::connecting ||
            st->deadline == std::chrono::steady_clock::time_point::max())
            continue;
        if (st->deadline <= now && st->spare_address && st->resolved == resolve_step::none && st->drive) {
            st->addr_failed = true; // the next address, on the driver's step below
            st->deadline = std::chrono::steady_clock::time_point::max();
            retry.push_back(st->drive);
            continue;
        }
        if (st->deadline <= now) {
            st->state = connection_state::error;
            st->error = errc::timed_out;
            st->what = "no answer within connection_options::timeout";
            st->deadline = std::chrono::steady_clock::time_point::max();
            verbs::flush_qp(st->qp);
            st->report();
            st->changed.notify_all();
            continue;
        }
        next = std::min(next, st->deadline);
    }
    for (auto* d : retry)
        d->step();
    if (!retry.empty())
        return 0; // the new ids' deadlines: computed on the next turn
    if (next == std::chrono::steady_clock::time_point::max())
        return -1;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
    return static_cast<int>(std::min<std::int64_t>(ms, 1 << 30));
}

void event_loop::run() noexcept
{
    pollfd fds[3] = {{channel_->fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}, {ctx_->async_fd, POLLIN, 0}};
    for (;;) {
        int timeout;
        {
            std::lock_guard lock(mutex_);
            timeout = expire_deadlines();
        }
        if (::poll(fds, 3, timeout) < 0) {
            if (errno == EINTR)
                continue;
            RDMX_LOG(error, "cm event loop: poll: %s", std::strerror(errno));
            return;
        }
        if (fds[1].revents) {
            if (stop_.load())
                return;
            std::uint64_t v;
            [[maybe_unused]] auto n = ::read(wake_fd_, &v, sizeof v);
        }
        if (fds[2].revents)
            drain_async();
        if (fds[0].revents)
            if (auto hook = after_poll_hook.load(std::memory_order_acquire))
                hook();
        // Drain what is queued; EAGAIN means nothing (left), not an error.
        for (;;) {
            rdma_cm_event* ev = nullptr;
            if (rdma_get_cm_event(channel_.get(), &ev) != 0) {
                if (errno != EAGAIN && errno != EINTR)
                    RDMX_LOG(error, "cm event loop: rdma_get_cm_event: %s", std::strerror(errno));
                break;
            }
            {
                std::lock_guard lock(mutex_);
                if (auto it = ids_.find(ev->id); it != ids_.end()) {
                    cm_state& st = *it->second;
                    handle(*ev, st);
                    // The next step of a flow started without waiting: after handle()
                    // let go of st.mutex (the step takes other locks first).
                    if (st.drive)
                        st.drive->step();
                }
                // else: the id was detached (its connection is being destroyed); acking
                // below lets rdma_destroy_id return.
            }
            rdma_ack_cm_event(ev);
        }
    }
}

void event_loop::handle(rdma_cm_event& ev, cm_state& st) noexcept
{
    std::lock_guard lock(st.mutex);
    // The provider's answer to a connect or accept: iw_cm reports it (the connect reply or
    // the connection) only after it stopped holding the QP and the id for it.
    if (ev.event == RDMA_CM_EVENT_ESTABLISHED || ev.event == RDMA_CM_EVENT_REJECTED ||
        ev.event == RDMA_CM_EVENT_UNREACHABLE || ev.event == RDMA_CM_EVENT_CONNECT_ERROR)
        st.connect_unanswered = false;
    auto fail = [&] {
        st.error = event_error(ev);
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s (status %d%s%s)", event_name(ev.event), ev.status,
                      ev.status < 0 ? ": " : "", ev.status < 0 ? std::strerror(-ev.status) : "");
        st.what = buf;
        st.state = connection_state::error;
    };
    auto copy_private = [&] {
        auto* p = static_cast<const std::byte*>(ev.param.conn.private_data);
        st.private_data.assign(p, p + (p ? ev.param.conn.private_data_len : 0));
    };
    // An accept's: the user's bytes, and where the peer wants our goodbye.
    auto take_accept_private = [&] {
        auto* p = static_cast<const std::byte*>(ev.param.conn.private_data);
        const auto d = decode_private_data({p, p ? ev.param.conn.private_data_len : 0u});
        st.private_data.assign(d.user.begin(), d.user.end());
        st.peer_goodbye = d.peer;
    };
    switch (ev.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: st.resolved = resolve_step::addr_resolved; break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: st.resolved = resolve_step::route_resolved; break;
    case RDMA_CM_EVENT_ESTABLISHED:
        // iWARP's active side (on RoCE and IB it gets CONNECT_RESPONSE instead): the reads
        // the peer serves, as siw reports them in the MPA reply; limits() says what we got.
        if (st.max_rd_atomic && st.resolved != resolve_step::none && ev.param.conn.initiator_depth)
            *st.max_rd_atomic = std::min<std::uint32_t>(*st.max_rd_atomic, ev.param.conn.initiator_depth);
        // On the client this carries the accept's private data; on the server it is empty.
        if (ev.param.conn.private_data_len && st.private_data.empty() && !st.peer_goodbye)
            take_accept_private();
        if (st.state == connection_state::connecting) {
            st.state = connection_state::established;
            if (st.sendable)
                st.sendable->store(true, std::memory_order_release);
        }
        break;
    case RDMA_CM_EVENT_REJECTED:
        copy_private();
        fail();
        break;
    case RDMA_CM_EVENT_ADDR_ERROR:
        if (st.spare_address && st.state == connection_state::connecting) {
            st.addr_failed = true; // the driver tries the next address
            break;
        }
        fail();
        break;
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE: fail(); break;
    case RDMA_CM_EVENT_DISCONNECTED:
        // The peer left. Our QP goes to the error state, which flushes every posted work
        // request with IBV_WC_WR_FLUSH_ERR: nothing waits forever.
        // An rdmx peer wrote its goodbye before it disconnected (cm_connection::disconnect);
        // without it the peer's process died and its kernel sent this DREQ (or closed the
        // stream, on iWARP). A flushed completion may have said `disconnected` already
        // (siw flushes before this event): the cause replaces it.
        rdma_disconnect(ev.id);
        verbs::flush_qp(st.qp);
        if (st.state == connection_state::established || st.state == connection_state::connecting ||
            (st.state == connection_state::disconnected && !st.local_disconnect)) {
            if (st.peer_vanished())
                st.lose_peer("RDMA_CM_EVENT_DISCONNECTED without the peer's goodbye: its process died or "
                             "its connection was destroyed under it");
            else
                st.state = connection_state::disconnected;
        }
        break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        rdma_disconnect(ev.id);
        verbs::flush_qp(st.qp);
        fail();
        break;
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
        // The QP left timewait and could be reused; rdmx never reuses QPs.
        break;
    case RDMA_CM_EVENT_ADDR_CHANGE:
        // The netdev's address changed; the established connection is unaffected until the
        // peer becomes unreachable, which then surfaces as transport retries exceeded.
        break;
    case RDMA_CM_EVENT_CONNECT_REQUEST:
        // Only listening ids get requests, and those live on the listener's own channel.
        break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        // Our QPs are not rdma_cm's, so the active side gets this instead of ESTABLISHED:
        // connect() moves the QP to RTR and RTS and calls rdma_establish.
        take_accept_private();
        st.responded = true;
        break;
    case RDMA_CM_EVENT_MULTICAST_JOIN:
    case RDMA_CM_EVENT_MULTICAST_ERROR:
        // rdmx does not join multicast groups (RC only).
        break;
    default:
        // Event types newer than this code: nothing to do, but say so once.
        RDMX_LOG(warn, "ignoring unexpected rdma_cm event %s", event_name(ev.event));
        break;
    }
    st.report();
    st.changed.notify_all();
}

namespace
{

struct qp_route {
    cm_state* st;
    ibv_cq* send_cq;
    ibv_cq* recv_cq;
    rdma_cm_id* id;
};
// Lock order: routes_mutex, then a cm_state's mutex (or a shared receive queue's event queue).
std::mutex routes_mutex;
std::unordered_map<ibv_qp*, qp_route> routes;
std::unordered_map<ibv_srq*, verbs::shared_receive_queue*> srq_routes;

// Marks the connection failed by `ev` (its QP is in the error state already).
void async_fail(cm_state& st, std::error_code ec, const char* why) noexcept
{
    std::lock_guard lock(st.mutex);
    // A generic failure (IBV_EVENT_QP_FATAL) of a connection whose rdmx peer never said
    // goodbye: the peer vanished (siw fails the QP when the dead process's stream is
    // reset), which is what the same death reads as on rxe and TCP.
    if (ec == errc::completion_error && st.peer_vanished()) {
        if (st.state == connection_state::established || st.state == connection_state::connecting ||
            st.state == connection_state::disconnected) {
            st.lose_peer(why);
            st.report();
            st.changed.notify_all();
        }
        return;
    }
    // A disconnect this side did not ask for, or a lost peer, may be followed by the event
    // that caused it (the CM's DISCONNECTED can overtake it): the cause wins.
    if (st.state == connection_state::established || st.state == connection_state::connecting ||
        st.guess_yields_to(ec)) {
        st.state = connection_state::error;
        st.error = ec;
        st.what = why;
        st.report();
        st.changed.notify_all();
    }
}

void route_async(ibv_async_event& ev, ibv_context* ctx) noexcept
{
    std::lock_guard lock(routes_mutex);
    auto qp_route_of = [&]() -> qp_route* {
        auto it = routes.find(ev.element.qp);
        return it == routes.end() ? nullptr : &it->second;
    };
    switch (ev.event_type) {
    case IBV_EVENT_QP_ACCESS_ERR:
        if (auto* r = qp_route_of())
            async_fail(*r->st, errc::remote_access,
                       "IBV_EVENT_QP_ACCESS_ERR: a request of the peer violated this side's access rights");
        break;
    case IBV_EVENT_QP_REQ_ERR:
        if (auto* r = qp_route_of())
            async_fail(*r->st, errc::remote_invalid_request,
                       "IBV_EVENT_QP_REQ_ERR: the peer sent an invalid request");
        break;
    case IBV_EVENT_QP_FATAL:
        if (auto* r = qp_route_of())
            async_fail(*r->st, errc::completion_error, "IBV_EVENT_QP_FATAL: the queue pair failed");
        break;
    case IBV_EVENT_COMM_EST:
        // A message arrived before the connection's RTU (the passive side's ESTABLISHED):
        // tell rdma_cm, which cannot see our QP (rdma_notify(3)).
        if (auto* r = qp_route_of())
            rdma_notify(r->id, IBV_EVENT_COMM_EST);
        break;
    case IBV_EVENT_CQ_ERR:
        // A CQ overrun (rdmx sizes CQs for both queues and counts them, so a provider bug):
        // every connection reporting to it, many on a shared CQ.
        for (auto& [qp, r] : routes)
            if (r.send_cq == ev.element.cq || r.recv_cq == ev.element.cq)
                async_fail(*r.st, errc::completion_error, "IBV_EVENT_CQ_ERR: completion queue overrun");
        break;
    case IBV_EVENT_DEVICE_FATAL:
        for (auto& [qp, r] : routes)
            if (qp->context == ctx)
                async_fail(*r.st, errc::no_device, "IBV_EVENT_DEVICE_FATAL: the RDMA device failed");
        break;
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
        // rdmx neither drains (SQD) nor loads alternate paths.
        break;
    case IBV_EVENT_SRQ_LIMIT_REACHED:
        // The low watermark armed with arm_limit(): the queue tells its event queue (the
        // device disarmed the limit).
        if (auto it = srq_routes.find(ev.element.srq); it != srq_routes.end())
            it->second->limit_reached();
        break;
    case IBV_EVENT_SRQ_ERR:
        // The SRQ failed (a device error): its connections fail through their own QPs'
        // events and completions; say so once for the queue itself.
        RDMX_LOG(error, "IBV_EVENT_SRQ_ERR: a shared receive queue failed");
        break;
    case IBV_EVENT_QP_LAST_WQE_REACHED:
        // A QP on a shared receive queue left for the error state and consumes nothing
        // more: its destructor waits for this before destroying it.
        if (auto* r = qp_route_of()) {
            std::lock_guard st_lock(r->st->mutex);
            r->st->last_wqe_reached = true;
            r->st->changed.notify_all();
        }
        break;
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
        // Port events: a connection that loses its path fails through its own retries and
        // the CM's events.
        break;
    default:
        // Newer event types (WQ_FATAL: work queues, which rdmx does not use).
        break;
    }
}

} // namespace

void register_qp(ibv_qp* qp, ibv_cq* send_cq, ibv_cq* recv_cq, rdma_cm_id* id, cm_state* st)
{
    std::lock_guard lock(routes_mutex);
    routes[qp] = {st, send_cq, recv_cq, id};
}

void unregister_qp(ibv_qp* qp) noexcept
{
    std::lock_guard lock(routes_mutex);
    routes.erase(qp);
}

void register_srq(ibv_srq* srq, verbs::shared_receive_queue* q)
{
    std::lock_guard lock(routes_mutex);
    srq_routes[srq] = q;
}

void unregister_srq(ibv_srq* srq) noexcept
{
    std::lock_guard lock(routes_mutex);
    srq_routes.erase(srq);
}

void event_loop::drain_async() noexcept
{
    ibv_async_event ev;
    while (ibv_get_async_event(ctx_, &ev) == 0) {
        route_async(ev, ctx_);
        // After routing: ibv_destroy_qp waits for this, and the route is gone by then.
        ibv_ack_async_event(&ev);
    }
}

namespace
{

// Waits until `done()` holds, the connection failed, or `timeout` passed; the caller's
// verb leads every message.
template <class Done>
void wait_until(cm_state& st, Done done, const char* verb, std::chrono::milliseconds timeout)
{
    std::unique_lock lock(st.mutex);
    bool settled = st.changed.wait_for(lock, timeout, [&] {
        return done() || st.state == connection_state::error || st.state == connection_state::disconnected;
    });
    if (!settled)
        throw error(make_error_code(errc::timed_out),
                    std::string(verb) + ": no answer within " + std::to_string(timeout.count()) + " ms");
    if (st.state == connection_state::error)
        throw error(st.error, std::string(verb) + ": " + st.what, st.private_data);
    if (!done())
        throw error(make_error_code(errc::disconnected), std::string(verb) + ": peer disconnected");
}

} // namespace

void event_loop::wait_for(cm_state& st, connection_state target, const char* verb,
                          std::chrono::milliseconds timeout)
{
    wait_until(
        st, [&] { return st.state == target; }, verb, timeout);
}

} // namespace rdmx::cm
