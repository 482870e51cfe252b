// Our own protection domain on one opened device, the device's queried limits, and memory
// registration. How the device was found (rdma_cm resolves an address to it) is cm/'s
// business: this takes the context as given.
#pragma once

#include <rdmx/connection.hpp>

#include "verbs/handles.hpp"

namespace rdmx::verbs
{

class protection_domain
{
public:
    /// `ctx` is not ours (librdmacm owns it) and must outlive this; `port_num` is the
    /// port whose limits (max message size) apply.
    protection_domain(ibv_context* ctx, std::uint8_t port_num);
    // Regions name it as their owner and connections keep a reference: it stays put.
    protection_domain(const protection_domain&) = delete;
    protection_domain& operator=(const protection_domain&) = delete;

    const device_limits& limits() const noexcept { return limits_; }
    /// Registers with ibv_reg_mr; the region's owner is this protection domain, and it holds
    /// `keepalive` (what owns this protection domain) until it is destroyed.
    std::unique_ptr<memory_region> register_memory(void* addr, std::size_t length, rdmx::access rights,
                                                   std::shared_ptr<const void> keepalive);
    ibv_context* native_context() const noexcept { return ctx_; }
    ibv_pd* native_pd() const noexcept { return pd_.get(); }
    /// An iWARP device: its CM drives the QP to RTS itself and it has no write with immediate.
    bool iwarp() const noexcept { return iwarp_; }
    /// Entries a completion queue of this device may have (ibv_device_attr::max_cqe).
    std::uint32_t max_cqe() const noexcept { return max_cqe_; }

private:
    void probe_max_inline();

    ibv_context* ctx_;
    pd_ptr pd_;
    device_limits limits_;
    bool iwarp_ = false;
    std::uint32_t max_cqe_ = 0;
};

} // namespace rdmx::verbs
