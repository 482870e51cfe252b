#include "cm/cm_domain.hpp"

#include <rdmx/queues.hpp>

#include <netinet/in.h>
#include <poll.h>

#include <cerrno>
#include <cstring>

#include "backends.hpp"
#include "resolve.hpp"
#include "cm/cm_connection.hpp"
#include "verbs/completion_queue.hpp"
#include "validate.hpp"

namespace rdmx::cm
{

cm_domain::cm_domain(event_channel_ptr probe_channel, cm_id_ptr probe_id)
    : probe_channel_(std::move(probe_channel)), probe_id_(std::move(probe_id)),
      pd_(probe_id_->verbs, probe_id_->port_num ? probe_id_->port_num : 1), events_(pd_.native_context())
{
}

cm_domain::~cm_domain() = default;

std::unique_ptr<connection> cm_domain::start_connect(std::string_view address, const connection_options& opts,
                                                     std::span<const std::byte> private_data,
                                                     std::span<const recv_request> initial_recvs)
{
    uri u = uri::parse(address);
    detail::check_scheme(u, backend::verbs, "start_connect");
    detail::check_private_data(detail::private_data_use::connect, private_data, "rdma_connect");
    auto c = std::make_unique<cm_connection>(*this, opts, "start_connect");
    c->start_connect(u, private_data, initial_recvs);
    return c;
}

std::shared_ptr<completion_queue> cm_domain::create_completion_queue(const completion_queue_options& opts)
{
    return std::make_shared<verbs::completion_queue>(pd_, shared_from_this(), opts.depth);
}

std::unique_ptr<connection> cm_domain::connect(std::string_view address, const connection_options& opts,
                                               std::span<const std::byte> private_data,
                                               std::span<const recv_request> initial_recvs)
{
    uri u = uri::parse(address);
    detail::check_scheme(u, backend::verbs, "connect");
    detail::check_private_data(detail::private_data_use::connect, private_data, "rdma_connect");
    auto c = std::make_unique<cm_connection>(*this, opts);
    c->connect(u, private_data, initial_recvs);
    return c;
}

namespace
{

bool is_loopback(const sockaddr_storage& sa)
{
    if (sa.ss_family == AF_INET)
        return (ntohl(reinterpret_cast<const sockaddr_in&>(sa).sin_addr.s_addr) >> 24) == 127;
    if (sa.ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(sa).sin6_addr);
    return false;
}

/// Asks rdma_cm which device serves `dst`: the domain of that device, or nullptr with
/// `why` set.
std::shared_ptr<domain> probe(sockaddr_storage& dst, std::chrono::milliseconds timeout, std::string& why)
{
    event_channel_ptr channel(rdma_create_event_channel());
    if (!channel) {
        why = std::string("rdma_create_event_channel: ") + std::strerror(errno);
        return nullptr;
    }
    rdma_cm_id* raw = nullptr;
    if (rdma_create_id(channel.get(), &raw, nullptr, RDMA_PS_TCP)) {
        why = std::string("rdma_create_id: ") + std::strerror(errno);
        return nullptr;
    }
    cm_id_ptr id(raw);
    if (rdma_resolve_addr(id.get(), nullptr, reinterpret_cast<sockaddr*>(&dst),
                          static_cast<int>(timeout.count()))) {
        why = std::string("rdma_resolve_addr: ") + std::strerror(errno);
        return nullptr;
    }
    pollfd pfd{channel->fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(timeout.count()) + 500) <= 0) {
        why = "rdma_resolve_addr: no answer in time";
        return nullptr;
    }
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(channel.get(), &ev)) {
        why = std::string("rdma_get_cm_event: ") + std::strerror(errno);
        return nullptr;
    }
    auto type = ev->event;
    int status = ev->status;
    rdma_ack_cm_event(ev);
    if (type != RDMA_CM_EVENT_ADDR_RESOLVED || id->verbs == nullptr) {
        why = std::string("rdma_resolve_addr: ") + event_name(type) + " (status " + std::to_string(status) +
              ")";
        return nullptr;
    }
    return std::make_shared<cm_domain>(std::move(channel), std::move(id));
}

} // namespace

} // namespace rdmx::cm

namespace rdmx::detail
{

void settle_verbs_domain(domain& d) noexcept
{
    if (auto* v = dynamic_cast<cm::cm_domain*>(&d))
        v->reaper_thread().wait_idle();
}

std::shared_ptr<domain> open_verbs_domain(const uri& address, std::chrono::milliseconds timeout,
                                          bool required)
{
    std::string why = "no address to try";
    for (detail::socket_address& a : detail::resolve(address, false, "getaddrinfo")) {
        // rdma_cm resolves loopback addresses to any RDMA device, yet RC connections over
        // lo fail: the automatic choice sends loopback to TCP.
        if (!required && cm::is_loopback(a.addr))
            continue;
        if (auto d = cm::probe(a.addr, timeout, why))
            return d;
    }
    if (required)
        throw error(make_error_code(errc::no_device), "rdma://" + address.host + ": " + why);
    return nullptr;
}

} // namespace rdmx::detail
