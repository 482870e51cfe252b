// The application's calls: post, post_recv, poll, notification and disconnect. They run on
// any application thread, under mu_; what they leave to the engine goes by asio::post.
#include "tcp/tcp_engine.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include <boost/asio/post.hpp>

#include "tcp/tcp_env_switch.hpp"
#include "validate.hpp"

namespace rdmx::tcp
{

template <class Request, class Check>
std::optional<std::error_code> connection_engine::validate_or_flush(cq_side side,
                                                                    std::span<const Request> wrs,
                                                                    std::size_t* posted, Check check) noexcept
{
    // All or nothing: an invalid request rejects the whole list before any is taken.
    for (const auto& wr : wrs) {
        std::uint64_t total = 0;
        if (errc ec = check(wr, total); ec != errc{})
            return make_error_code(ec);
    }
    // While connecting, receives queue up (the engine reads nothing before the handshake
    // is done); post() refused requests already.
    if (state() == connection_state::established || state() == connection_state::connecting)
        return std::nullopt;
    // As on an errored QP: the requests are accepted and complete as flushed; on a shared
    // queue only as many as this side's room there holds (the rest: would_block).
    const std::size_t n = std::min<std::uint64_t>(wrs.size(), shared_room(side));
    for (std::size_t i = 0; i < n; ++i)
        push_cq(side, {.wr_id = wrs[i].wr_id, .opcode = opcode::unknown, .status = errc::flushed});
    if (posted)
        *posted = n;
    return n < wrs.size() ? make_error_code(errc::would_block) : std::error_code{};
}

std::error_code connection_engine::post_local(const work_request& wr) noexcept
{
    if (wr.opcode == opcode::bind_window) {
        if (std::error_code ec = dom_.bind_window(*wr.window, *wr.bind_region, wr.bind_offset, wr.bind_length,
                                                  wr.bind_access, id_))
            return ec;
    } else if (std::error_code ec = dom_.invalidate_window(*wr.window)) {
        return ec;
    }
    const bool signaled = has(wr.flags, send_flags::signaled);
    // Behind requests still outstanding it waits for them (its completion in order);
    // otherwise its turn is now.
    if (!sq_.push_local(wr.wr_id, wr.opcode, signaled) && signaled)
        push_cq(cq_side::send, {.wr_id = wr.wr_id, .opcode = wr.opcode, .status = {}});
    return {};
}

std::error_code connection_engine::post(std::span<const work_request> wrs, std::size_t* posted) noexcept
{
    if (posted)
        *posted = 0;
    // Read before the lock: time spent waiting for the engine to let go of it does not make
    // a tight loop look idle.
    const auto entry = std::chrono::steady_clock::now();
    bool waited = false;
    engine_lock lk(mu_, waited);
    if (state() == connection_state::connecting)
        return errc::not_connected;
    if (auto done =
            validate_or_flush(cq_side::send, wrs, posted, [&](const work_request& wr, std::uint64_t& total) {
                if (errc ec = detail::check_send(wr, dom_.owner(), dom_.backend(), lim_, total); ec != errc{})
                    return ec;
                if (!detail::is_window_op(wr.opcode)) [[likely]]
                    return errc{};
                // As on verbs, before anything of the list is posted: a bind of a bound
                // window, an invalidation of a free one, a window twice in one list.
                if (detail::window_repeated(wrs, static_cast<std::size_t>(&wr - wrs.data())))
                    return errc::invalid_argument;
                return dom_.window_state_allows(*wr.window, wr.opcode == opcode::bind_window)
                           ? errc{}
                           : errc::invalid_argument;
            }))
        return *done;
    ownership_.on_post(entry);
    const std::uint64_t moved_before = moved();
    // Slots whose completions wait on a shared queue are still taken (0 on the own ring).
    const std::uint64_t depth =
        lim_.send_queue_depth - std::min(held_in_cq(cq_side::send), lim_.send_queue_depth);
    std::size_t i = 0;
    bool copy_failed = false; // an inline copy of device memory failed (logged)
    for (; i < wrs.size(); ++i) {
        if (sq_.used() >= depth)
            break;
        const work_request& wr = wrs[i];
        if (detail::is_window_op(wr.opcode)) [[unlikely]] {
            if (std::error_code ec = post_local(wr)) {
                if (posted)
                    *posted = i;
                return ec;
            }
            continue;
        }
        if (wr.remote.key & shared_key_bit && post_mapped(wr, entry))
            continue;
        send_queue::entry& e = sq_.at(sq_.tail());
        e.wr_id = wr.wr_id;
        e.op = wr.opcode;
        e.signaled = has(wr.flags, send_flags::signaled);
        e.fenced = has(wr.flags, send_flags::fence);
        e.solicited = has(wr.flags, send_flags::solicited);
        e.imm = wr.imm;
        e.remote_addr = wr.remote.addr;
        e.remote_key = wr.opcode == opcode::send_with_invalidate ? wr.invalidate_key : wr.remote.key;
        seg* segs = sq_.segs(sq_.tail());
        std::uint64_t total = 0;
        e.nseg = 0;
        if (has(wr.flags, send_flags::inline_data)) {
            // Copied now, into the slot's own buffer: the caller may reuse its buffer at once.
            std::byte* buf = sq_.inline_buf(sq_.tail());
            for (const sge& s : wr.local) {
                if (const seg g = region_seg(*s.region, s.offset, s.length); g.st->stage != staging::none) {
                    // Device memory: the driver copies it (the caller owns the region now).
                    if (!dom_.bounce().copy_now(true, g.st->stage, g.st->device, buf + total, g.ptr, g.len)) {
                        copy_failed = true;
                        break;
                    }
                    dom_.bounce().count_out(g.len);
                } else {
                    std::memcpy(buf + total, g.ptr, g.len);
                }
                total += s.length;
            }
            if (copy_failed)
                break; // nothing of this request was posted
            segs[e.nseg++] = {nullptr, 0, buf, total};
        } else {
            for (const sge& s : wr.local) {
                if (s.length == 0)
                    continue;
                segs[e.nseg++] = region_seg(*s.region, s.offset, s.length);
                total += s.length;
            }
        }
        e.length = static_cast<std::uint32_t>(total);
        if (detail::is_atomic(wr.opcode)) {
            // The operands travel in the frame's payload, from the slot itself.
            store_le64(e.operands.data(), wr.compare_add);
            store_le64(e.operands.data() + 8, wr.opcode == opcode::compare_swap ? wr.swap : 0);
            e.operand_seg = {nullptr, 0, e.operands.data(),
                             wr.opcode == opcode::fetch_add ? fetch_add_payload : compare_swap_payload};
        }
        sq_.push();
    }
    if (posted)
        *posted = i;
    if (ownership_.post_should_read(entry)) {
        // Stood down, and the application posts without polling: read what came meanwhile
        // (ACKs, the peer's requests). What that owes goes out with the requests.
        rx_read();
    }
    if (coalesce_post())
        arm_tx_check(); // the next post() or poll() sends it, or the engine a check later
    else
        pump();
    // One clock read per post where it moved little and had the lock at once (a microsecond
    // or so): it ends when it began.
    ownership_.on_call_end(waited ? clock::now() : poll_ownership::call_end(entry, moved() - moved_before));
    if (copy_failed)
        return errc::local_protection;
    if (i < wrs.size())
        return errc::would_block;
    return {};
}

bool connection_engine::map_allowed() noexcept
{
    static const bool allowed = env_switch_on("RDMX_SHM_MAP");
    return allowed;
}

bool connection_engine::post_mapped(const work_request& wr, clock::time_point now) noexcept
{
    // Only where nothing posted before it is outstanding: the copy places the data now, so
    // it must not overtake a write or send still queued (RC's order), and its completion
    // comes after theirs. Fences hold trivially then.
    if ((wr.opcode != opcode::write && wr.opcode != opcode::read) || !sq_.empty() || !local() ||
        !map_allowed() || state() != connection_state::established)
        return false;
    const bool write = wr.opcode == opcode::write;
    std::uint64_t total = 0;
    for (const sge& s : wr.local)
        total += s.length;
    if (total == 0 || wr.local.size() > max_cma_descriptors)
        return false;
    // A shared queue's room for the completion (post() counts taken slots by held_in_cq).
    const bool signaled = has(wr.flags, send_flags::signaled);
    if (signaled && (send_cq_ ? shared_room(cq_side::send) == 0 : cq_.full()))
        return false;
    // The peer's pidfd: settle_transport looked it up for a local connection (cma_peer_pid,
    // not called here: it asks the kernel whether the process exited, a system call).
    const shared_map_cache::region* r = mapped_.find(wr.remote.key, cma_.pidfd());
    if (!r)
        return false;
    const auto need = static_cast<std::uint64_t>(write ? access::remote_write : access::remote_read);
    const std::uint64_t addr = wr.remote.addr;
    // Rights and bounds as the target checks them (tcp_domain::find_remote), overflow-safe.
    if ((r->rights & need) == 0 || addr < r->base || addr - r->base > r->size ||
        total > r->size - (addr - r->base))
        return false;
    if (detail::live_of(*r->control) != 1) {
        mapped_.drop(r); // deregistered: the target says so (NAK REMOTE_ACCESS)
        return false;
    }
    // Host memory of registrations still registered (pinned for the copy, as a socket
    // call pins it); device memory and anything else go the usual way.
    seg segs[max_cma_descriptors];
    std::size_t n = 0;
    bool ok = true;
    for (const sge& s : wr.local) {
        if (s.length == 0)
            continue;
        segs[n] = region_seg(*s.region, s.offset, s.length);
        if (!segs[n].st || segs[n].st->stage != staging::none || !pin(segs[n].st, segs[n].tag)) {
            ok = false;
            break;
        }
        ++n;
    }
    if (ok) {
        std::byte* at = r->data + (addr - r->base);
        for (std::size_t i = 0; i < n; ++i) {
            if (write)
                std::memcpy(at, segs[i].ptr, segs[i].len);
            else
                std::memcpy(segs[i].ptr, at, segs[i].len);
            at += segs[i].len;
        }
    }
    for (std::size_t i = 0; i < n; ++i)
        unpin(segs[i].st);
    if (!ok)
        return false;
    // Still registered after the copy: it was all the while (the owner clears the word
    // before it unmaps). Otherwise the region went during the copy: the usual way says so,
    // as the target sees it now (the bytes went to pages nobody holds but this mapping).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (detail::live_of(*r->control) != 1) {
        mapped_.drop(r);
        return false;
    }
    // The peer still there: its end of the socket closes when it disconnects or dies. A
    // look every 100 us at most: a system call costs a microsecond or more here, and one
    // per 1 MiB copy (26 us) cost 15 % of the rate (20 us against 100 us, 3 alternating
    // runs). So a copy that ends within 100 us after the peer went may complete, as one
    // just before it would have; the connection's error follows. Otherwise the usual way
    // fails it.
    if (now - mapped_checked_ > mapped_peer_check) { // now: post()'s entry (one clock read less)
        pollfd p{.fd = fd_, .events = POLLRDHUP, .revents = 0};
        if (::poll(&p, 1, 0) != 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0)
            return false;
        mapped_checked_ = now;
    }
    note_mapped_copy();
    if (signaled)
        push_cq(cq_side::send, {.wr_id = wr.wr_id,
                                .opcode = wr.opcode,
                                .status = {},
                                .byte_len = static_cast<std::uint32_t>(total)});
    return true;
}

