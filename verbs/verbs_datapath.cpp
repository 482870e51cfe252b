// The verbs data path: post lists, polling (a connection's own CQ, and the shared CQs that
// route each completion to its connection), notification. noexcept, no allocation: work
// requests are filled into arrays each connection builds once, and handed to the provider
// in batches.
#include <arpa/inet.h>

#include <cerrno>

#include "errno_status.hpp"
#include "validate.hpp"
#include "verbs/completion_queue.hpp"
#include "verbs/shared_receive_queue.hpp"
#include "verbs/verbs_connection.hpp"
#include "verbs/verbs_memory.hpp"

namespace rdmx::verbs
{
namespace
{

std::error_code post_errno(int rc) noexcept
{
    // Providers return a positive errno (rxe, mlx5) or a negative one (libsiw).
    if (rc < 0)
        rc = -rc;
    // ENOMEM from ibv_post_* means the queue is full: try again after polling.
    if (rc == ENOMEM)
        return errc::would_block;
    if (rc == EINVAL)
        return errc::invalid_argument;
    // A QP that left RTS (siw: EPERM, ENOTCONN) and the rest: rdmx's codes, on every
    // provider the same (lib/errno_status.hpp).
    return detail::errc_of_errno(rc);
}

ibv_wr_opcode to_ibv(opcode op) noexcept
{
    switch (op) {
    case opcode::write: return IBV_WR_RDMA_WRITE;
    case opcode::write_with_imm: return IBV_WR_RDMA_WRITE_WITH_IMM;
    case opcode::read: return IBV_WR_RDMA_READ;
    case opcode::fetch_add: return IBV_WR_ATOMIC_FETCH_AND_ADD;
    case opcode::compare_swap: return IBV_WR_ATOMIC_CMP_AND_SWP;
    case opcode::bind_window: return IBV_WR_BIND_MW;
    case opcode::invalidate_window: return IBV_WR_LOCAL_INV;
    case opcode::send_with_invalidate: return IBV_WR_SEND_WITH_INV;
    default: return IBV_WR_SEND;
    }
}

unsigned to_ibv(send_flags f) noexcept
{
    unsigned out = 0;
    if (has(f, send_flags::signaled))
        out |= IBV_SEND_SIGNALED;
    if (has(f, send_flags::fence))
        out |= IBV_SEND_FENCE;
    if (has(f, send_flags::inline_data))
        out |= IBV_SEND_INLINE;
    if (has(f, send_flags::solicited))
        out |= IBV_SEND_SOLICITED;
    return out;
}

std::error_code to_error(ibv_wc_status s) noexcept
{
    switch (s) {
    case IBV_WC_SUCCESS: return {};
    case IBV_WC_REM_ACCESS_ERR: return errc::remote_access;
    case IBV_WC_WR_FLUSH_ERR: return errc::flushed;
    case IBV_WC_RNR_RETRY_EXC_ERR: return errc::rnr_retry_exceeded;
    case IBV_WC_RETRY_EXC_ERR: return errc::transport_retry_exceeded;
    case IBV_WC_REM_INV_REQ_ERR: return errc::remote_invalid_request;
    case IBV_WC_REM_OP_ERR: return errc::remote_operation;
    case IBV_WC_LOC_LEN_ERR: return errc::local_length;
    case IBV_WC_LOC_PROT_ERR: return errc::local_protection;
    case IBV_WC_LOC_QP_OP_ERR: return errc::local_qp_operation;
    case IBV_WC_BAD_RESP_ERR: return errc::bad_response;
    default: return errc::completion_error;
    }
}

opcode from_ibv(ibv_wc_opcode op) noexcept
{
    switch (op) {
    case IBV_WC_SEND: return opcode::send;
    case IBV_WC_RDMA_WRITE: return opcode::write;
    case IBV_WC_RDMA_READ: return opcode::read;
    case IBV_WC_RECV: return opcode::recv;
    case IBV_WC_RECV_RDMA_WITH_IMM: return opcode::recv_with_imm;
    case IBV_WC_FETCH_ADD: return opcode::fetch_add;
    case IBV_WC_COMP_SWAP: return opcode::compare_swap;
    case IBV_WC_BIND_MW: return opcode::bind_window;
    case IBV_WC_LOCAL_INV: return opcode::invalidate_window;
    default: return opcode::unknown;
    }
}

unsigned to_ibv_mw_access(rdmx::access a) noexcept
{
    unsigned out = 0;
    if (any(a & access::remote_read))
        out |= IBV_ACCESS_REMOTE_READ;
    if (any(a & access::remote_write))
        out |= IBV_ACCESS_REMOTE_WRITE;
    if (any(a & access::remote_atomic))
        out |= IBV_ACCESS_REMOTE_ATOMIC;
    return out;
}

// What verbs adds to detail::check_send for bind_window, invalidate_window and
// send_with_invalidate (the device able): a dead window (its region went and no new one
// could be allocated), a bind of a window still bound and an invalidation of one not bound
// (verbs_window::bound: rxe 6.1 dereferences the missing QP of a free window it is asked
// to invalidate and the kernel panics), a window named
// by two binds or invalidates of one list (the second would be filled with the key the
// first replaces) and a key over 32 bits (it names no verbs window) are invalid_argument.
[[gnu::noinline]] errc check_window_request(std::span<const work_request> wrs, std::size_t i) noexcept
{
    const work_request& wr = wrs[i];
    if (wr.opcode == opcode::send_with_invalidate)
        return wr.invalidate_key > UINT32_MAX ? errc::invalid_argument : errc{};
    const auto* w = static_cast<const verbs_window*>(wr.window); // check_send: of this domain
    if (w->native() == nullptr || (wr.opcode == opcode::bind_window) == w->bound())
        return errc::invalid_argument;
    return detail::window_repeated(wrs, i) ? errc::invalid_argument : errc{};
}

void fill_sges(std::span<const sge> in, ibv_sge* out) noexcept
{
    for (std::size_t i = 0; i < in.size(); ++i) {
        out[i].addr = reinterpret_cast<std::uintptr_t>(in[i].region->data() + in[i].offset);
        out[i].length = static_cast<std::uint32_t>(in[i].length);
        out[i].lkey = in[i].region->local_key();
    }
}

// One request into its slot. The slot's sg_list (and its place in the chain) were set when
// the connection built the array; everything a request sets is written here, always.
template <class IbvWr, class Request, class Fill>
[[gnu::always_inline]] inline void fill_one(IbvWr& w, const Request& wr, Fill fill) noexcept
{
    fill_sges(wr.local, w.sg_list);
    w.wr_id = wr.wr_id;
    w.num_sge = static_cast<int>(wr.local.size());
    fill(w, wr);
}

// Fills provider work requests from ours into `arr` and hands them to `post`
// (ibv_post_send / ibv_post_recv): a single request from its own slot, a list in batches of
// post_batch with one doorbell each. `fill` sets the fields particular to the queue. On a
// provider error, *posted counts what went through. The requests were checked: none has
// more SGEs than its queue's limit, for which each slot of `arr` has room.
template <class IbvWr, class Request, class Fill, class Post>
std::error_code post_in_batches(std::span<const Request> wrs, std::size_t* posted, auto& arr, Fill fill,
                                Post post) noexcept
{
    IbvWr* bad = nullptr;
    if (wrs.size() == 1) {
        // The latency case: straight through, with no chain to cut and mend.
        IbvWr& w = arr.wr[post_batch];
        fill_one(w, wrs[0], fill);
        int rc = post(&w, &bad);
        if (rc || bad) [[unlikely]]
            return post_errno(rc ? rc : EINVAL);
        if (posted)
            *posted = 1;
        return detail::no_error;
    }
    IbvWr* w = arr.wr.data();
    std::size_t done = 0;
    while (done < wrs.size()) {
        std::size_t n = std::min(post_batch, wrs.size() - done);
        for (std::size_t i = 0; i < n; ++i)
            fill_one(w[i], wrs[done + i], fill);
        // The batch slots are chained once, at set-up: cut the chain after the last request
        // and mend it after the call.
        w[n - 1].next = nullptr;
        bad = nullptr;
        int rc = post(w, &bad);
        w[n - 1].next = n < post_batch ? &w[n] : nullptr;
        if (rc || bad) [[unlikely]] {
            // The provider names the first request it did not take (ibv_post_send(3)); one
            // that names none (or one outside the batch) is counted as having taken none of
            // it. A provider that names one but returns 0 still failed: never report
            // success for requests that were not posted.
            if (bad >= w && bad < w + n)
                done += static_cast<std::size_t>(bad - w);
            if (posted)
                *posted = done;
            return post_errno(rc ? rc : EINVAL);
        }
        done += n;
    }
    if (posted)
        *posted = done;
    return detail::no_error;
}

// Posts at most `room` of `wrs` (the queue's free slots by rdmx's own count: some providers,
// siw, accept far more than the depth and then overrun the CQ) through `post_some`, which
// posts a prefix and says how much went through. A list cut short by the count is
// would_block, after what fitted; *posted is exact either way.
template <class Request, class PostSome>
std::error_code post_within(std::span<const Request> wrs, std::size_t room, std::size_t* posted,
                            PostSome post_some) noexcept
{
    std::size_t take = std::min(wrs.size(), room);
    if (take == 0 && !wrs.empty())
        return errc::would_block;
    std::size_t done = 0;
    std::error_code ec = post_some(wrs.first(take), &done);
    if (posted)
        *posted = done;
    if (!ec && take < wrs.size())
        return errc::would_block;
    return ec;
}

} // namespace

std::error_code verbs_connection::post(std::span<const work_request> wrs, std::size_t* posted) noexcept
{
    if (posted)
        *posted = 0;
    if (!qp_ || !sendable_.load(std::memory_order_acquire)) [[unlikely]]
        return errc::not_connected;
    // Validate the whole list first: a bad request must not leave half a list posted.
    bool windows = false; // binds to record once posted
    for (std::size_t i = 0; i < wrs.size(); ++i) {
        const work_request& wr = wrs[i];
        std::uint64_t total = 0;
        if (errc ec = detail::check_send(wr, &pd_, backend::verbs, limits_, total); ec != errc{})
            return ec;
        // What the device lacks is refused here, not left to the provider: siw "filled"
        // only the first SGE of a read and reported success, and failed a write with
        // immediate in a list without saying so.
        if (wr.opcode == opcode::read && wr.local.size() > max_read_sge_) [[unlikely]]
            return errc::invalid_argument;
        if (wr.opcode == opcode::write_with_imm && !pd_.limits().write_with_imm) [[unlikely]]
            return errc::not_supported;
        if (detail::is_atomic(wr.opcode) && !pd_.limits().atomics) [[unlikely]]
            return errc::not_supported; // siw: atomic_cap IBV_ATOMIC_NONE
        if (detail::is_window_op(wr.opcode) || wr.opcode == opcode::send_with_invalidate) [[unlikely]] {
            if (!pd_.limits().memory_windows)
                return errc::not_supported; // siw: no IBV_DEVICE_MEM_WINDOW_TYPE_2B
            if (errc ec = check_window_request(wrs, i); ec != errc{})
                return ec;
            windows = windows || detail::is_window_op(wr.opcode);
        }
    }
    // After an error on a shared send CQ: what its reservation holds, less the goodbye's.
    const std::uint32_t user_send_entries = shared_.send_entries() - detail::own_send_entries;
    std::size_t room = counting_      ? limits_.send_queue_depth - sq_outstanding_
                       : send_shared_ ? user_send_entries - std::min(owed_send_cq_, user_send_entries)
                                      : wrs.size();
    if (strands_) [[unlikely]]
        room = std::min(room, mirror_.size() - mirror_count_); // equal while counting_
    return post_within(
        wrs, room, posted, [this, windows](std::span<const work_request> some, std::size_t* done) {
            std::error_code ec = post_in_batches<ibv_send_wr>(
                some, done, send_wrs_,
                [](ibv_send_wr& w, const work_request& wr) {
                    w.opcode = to_ibv(wr.opcode);
                    w.send_flags = to_ibv(wr.flags);
                    w.imm_data = wr.opcode == opcode::write_with_imm ? htonl(wr.imm) : 0;
                    if (detail::is_atomic(wr.opcode)) [[unlikely]] {
                        // wr.atomic overlays wr.rdma with rkey further on: every field is set.
                        // The operands are host byte order (the provider converts them).
                        w.wr.atomic.remote_addr = wr.remote.addr;
                        w.wr.atomic.compare_add = wr.compare_add;
                        w.wr.atomic.swap = wr.opcode == opcode::compare_swap ? wr.swap : 0;
                        w.wr.atomic.rkey = static_cast<std::uint32_t>(wr.remote.key);
                        return;
                    }
                    if (wr.opcode == opcode::bind_window) [[unlikely]] {
                        // A new key each bind (the provider checks the window's current one);
                        // the window records both once the bind is posted (on_bind).
                        ibv_mw* mw = wr.window->native();
                        w.bind_mw.mw = mw;
                        w.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
                        w.bind_mw.bind_info.mr = wr.bind_region->native();
                        w.bind_mw.bind_info.addr =
                            reinterpret_cast<std::uintptr_t>(wr.bind_region->data()) + wr.bind_offset;
                        w.bind_mw.bind_info.length = wr.bind_length;
                        w.bind_mw.bind_info.mw_access_flags = to_ibv_mw_access(wr.bind_access);
                        return;
                    }
                    if (wr.opcode == opcode::invalidate_window) [[unlikely]] {
                        // The window's current key, known to the provider (bound or not).
                        w.invalidate_rkey = wr.window->native()->rkey;
                        return;
                    }
                    if (wr.opcode == opcode::send_with_invalidate) [[unlikely]]
                        w.invalidate_rkey = static_cast<std::uint32_t>(wr.invalidate_key);
                    const bool one_sided = wr.opcode != opcode::send;
                    w.wr.rdma.remote_addr = one_sided ? wr.remote.addr : 0;
                    w.wr.rdma.rkey = one_sided ? static_cast<std::uint32_t>(wr.remote.key) : 0;
                },
                [qp = qp_.get()](ibv_send_wr* w, ibv_send_wr** bad) { return ibv_post_send(qp, w, bad); });
            for (std::size_t i = 0; windows && i < *done; ++i)
                if (const work_request& wr = some[i]; wr.opcode == opcode::invalidate_window) {
                    static_cast<verbs_window*>(wr.window)->on_invalidate();
                } else if (wr.opcode == opcode::bind_window) {
                    ibv_mw* mw = wr.window->native();
                    static_cast<verbs_window*>(wr.window)->on_bind(
                        *static_cast<const verbs_region*>(wr.bind_region),
                        reinterpret_cast<std::uintptr_t>(wr.bind_region->data()) + wr.bind_offset,
                        wr.bind_length, ibv_inc_rkey(mw->rkey), qp_.get());
                }
            if (!counting_ && send_shared_)
                owed_send_cq_ += static_cast<std::uint32_t>(*done);
            if (strands_) [[unlikely]] {
                for (std::size_t i = 0; i < *done; ++i)
                    mirror_push(some[i].wr_id, has(some[i].flags, send_flags::signaled));
                if (*done && end_.ended.load(std::memory_order_relaxed))
                    end_.raise(); // posted after the end: the shared CQ looks again
            }
            for (std::size_t i = 0; counting_ && i < *done; ++i) {
                // A signalled request's completion frees its slot and those of the unsignalled
                // ones posted before it (ibv_post_send(3)).
                ++sq_outstanding_;
                ++sq_unsignaled_;
                if (has(some[i].flags, send_flags::signaled)) {
                    sq_retire_[(retire_head_ + retire_count_) % sq_retire_.size()] = sq_unsignaled_;
                    ++retire_count_;
                    sq_unsignaled_ = 0;
                }
            }
            return ec;
        });
}

std::error_code verbs_connection::post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept
{
    if (posted)
        *posted = 0;
    if (srq_)
        return errc::invalid_argument; // its receives are posted to the shared queue
    if (!qp_)
        return errc::not_connected;
    for (const recv_request& wr : wrs) {
        std::uint64_t total = 0;
        if (errc ec = detail::check_recv(wr, &pd_, limits_, total); ec != errc{})
            return ec;
    }
    std::size_t room = counting_ ? limits_.recv_queue_depth - rq_outstanding_ : wrs.size();
    if (!counting_ && recv_shared_) {
        // After an error: what the receive CQ's reservation still holds (shared with the
        // send side when both use one queue).
        const bool same = recv_shared_ == send_shared_;
        const std::uint32_t cap =
            shared_.recv_entries() + (same ? shared_.send_entries() - detail::own_send_entries : 0);
        room = cap - std::min(owed(recv_shared_), cap);
    }
    return post_within(wrs, room, posted, [this](std::span<const recv_request> some, std::size_t* done) {
        std::error_code ec = post_in_batches<ibv_recv_wr>(
            some, done, recv_wrs_, [](ibv_recv_wr&, const recv_request&) {},
            [qp = qp_.get()](ibv_recv_wr* w, ibv_recv_wr** bad) { return ibv_post_recv(qp, w, bad); });
        if (counting_)
            rq_outstanding_ += static_cast<std::uint32_t>(*done);
        else if (recv_shared_)
            owed(recv_shared_) += static_cast<std::uint32_t>(*done);
        return ec;
    });
}

bool verbs_connection::complete(const ibv_wc& wc, completion& c, const completion_queue* from) noexcept
{
    if (wc.wr_id == reserved_wr_id) [[unlikely]] {
        // The goodbye (write_goodbye): its own slot and CQ entry, no user's completion. An
        // error here (flushed after the wait gave up) says nothing new about the QP.
        goodbye_.store(wc.status == IBV_WC_SUCCESS ? goodbye_state::ok : goodbye_state::failed,
                       std::memory_order_release);
        return false;
    }
    if (strands_) [[unlikely]]
        if (wc.opcode != IBV_WC_RECV && wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM)
            mirror_complete(wc.wr_id, wc.status != IBV_WC_SUCCESS);
    c.wr_id = wc.wr_id;
    // A receive of the shared receive queue: polled, so its slot is free; the application
    // gets back the wr_id it posted there.
    if (srq_ && srq_->owns(c.wr_id))
        c.wr_id = srq_->complete(c.wr_id);
    c.byte_len = wc.byte_len;
    c.context = context_;
    c.conn = this;
    if (wc.status == IBV_WC_SUCCESS) [[likely]] {
        c.status = detail::no_error;
        c.opcode = from_ibv(wc.opcode);
        // ibv_poll_cq(3) defines byte_len for receives only; rdmx promises 8 for atomics.
        if (detail::is_atomic(c.opcode)) [[unlikely]]
            c.byte_len = detail::atomic_size;
        else if (detail::is_window_op(c.opcode)) [[unlikely]]
            c.byte_len = 0; // nothing moved
        retire(c.opcode);
        if (passive_ && !sendable_.load(std::memory_order_relaxed)) [[unlikely]]
            if (c.opcode == opcode::recv || c.opcode == opcode::recv_with_imm)
                sendable_.store(true, std::memory_order_release);
        c.with_imm = wc.wc_flags & IBV_WC_WITH_IMM;
        c.imm = c.with_imm ? ntohl(wc.imm_data) : 0;
        // imm_data and invalidated_rkey share a union (ibv_wc): one or the other.
        c.with_invalidate = c.opcode == opcode::recv && (wc.wc_flags & pd_.wc_with_inv());
        c.invalidated_key = c.with_invalidate ? wc.invalidated_rkey : 0;
        if (c.with_invalidate) [[unlikely]]
            pd_.note_invalidated(wc.invalidated_rkey);
    } else {
        c.status = to_error(wc.status);
        // The opcode is undefined in error completions (ibv_poll_cq(3)).
        c.opcode = opcode::unknown;
        c.with_imm = false;
        c.imm = 0;
        c.with_invalidate = false;
        c.invalidated_key = 0;
        // The QP is in the error state: say so in state() before the user sees
        // the completion (a flush can come before DISCONNECTED, as on siw).
        note_error(c.status);
    }
    if (!counting_ && from) [[unlikely]] {
        std::uint32_t& o = owed(from);
        o -= o ? 1 : 0;
    }
    return true;
}

std::size_t verbs_connection::poll_stash(std::span<completion> out) noexcept
{
    std::size_t n = 0;
    while (stash_count_ && n < out.size()) {
        n += complete(stash_[stash_head_], out[n], nullptr) ? 1 : 0;
        stash_head_ = stash_head_ + 1 == stash_.size() ? 0 : stash_head_ + 1;
        --stash_count_;
    }
    return n;
}

std::size_t verbs_connection::poll(std::span<completion> out) noexcept
{
    if (!cq_)
        return 0; // both sides report to shared queues
    ibv_wc wc[poll_batch];
    std::size_t n = stash_count_ ? poll_stash(out) : 0;
    while (n < out.size()) {
        int want = static_cast<int>(std::min<std::size_t>(poll_batch, out.size() - n));
        int got = ibv_poll_cq(cq_.get(), want, wc);
        for (int i = 0; i < got; ++i)
            n += complete(wc[i], out[n], nullptr) ? 1 : 0;
        if (got < want) {
            // Drained: on siw, what the ended connection's send queue still holds.
            if (!send_shared_ && n < out.size() && has_stranded()) [[unlikely]]
                n += flush_stranded(nullptr) ? poll(out.subspan(n))
                                             : complete_stranded(out.subspan(n), nullptr);
            break;
        }
    }
    return n;
}

void verbs_connection::mirror_complete(std::uint64_t wr_id, bool error) noexcept
{
    std::size_t hit = mirror_count_, first = mirror_count_;
    for (std::size_t i = 0; i < mirror_count_; ++i) {
        const mirror_entry& e = mirror_at(i);
        if (e.done)
            continue;
        first = std::min(first, i);
        if (e.wr_id == wr_id && (error || e.signaled)) {
            hit = i;
            break;
        }
    }
    if (hit == mirror_count_)
        hit = first; // none matched (a provider's odd wr_id): count one anyway
    if (hit == mirror_count_)
        return;
    mirror_at(hit).done = true;
    for (std::size_t i = 0; !error && i < hit; ++i)
        if (!mirror_at(i).signaled)
            mirror_at(i).done = true;
    while (mirror_count_ && mirror_[mirror_head_].done) {
        mirror_head_ = mirror_head_ + 1 == mirror_.size() ? 0 : mirror_head_ + 1;
        --mirror_count_;
    }
}

bool verbs_connection::flush_stranded(const completion_queue* from) noexcept
{
    if (end_flushed_ || from != send_shared_)
        return false;
    end_flushed_ = true;
    // Idempotent; on siw it takes the QP's state lock, which the flush that moved the QP
    // to the error state (siw_qp_llp_close) holds throughout.
    flush_qp(qp_.get());
    return true;
}

std::size_t verbs_connection::complete_stranded(std::span<completion> out,
                                                const completion_queue* from) noexcept
{
    if (!end_flushed_ || from != send_shared_)
        return 0;
    std::size_t n = 0;
    while (mirror_count_ && n < out.size()) {
        // As siw's own flush would have completed it; complete() takes it off the mirror.
        // (The front is never done: done entries leave at once.)
        ibv_wc wc{};
        wc.wr_id = mirror_[mirror_head_].wr_id;
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.opcode = IBV_WC_SEND;
        wc.qp_num = qp_->qp_num;
        n += complete(wc, out[n], from) ? 1 : 0;
    }
    return n;
}

std::error_code verbs_connection::request_notify(bool solicited_only) noexcept
{
    if (!cq_)
        return errc::invalid_argument; // no CQ of its own: wait on the shared ones
    if (int rc = ibv_req_notify_cq(cq_.get(), solicited_only ? 1 : 0))
        return {rc, std::system_category()};
    return {};
}

namespace
{

/// Consumes every event pending on `channel` (non-blocking: EAGAIN ends it). Each arming
/// that fired queues one event, and an event loop that armed, then found work and did not
/// sleep, leaves events behind: taking only one per wake left the descriptor readable,
/// and the next sleeps woke at once for nothing, where TCP's eventfd is quiet once read.
std::error_code drain_cq_events(ibv_comp_channel* channel) noexcept
{
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(channel, &cq, &ctx) == 0)
        ibv_ack_cq_events(cq, 1);
    if (errno != EAGAIN)
        return {errno, std::system_category()};
    return {};
}

} // namespace

