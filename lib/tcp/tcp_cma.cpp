// Cross-memory attach (CMA) for shm://: payloads of sends, writes and reads that do not
// cross the socket. The initiator sends its own SGE list (descriptors) instead of the data;
// the target checks its registration exactly as for a write or read frame (key, range,
// rights; a send takes the posted receive as a send frame does), and only then moves the
// bytes between that registration and the initiator's process with
// process_vm_readv / process_vm_writev: one copy, by the side whose memory rules apply.
// Where the kernel refuses (ptrace rules, another user or PID namespace), the target says
// so (NAK CMA_REFUSED) and the initiator sends the data in the frames from then on.
// docs/wire-format.md section 11 is the protocol; docs/shm.md what it promises.
#include "tcp/tcp_engine.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "log.hpp"
#include "tcp/tcp_log.hpp"
#include "tcp/tcp_env_switch.hpp"

namespace rdmx::tcp
{

namespace
{

std::atomic<std::uint64_t> cma_completed_count{0};
std::atomic<std::uint64_t> cma_refusal_count{0};

} // namespace

bool process_exited(int pidfd) noexcept
{
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;
}

std::uint64_t cma_requests_completed() noexcept
{
    return cma_completed_count.load(std::memory_order_relaxed);
}

void note_cma_completed() noexcept
{
    cma_completed_count.fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t cma_refusals() noexcept
{
    return cma_refusal_count.load(std::memory_order_relaxed);
}

std::shared_ptr<const unique_fd> tcp_domain::peer_process(pid_t pid)
{
    std::lock_guard lk(processes_mu_);
    // Prune the table of processes no connection holds any more (set-up path only).
    for (auto it = processes_.begin(); it != processes_.end();)
        it = it->second.expired() ? processes_.erase(it) : std::next(it);
    if (auto it = processes_.find(pid); it != processes_.end())
        if (auto h = it->second.lock(); h && !process_exited(h->get()))
            return h;
    const long fd = ::syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0)
        return nullptr;
    auto h = std::make_shared<const unique_fd>(static_cast<int>(fd));
    processes_[pid] = h;
    return h;
}

bool connection_engine::cma_allowed() noexcept
{
    // RDMX_SHM_CMA=off (or 0): every payload through the socket, as before CMA (for
    // comparison runs, and for a host whose policy forbids process_vm_*v).
    static const bool allowed = env_switch_on("RDMX_SHM_CMA");
    return allowed;
}

bool connection_engine::choose_cma(std::uint64_t pos, bool& revoked) noexcept
{
    send_queue::entry& e = sq_.at(pos);
    if (e.op != opcode::write && e.op != opcode::write_with_imm && e.op != opcode::read &&
        e.op != opcode::send)
        return false;
    std::byte* d = sq_.cma_buf(pos);
    const std::uint64_t min = !link_.uses_rings()    ? cma_min_bytes
                              : e.op == opcode::send ? cma_min_send_bytes_ring
                                                     : cma_min_bytes_ring;
    if (!d || e.length < min || e.nseg == 0)
        return false;
    const seg* sg = sq_.segs(pos);
    // Host memory of a registration only: staged (device) memory and inline copies go
    // in the frames.
    for (std::uint32_t i = 0; i < e.nseg; ++i)
        if (!sg[i].st || sg[i].st->stage != staging::none)
            return false;
    for (std::uint32_t i = 0; i < e.nseg; ++i) {
        // Still registered now (the frame carries its addresses, not its bytes, so
        // nothing stays pinned: the memory must stay until the request completed, as for
        // any operation; docs/shm.md).
        if (!pin(sg[i].st, sg[i].tag)) {
            revoked = true;
            return false;
        }
        unpin(sg[i].st);
        store_le64(d + i * cma_descriptor_size, reinterpret_cast<std::uintptr_t>(sg[i].ptr));
        store_le64(d + i * cma_descriptor_size + 8, sg[i].len);
    }
    e.cma_seg = {nullptr, 0, d, std::uint64_t{e.nseg} * cma_descriptor_size};
    return true;
}

void connection_engine::settle_transport() noexcept
{
    const bool local = is_unix_socket(fd_);
    local_.store(local, std::memory_order_release);
    connector::dial_plan& d = hs_.dial();
    if (d.local_first) { // an auto:// client: which way it took, and why
        if (local)
            RDMX_LOG(info, "%s: the listener is on this host: shm (UNIX socket, CMA)", d.what.c_str());
        else
            RDMX_LOG(info, "%s: no auto:// listener for it in this network namespace (%s): tcp",
                     d.what.c_str(), std::strerror(d.local_error ? d.local_error : ECONNREFUSED));
        d.local_first = false;
    }
    if (auto r = hs_.take_rings()) {
        link_.use_rings(std::move(r)); // the client's: what the listener's ACCEPT brought
        rings_ready();
    }
    if (!local)
        return;
    (void)cma_peer_pid(); // while the peer is surely connected (see there)
    cma_.settle(cma_allowed());
}

namespace
{

/// The descriptors' ranges from byte `off` on, `n` bytes of them, as iovecs in `out`
/// (room for max_cma_descriptors); their count.
unsigned long slice(const iovec* all, unsigned long count, std::uint64_t off, std::uint64_t n,
                    iovec* out) noexcept
{
    unsigned long m = 0;
    for (unsigned long i = 0; i < count && n > 0; ++i) {
        if (off >= all[i].iov_len) {
            off -= all[i].iov_len;
            continue;
        }
        const std::uint64_t take = std::min<std::uint64_t>(all[i].iov_len - off, n);
        out[m++] = {static_cast<std::byte*>(all[i].iov_base) + off, static_cast<std::size_t>(take)};
        n -= take;
        off = 0;
    }
    return m;
}

/// process_vm_readv (`into_local`) or process_vm_writev of [local, local + n) and the
/// remote list: 0, or the errno (EFAULT for a short transfer: a remote range is not
/// mapped).
int cma_move(pid_t pid, bool into_local, std::byte* local, std::uint64_t n, const iovec* remote,
             unsigned long count) noexcept
{
    iovec l{local, static_cast<std::size_t>(n)};
    const ssize_t r = into_local ? ::process_vm_readv(pid, &l, 1, remote, count, 0)
                                 : ::process_vm_writev(pid, &l, 1, remote, count, 0);
    if (r < 0)
        return errno;
    return static_cast<std::uint64_t>(r) == n ? 0 : EFAULT;
}

/// The kernel will not let this process reach the peer's memory at all: the initiator
/// is told to stop asking (NAK CMA_REFUSED), not failed.
bool refused(int err) noexcept
{
    return err == EPERM || err == EACCES || err == ESRCH || err == ENOSYS;
}

} // namespace

void connection_engine::serve_cma(const frame_header& h) noexcept
{
    const unsigned long count = h.length / cma_descriptor_size; // 1..32 (frame_header::decode)
    iovec remote[max_cma_descriptors];
    std::uint64_t total = 0;
    for (unsigned long i = 0; i < count; ++i) {
        const std::uint64_t addr = load_le64(rx_.cma.data() + i * cma_descriptor_size);
        const std::uint64_t len = load_le64(rx_.cma.data() + i * cma_descriptor_size + 8);
        if (len > max_frame_payload - total) {
            protocol_violation("CMA descriptors over the frame limit", false);
            return;
        }
        total += len;
        remote[i] = {reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)),
                     static_cast<std::size_t>(len)};
    }
    cma_bytes_ += total; // the copy this call makes (call_end)
    if (h.op == frame_op::send_cma) {
        serve_cma_send(h, remote, count, total);
        return;
    }
    const bool read = h.op == frame_op::read_cma_req;
    // The same check as a write or read frame's (begin_request): nothing outside this
    // registration, or without its rights, is touched. Zero bytes touch nothing.
    seg s;
    if (total > 0 &&
        !dom_.find_remote(h.key, h.addr, total, read ? access::remote_read : access::remote_write, s, id_)) {
        target_fail(nak_code::remote_access, h.seq);
        return;
    }
    int err = 0;
    if (total > 0) {
        const pid_t pid = cma_peer_pid();
        if (pid == 0)
            err = ESRCH;
        else if (!pin(s.st, s.tag))
            err = -1; // deregistered since find_remote: as a write into it would
        else {
            if (s.st->stage == staging::none) {
                err = cma_move(pid, !read, s.ptr, total, remote, count);
            } else {
                // Staged (device) memory: through one of the domain's chunks, a chunk at a time.
                bounce_pool& pool = dom_.bounce();
                std::byte* c = pool.take();
                err = c ? 0 : ENOMEM;
                for (std::uint64_t off = 0; err == 0 && off < total;) {
                    const std::uint64_t k = std::min<std::uint64_t>(pool.chunk_size(), total - off);
                    iovec part[max_cma_descriptors];
                    const unsigned long m = slice(remote, count, off, k, part);
                    if (read) {
                        err = pool.copy_now(true, s.st->stage, s.st->device, c, s.ptr + off, k)
                                  ? cma_move(pid, false, c, k, part, m)
                                  : EIO;
                        pool.count_out(k);
                    } else {
                        err = cma_move(pid, true, c, k, part, m);
                        if (err == 0 && !pool.copy_now(false, s.st->stage, s.st->device, s.ptr + off, c, k))
                            err = EIO;
                        pool.count_in(k);
                    }
                    off += k;
                }
                if (c)
                    pool.give(c);
            }
            unpin(s.st);
        }
    }
    if (err != 0 && refused(err)) {
        refuse_cma(h, err);
        return;
    }
    if (err != 0) {
        // Our registration went away (-1), or the initiator's own ranges are not its
        // memory (EFAULT): as a write or read of a deregistered region, or a failure to
        // carry the request out.
        target_fail(err == -1 ? nak_code::remote_access : nak_code::remote_operation, h.seq);
        return;
    }
    seq_.carried_out();
    if (read) {
        push_response({.op = frame_op::read_cma_resp,
                       .code = nak_code::rnr,
                       .seq = h.seq,
                       .data = {nullptr, 0, nullptr, total}});
        return;
    }
    if (h.op == frame_op::write_imm_cma)
        complete_rq_head({.wr_id = recv_head().wr_id,
                          .opcode = opcode::recv_with_imm,
                          .status = {},
                          .byte_len = static_cast<std::uint32_t>(total),
                          .imm = h.imm,
                          .with_imm = true},
                         (h.flags & flag_solicited) != 0);
    push_ack(h.seq);
}

