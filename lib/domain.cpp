// domain::open: the backend choice. rdma:// and tcp:// are explicit; auto:// asks rdma_cm
// whether the address maps to an RDMA device and falls back to TCP when it does not.
#include <rdmx/connection.hpp>

#include "backends.hpp"

namespace rdmx
{

std::unique_ptr<domain> domain::open(std::string_view address, std::chrono::milliseconds timeout)
{
    uri u = uri::parse(address);
    switch (u.scheme) {
    case scheme::tcp: return detail::open_tcp_domain();
    case scheme::rdma: return detail::open_verbs_domain(u, timeout, true);
    case scheme::automatic:
        if (auto d = detail::open_verbs_domain(u, timeout, false))
            return d;
        return detail::open_tcp_domain();
    }
    throw_error(errc::invalid_argument, "domain::open: unknown scheme");
}

} // namespace rdmx
