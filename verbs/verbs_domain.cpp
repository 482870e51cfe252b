#include "verbs/verbs_domain.hpp"

#include <netdb.h>
#include <poll.h>

#include <cerrno>
#include <cstring>

#include "backends.hpp"
#include "validate.hpp"
#include "verbs/verbs_connection.hpp"

namespace rdmx::verbs
{

void resolve_sockaddr(const uri& u, sockaddr_storage& out, bool passive)
{
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    addrinfo* res = nullptr;
    std::string port = std::to_string(u.port);
    int rc = getaddrinfo(u.host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0)
        throw error(make_error_code(errc::unreachable), "getaddrinfo " + u.host + ": " + gai_strerror(rc));
    std::memcpy(&out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
}

namespace
{

class verbs_region final : public memory_region
{
public:
    verbs_region(std::shared_ptr<const verbs_domain> dom, mr_ptr mr, rdmx::access acc)
        : memory_region(dom.get(), backend::verbs, static_cast<std::byte*>(mr->addr), mr->length, acc,
                        mr->lkey, mr->rkey),
          dom_(std::move(dom)), mr_(std::move(mr))
    {
    }
    ibv_mr* native() const noexcept override { return mr_.get(); }

private:
    std::shared_ptr<const verbs_domain> dom_; ///< its PD; declared first: the MR goes before it
    mr_ptr mr_;
};

bool is_loopback(const sockaddr_storage& sa)
{
    if (sa.ss_family == AF_INET)
        return (ntohl(reinterpret_cast<const sockaddr_in&>(sa).sin_addr.s_addr) >> 24) == 127;
    if (sa.ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(sa).sin6_addr);
    return false;
}

} // namespace

verbs_domain::verbs_domain(event_channel_ptr probe_channel, cm_id_ptr probe_id)
    : probe_channel_(std::move(probe_channel)), probe_id_(std::move(probe_id)), ctx_(probe_id_->verbs),
      pd_(ibv_alloc_pd(ctx_)), events_(ctx_)
{
    if (!pd_)
        throw_errno(errno, "ibv_alloc_pd");
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(ctx_, &attr))
        throw_errno(rc, "ibv_query_device");
    ibv_port_attr port{};
    if (int rc = ibv_query_port(ctx_, probe_id_->port_num ? probe_id_->port_num : 1, &port))
        throw_errno(rc, "ibv_query_port");
    limits_.device_name = ibv_get_device_name(ctx_->device);
    limits_.max_qp_wr = static_cast<std::uint32_t>(attr.max_qp_wr);
    limits_.max_sge = static_cast<std::uint32_t>(attr.max_sge);
    limits_.max_qp_rd_atom = static_cast<std::uint32_t>(attr.max_qp_rd_atom);
    limits_.max_qp_init_rd_atom = static_cast<std::uint32_t>(attr.max_qp_init_rd_atom);
    limits_.max_mr_size = attr.max_mr_size;
    limits_.max_msg_size = port.max_msg_sz;
    limits_.max_sge_rd = static_cast<std::uint32_t>(attr.max_sge_rd);
    // iWARP (RFC 5040) has no write with immediate data.
    iwarp_ = ctx_->device->transport_type == IBV_TRANSPORT_IWARP;
    limits_.write_with_imm = !iwarp_;
    limits_.iwarp = iwarp_;
    probe_max_inline();
}

verbs_domain::~verbs_domain() = default;

void verbs_domain::probe_max_inline()
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

std::unique_ptr<memory_region> verbs_domain::register_memory(void* addr, std::size_t length,
                                                             rdmx::access rights)
{
    if (addr == nullptr || length == 0)
        throw_error(errc::invalid_argument, "ibv_reg_mr: empty region");
    int flags = 0;
    // Verbs requires local write whenever remote write is granted.
    if (any(rights & (access::local_write | access::remote_write)))
        flags |= IBV_ACCESS_LOCAL_WRITE;
    if (any(rights & access::remote_write))
        flags |= IBV_ACCESS_REMOTE_WRITE;
    if (any(rights & access::remote_read))
        flags |= IBV_ACCESS_REMOTE_READ;
    mr_ptr mr(ibv_reg_mr(pd_.get(), addr, length, flags));
    if (!mr)
        throw_errno(errno, "ibv_reg_mr");
    if (any(rights & access::remote_write))
        rights = rights | access::local_write;
    return std::make_unique<verbs_region>(shared_from_this(), std::move(mr), rights);
}

std::unique_ptr<connection> verbs_domain::connect(std::string_view address, const connection_options& opts,
                                                  std::span<const std::byte> private_data)
{
    uri u = uri::parse(address);
    if (u.scheme == scheme::tcp)
        throw_error(errc::invalid_argument, "connect: tcp:// address on a verbs domain");
    detail::check_private_data(detail::private_data_use::connect, private_data, "rdma_connect");
    auto c = std::make_unique<verbs_connection>(*this, opts);
    c->connect(u, private_data);
    return c;
}

} // namespace rdmx::verbs

namespace rdmx::detail
{

std::shared_ptr<domain> open_verbs_domain(const uri& address, std::chrono::milliseconds timeout,
                                          bool required)
{
    using namespace rdmx::verbs;
    auto no_device = [&](const std::string& why) -> std::shared_ptr<domain> {
        if (required)
            throw error(make_error_code(errc::no_device), "rdma://" + address.host + ": " + why);
        return nullptr;
    };
    sockaddr_storage dst{};
    resolve_sockaddr(address, dst, false);
    // rdma_cm resolves loopback addresses to any RDMA device, yet RC connections over lo
    // fail: the automatic choice sends loopback to TCP.
    if (!required && is_loopback(dst))
        return nullptr;

    event_channel_ptr channel(rdma_create_event_channel());
    if (!channel)
        return no_device(std::string("rdma_create_event_channel: ") + std::strerror(errno));
    rdma_cm_id* raw = nullptr;
    if (rdma_create_id(channel.get(), &raw, nullptr, RDMA_PS_TCP))
        return no_device(std::string("rdma_create_id: ") + std::strerror(errno));
    cm_id_ptr id(raw);
    if (rdma_resolve_addr(id.get(), nullptr, reinterpret_cast<sockaddr*>(&dst),
                          static_cast<int>(timeout.count())))
        return no_device(std::string("rdma_resolve_addr: ") + std::strerror(errno));
    pollfd pfd{channel->fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(timeout.count()) + 500) <= 0)
        return no_device("rdma_resolve_addr: no answer in time");
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(channel.get(), &ev))
        return no_device(std::string("rdma_get_cm_event: ") + std::strerror(errno));
    auto type = ev->event;
    int status = ev->status;
    rdma_ack_cm_event(ev);
    if (type != RDMA_CM_EVENT_ADDR_RESOLVED || id->verbs == nullptr)
        return no_device(std::string("rdma_resolve_addr: ") + cm::event_name(type) + " (status " +
                         std::to_string(status) + ")");
    return std::make_shared<verbs_domain>(std::move(channel), std::move(id));
}

} // namespace rdmx::detail