std::error_code verbs_connection::ack_notify() noexcept
{
    if (!channel_)
        return {};
    return drain_cq_events(channel_.get());
}

// --- shared completion queues (verbs/completion_queue.hpp) ---

bool completion_queue::route(const ibv_wc& wc, completion& out) noexcept
{
    auto it = routes_.find(wc.qp_num);
    if (it == routes_.end() || !it->second.conn) [[unlikely]] {
        if (it != routes_.end())
            release(it->second.srq, wc); // its connection is going (detach): dropped
        return false;
    }
    return it->second.conn->complete(wc, out, this);
}

std::size_t completion_queue::drain(std::span<completion> out, bool& drained) noexcept
{
    ibv_wc wc[poll_batch];
    std::size_t n = 0;
    drained = false;
    while (n < out.size()) {
        int want = static_cast<int>(std::min<std::size_t>(poll_batch, out.size() - n));
        int got = ibv_poll_cq(cq_.get(), want, wc);
        for (int i = 0; i < got; ++i)
            n += route(wc[i], out[n]) ? 1 : 0;
        if (got < want) {
            drained = true;
            break;
        }
    }
    return n;
}

std::size_t completion_queue::poll(std::span<completion> out) noexcept
{
    // Held throughout: a connection being destroyed waits in detach() until its last
    // completion is handed over here, and never gets one afterwards.
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    while (stash_count_ && n < out.size())
        [[unlikely]]
        {
            n += route(stash_[stash_head_], out[n]) ? 1 : 0;
            stash_head_ = stash_head_ + 1 == stash_.size() ? 0 : stash_head_ + 1;
            --stash_count_;
        }
    bool drained = false;
    n += drain(out.subspan(n), drained);
    if (drained && n < out.size() && stranded_watch.load(std::memory_order_acquire)) [[unlikely]]
        n += poll_stranded(out.subspan(n));
    return n;
}