void connection_engine::refuse_cma(const frame_header& h, int err) noexcept
{
    // Not fatal: the initiator sends this request and what follows it again with the data
    // in the frames; until this one comes again, those behind it are dropped (as after an
    // RNR NAK).
    if (err != ESRCH || cma_.looked_up() == cma_peer::lookup::found)
        log_limited("shm: cannot reach the peer's memory by CMA (%s): its large payloads come through "
                    "the socket",
                    err == ESRCH ? "its process is gone" : std::strerror(err));
    else
        log_limited("shm: the peer's process cannot be named here (another PID namespace, or no pidfd "
                    "for it): its large payloads come through the socket");
    push_response({.op = frame_op::nak, .code = nak_code::cma_refused, .seq = h.seq, .data = {}});
    seq_.nak_rnr();
}

int connection_engine::cma_into_receive(pid_t pid, const seg* segs, std::uint32_t nseg, const iovec* remote,
                                        unsigned long count, std::uint64_t total) noexcept
{
    // The receive's segs that the bytes fill, pinned for the copy (as a socket read into
    // them would be).
    iovec local[max_cma_descriptors];
    region_state* pinned[max_cma_descriptors];
    unsigned long n = 0;
    int np = 0;
    bool staged = false;
    int err = 0;
    std::uint64_t left = total;
    for (std::uint32_t i = 0; i < nseg && left > 0 && n < max_cma_descriptors; ++i) {
        const seg& s = segs[i];
        const std::uint64_t take = std::min(s.len, left);
        if (s.st && !pin(s.st, s.tag)) {
            err = -1;
            break;
        }
        if (s.st) {
            pinned[np++] = s.st;
            staged = staged || s.st->stage != staging::none;
        }
        local[n++] = {s.ptr, static_cast<std::size_t>(take)};
        left -= take;
    }
    if (err == 0 && left > 0)
        err = EINVAL; // cannot happen: total <= the receive's length, its segs' sum
    if (err == 0 && !staged) {
        const ssize_t r = ::process_vm_readv(pid, local, n, remote, count, 0);
        err = r < 0 ? errno : static_cast<std::uint64_t>(r) == total ? 0 : EFAULT;
    } else if (err == 0) {
        // Staged (device) memory among them: a chunk at a time into a host chunk, then
        // each piece to its place.
        bounce_pool& pool = dom_.bounce();
        std::byte* c = pool.take();
        err = c ? 0 : ENOMEM;
        std::uint64_t li = 0, loff = 0; // the local iovec and offset the next byte goes to
        for (std::uint64_t off = 0; err == 0 && off < total;) {
            const std::uint64_t k = std::min<std::uint64_t>(pool.chunk_size(), total - off);
            iovec part[max_cma_descriptors];
            err = cma_move(pid, true, c, k, part, slice(remote, count, off, k, part));
            for (std::uint64_t done = 0; err == 0 && done < k;) {
                const seg& s = segs[li];
                const std::uint64_t step = std::min<std::uint64_t>(local[li].iov_len - loff, k - done);
                if (s.st && s.st->stage != staging::none) {
                    if (!pool.copy_now(false, s.st->stage, s.st->device, s.ptr + loff, c + done, step))
                        err = EIO;
                    pool.count_in(step);
                } else {
                    std::memcpy(s.ptr + loff, c + done, step);
                }
                done += step;
                loff += step;
                if (loff == local[li].iov_len) {
                    ++li;
                    loff = 0;
                }
            }
            off += k;
        }
        if (c)
            pool.give(c);
    }
    for (int i = 0; i < np; ++i)
        unpin(pinned[i]);
    return err;
}

