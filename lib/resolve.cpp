#include "resolve.hpp"

#include <netdb.h>

#include <cstring>
#include <string>

#include <rdmx/error.hpp>

namespace rdmx::detail
{

std::vector<socket_address> resolve(const uri& u, bool passive, std::string_view what)
{
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    addrinfo* res = nullptr;
    const std::string port = std::to_string(u.port);
    if (int rc = ::getaddrinfo(u.host.c_str(), port.c_str(), &hints, &res); rc != 0)
        throw error(make_error_code(errc::unreachable),
                    std::string(what) + ": cannot resolve '" + u.host + "' (" + ::gai_strerror(rc) + ")");
    std::vector<socket_address> out;
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
            ai->ai_addrlen > sizeof(sockaddr_storage))
            continue;
        socket_address a;
        std::memcpy(&a.addr, ai->ai_addr, ai->ai_addrlen);
        a.len = ai->ai_addrlen;
        out.push_back(a);
    }
    ::freeaddrinfo(res);
    if (out.empty())
        throw error(make_error_code(errc::unreachable),
                    std::string(what) + ": no IPv4 or IPv6 address for '" + u.host + "'");
    return out;
}

} // namespace rdmx::detail