std::size_t completion_queue::poll_stranded(std::span<completion> out) noexcept
{
    // Cleared first: a connection that ends (or posts after its end) meanwhile raises it again.
    stranded_watch.store(false, std::memory_order_relaxed);
    bool flushed = false;
    for (auto& [qp_num, r] : routes_)
        if (r.conn && r.conn->has_stranded())
            flushed = r.conn->flush_stranded(this) || flushed;
    std::size_t n = 0;
    if (flushed) {
        bool drained = false;
        n = drain(out, drained);
        if (!drained) {
            stranded_watch.store(true, std::memory_order_relaxed);
            return n;
        }
    }
    bool left = false;
    for (auto& [qp_num, r] : routes_)
        if (r.conn && r.conn->has_stranded()) {
            n += r.conn->complete_stranded(out.subspan(n), this);
            left = left || r.conn->has_stranded();
        }
    if (left)
        stranded_watch.store(true, std::memory_order_relaxed);
    return n;
}

void completion_queue::stash_polled() noexcept
{
    std::lock_guard lk(mu_);
    ibv_wc wc[poll_batch];
    for (;;) {
        int got = ibv_poll_cq(cq_.get(), poll_batch, wc);
        for (int i = 0; i < got; ++i) {
            if (wc[i].wr_id == reserved_wr_id) {
                completion ignored;
                route(wc[i], ignored);                 // tells its connection; nothing for the user
            } else if (stash_count_ < stash_.size()) { // always: the reservations bound both
                stash_[(stash_head_ + stash_count_++) % stash_.size()] = wc[i];
            }
        }
        if (got < poll_batch)
            return;
    }
}

std::error_code completion_queue::request_notify(bool solicited_only) noexcept
{
    if (int rc = ibv_req_notify_cq(cq_.get(), solicited_only ? 1 : 0))
        return {rc, std::system_category()};
    return {};
}

std::error_code completion_queue::ack_notify() noexcept
{
    return drain_cq_events(channel_.get());
}

} // namespace rdmx::verbs