void connection_engine::serve_cma_send(const frame_header& h, const iovec* remote, unsigned long count,
                                       std::uint64_t total) noexcept
{
    const bool solicited = (h.flags & flag_solicited) != 0;
    const recv_queue::entry r = recv_head(); // recv_ready() held when the header came
    if (total > r.length) {
        // As a send frame larger than the receive: local_length here, invalid request there.
        complete_rq_head({.wr_id = r.wr_id, .opcode = opcode::unknown, .status = errc::local_length},
                         solicited);
        target_fail(nak_code::invalid_request, h.seq);
        return;
    }
    int err = 0;
    if (total > 0) {
        const pid_t pid = cma_peer_pid();
        err = pid == 0 ? ESRCH : cma_into_receive(pid, recv_head_segs(), r.nseg, remote, count, total);
    }
    if (err != 0 && refused(err)) {
        refuse_cma(h, err); // the receive stays posted for the send's second coming
        return;
    }
    if (err == -1) { // the receive's memory was deregistered: as a send frame into it
        complete_rq_head({.wr_id = r.wr_id, .opcode = opcode::unknown, .status = errc::local_protection},
                         solicited);
        target_fail(nak_code::remote_operation, h.seq);
        return;
    }
    if (err != 0) {
        target_fail(nak_code::remote_operation, h.seq);
        return;
    }
    complete_rq_head({.wr_id = r.wr_id,
                      .opcode = opcode::recv,
                      .status = {},
                      .byte_len = static_cast<std::uint32_t>(total)},
                     solicited);
    seq_.carried_out();
    push_ack(h.seq);
}

