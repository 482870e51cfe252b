#include "verbs/protection_domain.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cuda_driver.hpp"
#include "log.hpp"
#include "verbs/siw_mmap_guard.hpp"
#include "verbs/verbs_memory.hpp"

namespace rdmx::verbs
{

protection_domain::protection_domain(ibv_context* ctx, std::uint8_t port_num)
    : ctx_(ctx), pd_(ibv_alloc_pd(ctx_))
{
    if (!pd_)
        throw_errno(errno, "ibv_alloc_pd");
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(ctx_, &attr))
        throw_errno(rc, "ibv_query_device");
    ibv_port_attr port{};
    if (int rc = ibv_query_port(ctx_, port_num, &port))
        throw_errno(rc, "ibv_query_port");
    limits_.device_name = ibv_get_device_name(ctx_->device);
    limits_.max_qp_wr = static_cast<std::uint32_t>(attr.max_qp_wr);
    limits_.max_sge = static_cast<std::uint32_t>(attr.max_sge);
    limits_.max_qp_rd_atom = static_cast<std::uint32_t>(attr.max_qp_rd_atom);
    limits_.max_qp_init_rd_atom = static_cast<std::uint32_t>(attr.max_qp_init_rd_atom);
    limits_.max_mr_size = attr.max_mr_size;
    limits_.max_msg_size = port.max_msg_sz;
    limits_.max_sge_rd = static_cast<std::uint32_t>(attr.max_sge_rd);
    max_cqe_ = static_cast<std::uint32_t>(std::max(attr.max_cqe, 0));
    // iWARP (RFC 5040) has no write with immediate data.
    iwarp_ = ctx_->device->transport_type == IBV_TRANSPORT_IWARP;
    limits_.write_with_imm = !iwarp_;
    limits_.iwarp = iwarp_;
    siw_ = attr.vendor_id == 0x626d74; // SIW_VENDOR_ID (drivers/infiniband/sw/siw/siw.h)
    // siw has no atomics at all; rxe and HCAs say IBV_ATOMIC_HCA (atomic among the
    // atomics of this device) or IBV_ATOMIC_GLOB (against CPU atomics too).
    limits_.atomics = attr.atomic_cap != IBV_ATOMIC_NONE;
    // Type 2 windows (bound by a work request, for one QP): rxe says 2B, siw neither.
    limits_.memory_windows =
        (attr.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
    // rxe: vendor id RXE_VENDOR_ID (drivers/infiniband/sw/rxe/rxe_param.h).
    if (attr.vendor_id == 0xffffff || limits_.device_name.starts_with("rxe")) {
        wc_with_inv_ |= 1u << 2; // see wc_with_inv()
        max_retry_count_ = 6;    // see max_retry_count()
    }
    if (siw_)
        siw_guard_ = guard_siw_mmap_offsets(ctx_); // before any queue of ours
    probe_max_inline();
}

void protection_domain::probe_max_inline()
{
    // Devices report no max inline size; the only portable way is to ask for a QP with a
    // given size and read back what the driver granted (drivers round up).
    errno = 0; // providers may fail without one (throw_errno says so)
    cq_ptr cq(ibv_create_cq(ctx_, 1, nullptr, nullptr, 0));
    if (!cq)
        throw_errno(errno, "ibv_create_cq");
    for (std::uint32_t want : {1024u, 512u, 256u, 128u, 64u, 32u, 0u}) {
        ibv_qp_init_attr init{};
        init.send_cq = init.recv_cq = cq.get();
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = want;
        errno = 0;
        qp_ptr qp(ibv_create_qp(pd_.get(), &init));
        if (qp) {
            limits_.max_inline = init.cap.max_inline_data;
            return;
        }
    }
    throw_errno(errno, "ibv_create_qp (probing max inline data)");
}

std::unique_ptr<memory_region> protection_domain::register_memory(void* addr, std::size_t length,
                                                                  rdmx::access rights,
                                                                  std::shared_ptr<const void> keepalive,
                                                                  rdmx::memory_type type, int device)
{
    if (addr == nullptr || length == 0)
        throw_error(errc::invalid_argument, "ibv_reg_mr: empty region");
    if (any(rights & access::bind_window) && !limits_.memory_windows)
        throw_error(errc::not_supported, "ibv_reg_mr: access::bind_window needs memory windows "
                                         "(IBV_DEVICE_MEM_WINDOW_TYPE_2B), which " +
                                             limits_.device_name + " lacks");
    int flags = 0;
    // Verbs requires local write whenever remote write or remote atomic is granted.
    if (any(rights & (access::local_write | access::remote_write | access::remote_atomic)))
        flags |= IBV_ACCESS_LOCAL_WRITE;
    if (any(rights & access::remote_write))
        flags |= IBV_ACCESS_REMOTE_WRITE;
    if (any(rights & access::remote_read))
        flags |= IBV_ACCESS_REMOTE_READ;
    if (any(rights & access::remote_atomic))
        flags |= IBV_ACCESS_REMOTE_ATOMIC;
    if (any(rights & access::bind_window))
        flags |= IBV_ACCESS_MW_BIND;
    mr_ptr mr;
    if (type == memory_type::cuda) {
        mr = register_device_memory(addr, length, flags, device);
    } else {
        mr.reset(ibv_reg_mr(pd_.get(), addr, length, flags));
        if (!mr)
            throw_errno(errno, "ibv_reg_mr");
    }
    if (any(rights & (access::remote_write | access::remote_atomic)))
        rights = rights | access::local_write;
    return std::make_unique<verbs_region>(*this, std::move(keepalive), std::move(mr),
                                          static_cast<std::byte*>(addr), rights, type,
                                          type == memory_type::cuda ? device : -1);
}

mr_ptr protection_domain::register_device_memory(void* addr, std::size_t length, int flags, int device) const
{
    // dma-buf first (libfabric's verbs provider and Mooncake do the same): it needs no
    // out-of-tree module, only a driver and kernel that export device memory as a dma-buf
    // and a provider that imports one. The iova is the device pointer, so that remote
    // addresses are the application's pointers, as for host memory.
    std::string dmabuf;
    detail::dmabuf_export ex = detail::export_dmabuf(addr, length, device, dmabuf);
    if (ex.fd >= 0) {
        mr_ptr mr(ibv_reg_dmabuf_mr(pd_.get(), ex.offset, length, reinterpret_cast<std::uint64_t>(addr),
                                    ex.fd, flags));
        int err = errno;
        ::close(ex.fd); // the MR holds its own reference to the dma-buf
        if (mr) {
            RDMX_LOG(
                info,
                "register_memory: %zu bytes of CUDA device %d memory at %p registered on %s through dma-buf",
                length, device, addr, limits_.device_name.c_str());
            return mr;
        }
        dmabuf =
            std::string("ibv_reg_dmabuf_mr: ") + std::strerror(err) + " (errno " + std::to_string(err) + ")";
    }
    // Then the pages themselves, which only nvidia-peermem lets ibv_reg_mr pin.
    mr_ptr mr(ibv_reg_mr(pd_.get(), addr, length, flags));
    if (mr) {
        RDMX_LOG(
            info,
            "register_memory: %zu bytes of CUDA device %d memory at %p registered on %s through ibv_reg_mr "
            "(nvidia-peermem); dma-buf was not possible: %s",
            length, device, addr, limits_.device_name.c_str(), dmabuf.c_str());
        return mr;
    }
    int err = errno;
    throw error(std::error_code(err ? err : EIO, std::system_category()),
                "register_memory: CUDA device " + std::to_string(device) +
                    " memory cannot be registered on " + limits_.device_name + ": dma-buf: " + dmabuf +
                    "; ibv_reg_mr (nvidia-peermem): " + std::strerror(err) + " (errno " +
                    std::to_string(err) + ")");
}

std::unique_ptr<memory_window> protection_domain::allocate_window(std::shared_ptr<const void> keepalive) const
{
    if (!limits_.memory_windows)
        throw_error(errc::not_supported,
                    "ibv_alloc_mw: memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B) are not "
                    "supported by " +
                        limits_.device_name);
    return std::make_unique<verbs_window>(*this, std::move(keepalive));
}

void protection_domain::add_window(verbs_window* w) const noexcept
{
    std::lock_guard lk(window_mutex_);
    w->all_next_ = windows_;
    windows_ = w;
}

void protection_domain::remove_window(verbs_window* w) const noexcept
{
    std::lock_guard lk(window_mutex_);
    for (verbs_window** p = &windows_; *p; p = &(*p)->all_next_)
        if (*p == w) {
            *p = w->all_next_;
            return;
        }
}

void protection_domain::revoke_windows_of(const ibv_qp* qp) const noexcept
{
    std::lock_guard lk(window_mutex_);
    for (verbs_window* w = windows_; w; w = w->all_next_)
        if (w->via_ == qp)
            w->revoke_unlinked();
}

void protection_domain::note_invalidated(std::uint32_t rkey) const noexcept
{
    std::lock_guard lk(window_mutex_);
    for (verbs_window* w = windows_; w; w = w->all_next_)
        if (w->mw_ && w->mw_->rkey == rkey)
            w->on_invalidate();
}

} // namespace rdmx::verbs
