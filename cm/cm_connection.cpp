// A verbs connection's rdma_cm side outside the flow itself: QP transitions, state,
// disconnect, tear-down.
#include "cm/cm_connection.hpp"

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <set>
#include <string>

#include "cm/cm_domain.hpp"
#include "log.hpp"

namespace rdmx::cm
{

cm_connection::cm_connection(cm_domain& dom, const connection_options& opts, std::string_view verb)
    : verbs_connection(dom.pd(), dom.shared_from_this(), opts, verb), domain_(dom), opts_(opts),
      goodbye_words_(new std::uint64_t[2]{0, 1})
{
    goodbye_mr_.reset(ibv_reg_mr(domain_.native_pd(), goodbye_words_.get(), 2 * sizeof(std::uint64_t),
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    if (!goodbye_mr_)
        throw_errno(errno, "ibv_reg_mr(goodbye flag)");
    cm_.goodbye_flag = &goodbye_words_[0];
    // Terminal events for every connection with a queue; `established` only for the
    // started ones (begin_started binds again with that).
    cm_.events.bind(opts.events, this, opts.context, false);
}

cm_connection::~cm_connection()
{
    // Destroying it is a disconnect, not a crash: the peer gets the goodbye first.
    say_goodbye();
    // After this no step() runs: id_ and call_ are final.
    domain_.events().detach_current(id_);
    // An rdma_connect still running on its thread (iWARP) reports its failure no more.
    if (call_)
        call_->abandon();
    if (qp()) {
        if (srq())
            await_last_wqe(); // an unanswered QP is in INIT still: no wait
        unregister_qp(qp());  // waits for a router using it; then destroy waits for its acks
    }
    bool unanswered;
    {
        // No event loop, async handler or rdma_connect thread reaches cm_ any more (so
        // connect_unanswered is final); poll() is the caller's.
        std::lock_guard lock(cm_.mutex);
        cm_.events.close();
        unanswered = cm_.connect_unanswered;
    }
    drop_completions(); // with a shared receive queue: frees the slots nobody will poll
    if (unanswered || call_) {
        // iWARP, the provider has not answered the connect or accept: destroying the QP
        // or the id would wait for it (siw: up to its 10 s MPA timer). The domain's
        // reaper does that instead; this connection's other resources go now. An
        // rdma_connect that has not returned even uses the id still: its thread hands
        // them to the reaper when it does.
        std::unique_ptr<connection_remains> rest;
        try {
            rest = std::make_unique<connection_remains>();
            rest->keepalive = domain_.shared_from_this();
        } catch (...) { // no memory: destroyed below, waiting
        }
        if (rest) {
            const std::uint32_t qpn = qp() ? qp()->qp_num : 0;
            rest->queues.emplace(take_queues());
            rest->id = std::move(id_);
            rest->retired_ids = std::move(retired_ids_);
            if (call_ && call_->hand_over(rest, domain_.reaper_thread())) {
                RDMX_LOG(debug,
                         "QP %u: its rdma_connect has not returned (the peer's host has not answered the "
                         "stream); destroyed once it does",
                         qpn);
                return;
            }
            if (unanswered) {
                RDMX_LOG(debug,
                         "QP %u: the provider has not answered its connect; the domain's reaper destroys it",
                         qpn);
                domain_.reaper_thread().adopt(std::move(rest));
                return;
            }
            rest.reset(); // the call has returned and the provider answered: nothing to wait for
            return;
        }
        if (call_)
            call_->wait();
    }
    destroy_queues(); // QP (off its shared CQs), CQ, completion channel
    id_.reset();      // waits until every event of the id was acknowledged
    retired_ids_.clear();
}

namespace
{

// Devices that never reported IBV_EVENT_QP_LAST_WQE_REACHED (rxe on Linux 6.1 does not)
// and those that did, process-wide: waiting out the bound on every QP of a device that
// never says it would make each tear-down take that long. A device that reported it once
// is always waited for.
std::mutex last_wqe_mutex;
std::set<std::string> last_wqe_reporting, last_wqe_silent;

} // namespace

void cm_connection::await_last_wqe() noexcept
{
    // The device requires it of a QP on a shared receive queue: to error, then wait for
    // IBV_EVENT_QP_LAST_WQE_REACHED before destroying it, or a receive it consumed may
    // complete into a destroyed QP's CQ (IBTA 10.3.1, ibv_destroy_qp(3)). A QP that never
    // reached RTR consumed nothing and gets no such event.
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (ibv_query_qp(qp(), &attr, IBV_QP_STATE, &init) == 0 &&
        (attr.qp_state == IBV_QPS_RESET || attr.qp_state == IBV_QPS_INIT))
        return;
    verbs::flush_qp(qp());
    const std::string& dev = domain_.limits().device_name;
    try {
        std::lock_guard memo(last_wqe_mutex);
        if (last_wqe_silent.count(dev))
            return;
    } catch (...) { // std::string compare cannot throw; the lock could, in theory
    }
    std::unique_lock lock(cm_.mutex);
    const bool reached = cm_.changed.wait_for(lock, last_wqe_timeout, [&] { return cm_.last_wqe_reached; });
    lock.unlock();
    try {
        std::lock_guard memo(last_wqe_mutex);
        if (reached) {
            last_wqe_reporting.insert(dev);
        } else if (!last_wqe_reporting.count(dev)) {
            last_wqe_silent.insert(dev);
            RDMX_LOG(warn,
                     "device %s: no IBV_EVENT_QP_LAST_WQE_REACHED within %lld ms of moving a QP on a shared "
                     "receive queue to error; it seems not to report it: QPs on it are destroyed without "
                     "waiting from now on",
                     dev.c_str(), static_cast<long long>(last_wqe_timeout.count()));
        } else {
            RDMX_LOG(warn,
                     "QP %u on a shared receive queue: no IBV_EVENT_QP_LAST_WQE_REACHED within %lld ms; "
                     "destroying it anyway",
                     qp()->qp_num, static_cast<long long>(last_wqe_timeout.count()));
        }
    } catch (...) { // an allocation in insert: the memo stays as it was
    }
}

void cm_connection::mark_unanswered(bool pending) noexcept
{
    if (!domain_.iwarp())
        return;
    std::lock_guard lock(cm_.mutex);
    cm_.connect_unanswered = pending;
}

void cm_connection::setup_qp()
{
    create_qp();
    {
        std::lock_guard lock(cm_.mutex);
        cm_.qp = qp();
        cm_.end = &end_;
        cm_.max_rd_atomic = max_rd_atomic_slot();
    }
    register_qp(qp(), send_cq(), recv_cq(), id_.get(), &cm_);
    modify_qp(IBV_QPS_INIT);
}

void cm_connection::modify_qp(ibv_qp_state to, std::uint8_t rd_atomic)
{
    ibv_qp_attr attr{};
    int mask = 0;
    attr.qp_state = to;
    if (rdma_init_qp_attr(id_.get(), &attr, &mask))
        throw_errno(errno, "rdma_init_qp_attr");
    const char* verb = "ibv_modify_qp(INIT)";
    if (to == IBV_QPS_INIT && domain_.iwarp()) {
        // iWARP: until the connection exists rdma_cm grants the active side's QP no remote
        // access at all (rdma_init_qp_attr has no iw_cm id to ask), and we never get a
        // second INIT there: the provider takes the QP to RTS when the connection comes
        // up. siw does not check QP access rights, hardware iWARP does: grant what we serve
        // now, on both sides (remote write always, remote read as we accept reads).
        attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        mask |= IBV_QP_ACCESS_FLAGS;
    } else if (to == IBV_QPS_RTR) {
        verb = "ibv_modify_qp(RTR)";
        attr.min_rnr_timer = opts_.min_rnr_timer & 31;
        mask |= IBV_QP_MIN_RNR_TIMER;
        if (rd_atomic)
            attr.max_dest_rd_atomic = rd_atomic;
    } else if (to == IBV_QPS_RTS) {
        verb = "ibv_modify_qp(RTS)";
        // Local ACK timeout: 4.096 us * 2^n (IBTA 9.7.6.1.3), the smallest n covering
        // opts_.ack_timeout. 0 would mean "wait forever": never used.
        double units = static_cast<double>(opts_.ack_timeout.count()) * 1000.0 / 4.096;
        std::uint8_t n = 1;
        while (n < 31 && static_cast<double>(1ull << n) < units)
            ++n;
        attr.timeout = n;
        attr.retry_cnt = std::min(opts_.retry_count, domain_.pd().max_retry_count());
        attr.rnr_retry = std::min<std::uint8_t>(opts_.rnr_retry_count, 7);
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
        if (rd_atomic)
            attr.max_rd_atomic = rd_atomic;
        else if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic)
            // The active side: rdma_cm's value is the responder resources the peer's accept
            // granted, which limits() reports (before the connection is handed out).
            set_max_rd_atomic(attr.max_rd_atomic);
    }
    if (int rc = ibv_modify_qp(qp(), &attr, mask))
        throw_errno(rc, verb);
}

rdma_conn_param cm_connection::conn_param(std::span<const std::byte> user,
                                          std::span<std::byte> wire) const noexcept
{
    rdma_conn_param p{};
    // Always the full size, so that the trailer is at the same offset on IB CM (which pads
    // to it) and iWARP (which carries what we give it).
    encode_private_data(user, {goodbye_mr_->rkey, reinterpret_cast<std::uintptr_t>(goodbye_words_.get())},
                        wire);
    p.private_data = wire.data();
    p.private_data_len = static_cast<std::uint8_t>(wire.size());
    p.responder_resources = static_cast<std::uint8_t>(std::min<std::uint32_t>(limits().max_rd_atomic, 255));
    p.initiator_depth = p.responder_resources;
    // Sent for peers that let rdma_cm drive their QP (they take their RNR retry count
    // from us); our own QP gets its values in modify_qp().
    p.retry_count = std::min(opts_.retry_count, domain_.pd().max_retry_count());
    p.rnr_retry_count = std::min<std::uint8_t>(opts_.rnr_retry_count, 7);
    p.qp_num = qp() ? qp()->qp_num : 0;
    return p;
}

connection_state cm_connection::state() const noexcept
{
    std::lock_guard lock(cm_.mutex);
    return cm_.state;
}

std::error_code cm_connection::last_error() const noexcept
{
    std::lock_guard lock(cm_.mutex);
    switch (cm_.state) {
    case connection_state::error: return cm_.error ? cm_.error : make_error_code(errc::completion_error);
    case connection_state::disconnected: return cm_.error ? cm_.error : make_error_code(errc::disconnected);
    default: return {};
    }
}

void cm_connection::on_error_completion(std::error_code status) noexcept
{
    std::lock_guard lock(cm_.mutex);
    if (status != errc::flushed) {
        // A completion's status is the most precise cause there is: it replaces a
        // disconnect this side did not ask for, a lost peer and a generic
        // IBV_EVENT_QP_FATAL (each can overtake the completion that caused it).
        const bool generic = cm_.state == connection_state::error && cm_.error == errc::completion_error;
        if (cm_.state == connection_state::established || generic || cm_.guess_yields_to(status)) {
            cm_.state = connection_state::error;
            cm_.error = status;
            cm_.what = "error completion: the QP is in the error state";
            cm_.report();
        }
        return;
    }
    if (cm_.state != connection_state::established)
        return;
    {
        // Flushed while we still thought the connection up: the QP left it (siw flushes
        // before the DISCONNECTED event arrives; an async event may follow with a cause).
        // An rdmx peer's goodbye came before that, in the same ordered stream.
        if (cm_.peer_vanished()) {
            cm_.lose_peer("work request flushed: the queue pair left the connected state without the "
                          "peer's goodbye");
        } else {
            cm_.state = connection_state::disconnected;
            cm_.error = errc::disconnected;
            cm_.what = "work request flushed: the queue pair left the connected state";
        }
        cm_.report();
    }
}

void cm_connection::say_goodbye() noexcept
{
    goodbye_target to;
    {
        std::lock_guard lock(cm_.mutex);
        // Only while the QP can still send: not once the peer left (DISCONNECTED), nor
        // after an error; and only to a peer that gave us where (an rdmx peer).
        if (goodbye_sent_ || cm_.state != connection_state::established || !cm_.peer_goodbye || !qp())
            return;
        goodbye_sent_ = true;
        // This side is disconnecting from now on: a flush or DISCONNECTED while it waits
        // (another thread may poll a shared CQ) is no peer that vanished.
        cm_.local_disconnect = true;
        to = *cm_.peer_goodbye;
    }
    // Before rdma_disconnect, which moves the QP to error and would flush it. Without the
    // cm_ lock: the event loop must go on serving every connection meanwhile.
    const ibv_sge src{reinterpret_cast<std::uintptr_t>(&goodbye_words_[1]), sizeof(std::uint64_t),
                      goodbye_mr_->lkey};
    if (!write_goodbye(src, to.rkey, to.addr, goodbye_timeout))
        RDMX_LOG(debug,
                 "QP %u: the goodbye to the peer did not complete within %lld ms; disconnecting anyway",
                 qp()->qp_num, static_cast<long long>(goodbye_timeout.count()));
}

void cm_connection::disconnect() noexcept
{
    say_goodbye();
    std::lock_guard lock(cm_.mutex);
    cm_.local_disconnect = true;
    if (cm_.state == connection_state::established || cm_.state == connection_state::connecting) {
        if (id_)
            rdma_disconnect(id_.get());
        verbs::flush_qp(qp()); // every posted request completes with IBV_WC_WR_FLUSH_ERR
        cm_.state = connection_state::disconnected;
        cm_.report();
    } else if (cm_.state == connection_state::error && qp()) {
        // Failed after an error completion: still tell the peer (DREQ) so it need not wait
        // for its own timeouts. The state stays `error`: that is what happened.
        rdma_disconnect(id_.get());
        verbs::flush_qp(qp());
    }
}

native_handles cm_connection::native() const noexcept
{
    return {id_.get(), qp(), domain_.native_pd(), cq() ? cq() : send_cq()};
}

} // namespace rdmx::cm
