// The verbs domain: the device an address maps to, our own protection domain on it, the
// device's queried limits, and the rdma_cm event loop of its connections.
#pragma once

#include <rdmx/connection.hpp>

#include "cm/event_loop.hpp"
#include "verbs/handles.hpp"

namespace rdmx::verbs
{

/// Shared by the regions, listeners, requests and connections made from it (each holds
/// shared_from_this()), so that the PD, the device context and the event loop outlive them.
class verbs_domain final : public domain, public std::enable_shared_from_this<verbs_domain>
{
public:
    /// `probe_channel`/`probe_id` resolved the address to the device; we keep them, since
    /// librdmacm keeps the device context (probe_id->verbs) open while an id uses it.
    verbs_domain(event_channel_ptr probe_channel, cm_id_ptr probe_id);
    ~verbs_domain() override;

    rdmx::backend backend() const noexcept override { return backend::verbs; }
    const device_limits& limits() const noexcept override { return limits_; }
    std::unique_ptr<memory_region> register_memory(void* addr, std::size_t length,
                                                   rdmx::access rights) override;
    std::unique_ptr<listener> listen(std::string_view address, int backlog) override;
    std::unique_ptr<connection> connect(std::string_view address, const connection_options& opts,
                                        std::span<const std::byte> private_data) override;
    ibv_context* native_context() const noexcept override { return ctx_; }
    ibv_pd* native_pd() const noexcept override { return pd_.get(); }

    cm::event_loop& events() noexcept { return events_; }
    /// An iWARP device: its CM drives the QP to RTS itself and it has no write with immediate.
    bool iwarp() const noexcept { return iwarp_; }

private:
    void probe_max_inline();

    // Destruction order (reverse of declaration): the event loop thread stops first, then
    // the PD goes, then the probe id that pins the device context, then its channel.
    event_channel_ptr probe_channel_;
    cm_id_ptr probe_id_;
    ibv_context* ctx_; ///< owned by librdmacm, pinned by probe_id_
    pd_ptr pd_;
    device_limits limits_;
    bool iwarp_ = false;
    cm::event_loop events_;
};

/// Resolves host:port into a sockaddr (numeric or by name). Throws errc::unreachable.
void resolve_sockaddr(const uri& u, sockaddr_storage& out, bool passive);

} // namespace rdmx::verbs