void connection_engine::finish_read_cma(const frame_header& h) noexcept
{
    // The target wrote the bytes into the local SGEs itself. Memory deregistered before
    // the response (a use of it while the read was outstanding) fails the read, as a
    // read response into it would.
    const send_queue::entry& e = sq_.at(sq_.head());
    const seg* sg = sq_.segs(sq_.head());
    for (std::uint32_t i = 0; i < e.nseg; ++i) {
        if (!pin(sg[i].st, sg[i].tag)) {
            complete_sq_head(errc::local_protection, 0);
            fail(connection_state::error, errc::local_protection);
            return;
        }
        unpin(sg[i].st);
    }
    note_cma_completed();
    complete_sq_head({}, h.length);
}

void connection_engine::on_cma_refused(std::uint64_t seq) noexcept
{
    if (!sq_.at(seq).via_cma) {
        protocol_violation("CMA refusal of a request that was not a CMA request", true);
        return;
    }
    // The peer cannot reach this process's memory (and nothing changes that for this
    // connection): the data goes in the frames from now on. Everything from `seq` on was
    // dropped by the peer and goes again, now without CMA (add_frame decides anew).
    cma_.refused();
    cma_refusal_count.fetch_add(1, std::memory_order_relaxed);
    log_limited("shm: the peer cannot reach this process's memory by CMA: large payloads go through the "
                "socket on this connection");
    sq_.go_back(seq);
    pump();
}

} // namespace rdmx::tcp