std::error_code connection_engine::post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept
{
    if (posted)
        *posted = 0;
    engine_lock lk(mu_);
    if (srq_.shared())
        return errc::invalid_argument; // its receives are posted to the shared queue
    if (auto done =
            validate_or_flush(cq_side::recv, wrs, posted, [&](const recv_request& wr, std::uint64_t& total) {
                return detail::check_recv(wr, dom_.owner(), lim_, total);
            }))
        return *done;
    const std::uint64_t depth =
        lim_.recv_queue_depth - std::min(held_in_cq(cq_side::recv), lim_.recv_queue_depth);
    std::size_t i = 0;
    for (; i < wrs.size(); ++i) {
        if (rq_.size() >= depth)
            break;
        recv_queue::entry& e = rq_.back();
        seg* segs = rq_.back_segs();
        e.wr_id = wrs[i].wr_id;
        e.length = 0;
        e.nseg = 0;
        for (const sge& s : wrs[i].local) {
            if (s.length == 0)
                continue;
            segs[e.nseg++] = region_seg(*s.region, s.offset, s.length);
            e.length += s.length;
        }
        rq_.push();
    }
    if (posted)
        *posted = i;
    return i < wrs.size() ? make_error_code(errc::would_block) : std::error_code{};
}

std::size_t connection_engine::poll(std::span<completion> out) noexcept
{
    // The domain's progress runs here too where some of its connections report to shared
    // queues (domain_progress): a poll of any queue of the domain progresses them, as a
    // poll of a shared queue does, and on the same terms (domain_progress::due). Not under
    // mu_: this engine may be one of them (a side on a shared queue).
    domain_progress& dp = dom_.progress();
    const auto now = std::chrono::steady_clock::now();
    auto end = now;
    if (!dp.attached())
        return poll_own(out, now, end);
    const std::uint64_t k = dp.begin_poll(now);
    std::size_t n = poll_own(out, now, end);
    if (domain_progress::due(k, n, out.size()))
        end = dp.run(end);
    dp.end_poll(end);
    return n;
}

