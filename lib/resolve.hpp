// Internal: host name resolution for every backend (the TCP sockets and rdma_cm both take
// a sockaddr), so that both accept the same names and report the same failures.
#pragma once

#include <sys/socket.h>

#include <string_view>
#include <vector>

#include <rdmx/uri.hpp>

namespace rdmx::detail
{

struct socket_address {
    sockaddr_storage addr{};
    socklen_t len = 0;
};

/// getaddrinfo of host:port of `u` (numeric or by name; passive: for bind), IPv4 and IPv6
/// results only, in getaddrinfo's order of preference: callers try each in turn. A result
/// longer than sockaddr_storage is skipped, never copied in part. Throws
/// rdmx::error(unreachable), naming `what`, when nothing is left.
std::vector<socket_address> resolve(const uri& u, bool passive, std::string_view what);

} // namespace rdmx::detail
