// The verbs backend's domain as rdma_cm makes it: the device an address resolves to, our
// protection domain on it (verbs/), and the rdma_cm event loop of its connections. Its
// listen() and connect() run the flow in cm_flow.cpp.
#pragma once

#include <memory>

#include <rdmx/connection.hpp>

#include "cm/cm_handles.hpp"
#include "cm/event_loop.hpp"
#include "cm/reaper.hpp"
#include "verbs/protection_domain.hpp"

namespace rdmx::cm
{

/// Shared by the regions, listeners, requests and connections made from it (each holds
/// shared_from_this()), so that the PD, the device context and the event loop outlive them.
class cm_domain final : public domain, public std::enable_shared_from_this<cm_domain>
{
public:
    /// `probe_channel`/`probe_id` resolved the address to the device; we keep them, since
    /// librdmacm keeps the device context (probe_id->verbs) open while an id uses it.
    cm_domain(event_channel_ptr probe_channel, cm_id_ptr probe_id);
    ~cm_domain() override;

    rdmx::backend backend() const noexcept override { return backend::verbs; }
    const device_limits& limits() const noexcept override { return pd_.limits(); }
    std::unique_ptr<memory_window> allocate_window() override
    {
        return pd_.allocate_window(shared_from_this());
    }
    std::unique_ptr<memory_region> register_placed(void* addr, std::size_t length, rdmx::access rights,
                                                   rdmx::memory_type type, int device) override
    {
        return pd_.register_memory(addr, length, rights, shared_from_this(), type, device);
    }
    std::unique_ptr<listener> listen(std::string_view address, const listen_options& opts) override;
    std::unique_ptr<connection> connect(std::string_view address, const connection_options& opts,
                                        std::span<const std::byte> private_data,
                                        std::span<const recv_request> initial_recvs) override;
    std::unique_ptr<connection> start_connect(std::string_view address, const connection_options& opts,
                                              std::span<const std::byte> private_data,
                                              std::span<const recv_request> initial_recvs) override;
    std::shared_ptr<completion_queue> create_completion_queue(const completion_queue_options& opts) override;
    std::shared_ptr<shared_receive_queue>
    create_shared_receive_queue(const shared_receive_queue_options& opts) override;
    ibv_context* native_context() const noexcept override { return pd_.native_context(); }
    ibv_pd* native_pd() const noexcept override { return pd_.native_pd(); }

    const verbs::protection_domain& pd() const noexcept { return pd_; }
    event_loop& events() noexcept { return events_; }
    /// Destroys what a connection's destructor must not wait for (cm/reaper.hpp).
    reaper& reaper_thread() noexcept { return reaper_; }
    bool iwarp() const noexcept { return pd_.iwarp(); }

private:
    // Destruction order (reverse of declaration): the reaper (idle by then: its jobs hold
    // the domain) and the event loop thread stop first, then the PD goes, then the probe
    // id that pins the device context, then its channel.
    event_channel_ptr probe_channel_;
    cm_id_ptr probe_id_;
    verbs::protection_domain pd_;
    event_loop events_;
    reaper reaper_;
};

} // namespace rdmx::cm
