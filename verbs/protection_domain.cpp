#include "verbs/protection_domain.hpp"

#include <algorithm>
#include <cerrno>

namespace rdmx::verbs
{

namespace
{

class verbs_region final : public memory_region
{
public:
    verbs_region(const void* owner, std::shared_ptr<const void> keepalive, mr_ptr mr, rdmx::access acc)
        : memory_region(owner, backend::verbs, static_cast<std::byte*>(mr->addr), mr->length, acc, mr->lkey,
                        mr->rkey),
          keepalive_(std::move(keepalive)), mr_(std::move(mr))
    {
    }
    ibv_mr* native() const noexcept override { return mr_.get(); }

private:
    std::shared_ptr<const void> keepalive_; ///< owner of the PD; declared first: the MR goes before it
    mr_ptr mr_;
};

} // namespace

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
    // siw has no atomics at all; rxe and HCAs say IBV_ATOMIC_HCA (atomic among the
    // atomics of this device) or IBV_ATOMIC_GLOB (against CPU atomics too).
    limits_.atomics = attr.atomic_cap != IBV_ATOMIC_NONE;
    probe_max_inline();
}

void protection_domain::probe_max_inline()
{
    // Devices report no max inline size; the only portable way is to ask for a QP with a
    // given size and read back what the driver granted (drivers round up).
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
                                                                  std::shared_ptr<const void> keepalive)
{
    if (addr == nullptr || length == 0)
        throw_error(errc::invalid_argument, "ibv_reg_mr: empty region");
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
    mr_ptr mr(ibv_reg_mr(pd_.get(), addr, length, flags));
    if (!mr)
        throw_errno(errno, "ibv_reg_mr");
    if (any(rights & (access::remote_write | access::remote_atomic)))
        rights = rights | access::local_write;
    return std::make_unique<verbs_region>(this, std::move(keepalive), std::move(mr), rights);
}

} // namespace rdmx::verbs