std::size_t connection_engine::poll_own(std::span<completion> out, clock::time_point now,
                                        clock::time_point& end) noexcept
{
    engine_lock lk(mu_);
    end = now;
    if (hs_.owns_socket()) // the handshake's socket: nothing to read or send here
        return cq_.pop(out);
    ownership_.on_poll(now);
    dom_.polls().enter(now);
    retry_rnr_if_due(now);
    const std::uint64_t moved_before = moved();
    bool pumped = cq_.empty() && rx_poll();
    if (!pumped && sq_.unstarted())
        pump(); // requests that post() left to be coalesced, when rx_poll did not send
    std::size_t from_srq = 0;
    std::size_t n = cq_.pop(out, &from_srq);
    srq_.retire(from_srq); // polled: their slots in the shared queue are free again
    // A poll that moved little took a microsecond or so: it ends when it began, and a busy
    // poller reads the clock once per poll, not twice (poll_ownership::call_clock_bytes).
    end = poll_ownership::call_end(now, moved() - moved_before);
    ownership_.on_call_end(end);
    dom_.polls().leave(end);
    return n;
}

std::error_code connection_engine::request_notify(bool solicited_only) noexcept
{
    if (send_cq_ && recv_cq_)
        return errc::invalid_argument; // no completions of its own: wait on the shared queues
    engine_lock lk(mu_);
    notify_.arm(solicited_only);
    if (hs_.owns_socket())
        return {};            // the engine owns the socket during the handshake anyway
    ownership_.on_app_idle(); // about to sleep: what is left to send is the engine's
    pump();                   // an ACK that rx_poll left for this call: the caller may now sleep
    post_reclaim();           // the application is about to sleep: the engine must read again
    return {};
}

std::error_code connection_engine::ack_notify() noexcept
{
    std::uint64_t v;
    if (::read(efd_.get(), &v, sizeof v) < 0 && errno != EAGAIN)
        return {errno, std::system_category()};
    return {};
}

void connection_engine::disconnect() noexcept
{
    engine_lock lk(mu_);
    local_disconnect_ = true;
    ownership_.on_app_idle();
    fail(connection_state::disconnected);
    pump();
}

} // namespace rdmx::tcp
