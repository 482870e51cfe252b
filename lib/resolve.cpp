#include "resolve.hpp"

#include <netdb.h>
#include <sys/un.h>

#include <cstddef>
#include <cstring>
#include <string>

#include <rdmx/error.hpp>

namespace rdmx::detail
{

bool scheme_fits(scheme s, backend b) noexcept
{
    switch (s) {
    case scheme::automatic: return true;
    case scheme::rdma: return b == backend::verbs;
    case scheme::tcp: return b == backend::tcp;
    case scheme::shm: return b == backend::shm;
    }
    return false;
}

void check_scheme(const uri& u, backend b, std::string_view what)
{
    if (scheme_fits(u.scheme, b))
        return;
    const std::string text = u.to_string();
    throw_error(errc::invalid_argument, std::string(what) + ": " + text.substr(0, text.find("://") + 3) +
                                            " address on a " + to_string(b) + " domain");
}

bool shm_name_char(char c) noexcept
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
}

socket_address shm_socket_address(const std::string& name, std::uint16_t port) noexcept
{
    socket_address a;
    auto& un = reinterpret_cast<sockaddr_un&>(a.addr);
    un.sun_family = AF_UNIX;
    // sun_path[0] == 0: the abstract namespace. The name is checked by uri::parse (at most
    // 16 bytes), so this fits sun_path's 108 bytes.
    const std::string path = "rdmx-shm/" + name + ":" + std::to_string(port);
    std::memcpy(un.sun_path + 1, path.data(), path.size());
    a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
    return a;
}

std::vector<socket_address> resolve(const uri& u, bool passive, std::string_view what)
{
    if (u.scheme == scheme::shm)
        return {shm_socket_address(u.host, u.port)};
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
