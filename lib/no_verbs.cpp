// Built when the rdma feature is disabled: rdma:// fails clearly, auto:// falls back to TCP.
#include "backends.hpp"

namespace rdmx::detail
{

std::shared_ptr<domain> open_verbs_domain(const uri&, std::chrono::milliseconds, bool required)
{
    if (required)
        throw_error(errc::no_device, "rdmx was built without the verbs backend (meson -Drdma=enabled)");
    return nullptr;
}

void settle_verbs_domain(domain&) noexcept {}

} // namespace rdmx::detail
