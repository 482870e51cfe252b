// domain::open: the backend choice. rdma://, tcp:// and shm:// are explicit; auto:// asks rdma_cm
// whether the address maps to an RDMA device and falls back to TCP when it does not.
// What it returns is the application's handle on the backend's shared domain
// (backends.hpp): destroying it gives up the application's reference only.
#include <rdmx/connection.hpp>
#include <rdmx/queues.hpp>

#include "backends.hpp"
#include "cuda_driver.hpp"
#include "log.hpp"
#include "shared_memory.hpp"

namespace rdmx
{
namespace
{

class domain_handle final : public domain
{
public:
    explicit domain_handle(std::shared_ptr<domain> backend) noexcept : backend_(std::move(backend)) {}
    ~domain_handle() override { detail::settle_verbs_domain(*backend_); }

    domain& backend_domain() noexcept { return *backend_; }

    rdmx::backend backend() const noexcept override { return backend_->backend(); }
    const device_limits& limits() const noexcept override { return backend_->limits(); }
    std::unique_ptr<memory_region> register_placed(void* addr, std::size_t length, rdmx::access rights,
                                                   rdmx::memory_type type, int device) override
    {
        return backend_->register_placed(addr, length, rights, type, device);
    }
    std::unique_ptr<memory_region> register_allocated(detail::shared_memory& mem,
                                                      rdmx::access rights) override
    {
        return backend_->register_allocated(mem, rights);
    }
    std::unique_ptr<memory_window> allocate_window() override { return backend_->allocate_window(); }
    std::unique_ptr<listener> listen(std::string_view address, const listen_options& opts) override
    {
        return backend_->listen(address, opts);
    }
    std::unique_ptr<connection> connect(std::string_view address, const connection_options& opts,
                                        std::span<const std::byte> private_data,
                                        std::span<const recv_request> initial_recvs) override
    {
        return backend_->connect(address, opts, private_data, initial_recvs);
    }
    std::unique_ptr<connection> start_connect(std::string_view address, const connection_options& opts,
                                              std::span<const std::byte> private_data,
                                              std::span<const recv_request> initial_recvs) override
    {
        return backend_->start_connect(address, opts, private_data, initial_recvs);
    }
    std::shared_ptr<completion_queue> create_completion_queue(const completion_queue_options& opts) override
    {
        return backend_->create_completion_queue(opts);
    }
    std::shared_ptr<shared_receive_queue>
    create_shared_receive_queue(const shared_receive_queue_options& opts) override
    {
        return backend_->create_shared_receive_queue(opts);
    }
    ibv_context* native_context() const noexcept override { return backend_->native_context(); }
    ibv_pd* native_pd() const noexcept override { return backend_->native_pd(); }

private:
    std::shared_ptr<domain> backend_;
};

/// The application's handle on `backend`, opened for `address`; says at info level which
/// backend (and device) the address took, so that a silent fallback (auto:// to TCP) shows.
std::unique_ptr<domain> handle(std::shared_ptr<domain> backend, std::string_view address)
{
    if (!backend)
        return nullptr;
    const bool automatic = address.starts_with("auto://") && backend->backend() == backend::tcp;
    RDMX_LOG(info, "domain::open(%.*s): backend %s, device %s%s", static_cast<int>(address.size()),
             address.data(), to_string(backend->backend()), backend->limits().device_name.c_str(),
             automatic ? " (peers on this host: shm)" : "");
    return std::make_unique<domain_handle>(std::move(backend));
}

} // namespace

std::unique_ptr<memory_region> domain::register_memory(void* addr, std::size_t length, rdmx::access rights,
                                                       rdmx::memory_type type)
{
    detail::memory_placement p = detail::place_memory(addr, length, type, "register_memory");
    return register_placed(addr, length, rights, p.type, p.device);
}

std::unique_ptr<memory_region> domain::allocate_memory(std::size_t length, rdmx::access rights)
{
    auto mem = std::make_shared<detail::shared_memory>(length);
    std::unique_ptr<memory_region> r = register_allocated(*mem, rights);
    r->owned_ = std::move(mem); // freed after the region's deregistration (memory_region)
    return r;
}

std::unique_ptr<memory_region> domain::register_allocated(detail::shared_memory& mem, rdmx::access rights)
{
    return register_placed(mem.data(), mem.size(), rights, memory_type::host, -1);
}

std::unique_ptr<domain> domain::open(std::string_view address, std::chrono::milliseconds timeout)
{
    uri u = uri::parse(address);
    switch (u.scheme) {
    case scheme::tcp: return handle(detail::open_tcp_domain(), address);
    case scheme::shm: return handle(detail::open_tcp_domain(backend::shm), address);
    case scheme::rdma: return handle(detail::open_verbs_domain(u, timeout, true), address);
    case scheme::automatic:
        if (auto d = detail::open_verbs_domain(u, timeout, false))
            return handle(std::move(d), address);
        return handle(detail::open_tcp_domain(backend::tcp, true), address);
    }
    throw_error(errc::invalid_argument, "domain::open: unknown scheme");
}

domain& detail::backend_domain(domain& d) noexcept
{
    auto* h = dynamic_cast<domain_handle*>(&d);
    return h ? h->backend_domain() : d;
}

} // namespace rdmx
