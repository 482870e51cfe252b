#include "resolve.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include <rdmx/error.hpp>

namespace rdmx::detail
{

bool scheme_fits(scheme s, backend b) noexcept
{
    switch (s) {
    case scheme::automatic:
        return b !=
               backend::shm; // its choice is made per domain (or, for shm, per connection of a TCP domain)
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

namespace
{

socket_address abstract_socket(const std::string& path) noexcept
{
    socket_address a;
    auto& un = reinterpret_cast<sockaddr_un&>(a.addr);
    un.sun_family = AF_UNIX;
    // sun_path[0] == 0: the abstract namespace. Callers keep path under sun_path's 107 bytes.
    const std::size_t n = std::min(path.size(), sizeof un.sun_path - 1);
    std::memcpy(un.sun_path + 1, path.data(), n);
    a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
    return a;
}

std::uint16_t port_of(const sockaddr_storage& sa) noexcept
{
    return ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(sa).sin6_port
                                          : reinterpret_cast<const sockaddr_in&>(sa).sin_port);
}

} // namespace

socket_address auto_local_address(const sockaddr_storage& tcp) noexcept
{
    // At most 10 + 2 + 45 + 11 (scope) + 6 bytes: well inside sun_path.
    char text[INET6_ADDRSTRLEN] = {};
    std::string host;
    if (tcp.ss_family == AF_INET6) {
        const auto& in6 = reinterpret_cast<const sockaddr_in6&>(tcp);
        ::inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
        host = "[" + std::string(text) + (in6.sin6_scope_id ? "%" + std::to_string(in6.sin6_scope_id) : "") +
               "]";
    } else {
        ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(tcp).sin_addr, text, sizeof text);
        host = text;
    }
    return abstract_socket("rdmx-auto/" + host + ":" + std::to_string(port_of(tcp)));
}

socket_address auto_local_wildcard(const sockaddr_storage& tcp) noexcept
{
    sockaddr_storage any{};
    if (tcp.ss_family == AF_INET6) {
        auto& in6 = reinterpret_cast<sockaddr_in6&>(any);
        in6.sin6_family = AF_INET6;
        in6.sin6_addr = in6addr_any;
        in6.sin6_port = reinterpret_cast<const sockaddr_in6&>(tcp).sin6_port;
    } else {
        auto& in = reinterpret_cast<sockaddr_in&>(any);
        in.sin_family = AF_INET;
        in.sin_addr.s_addr = htonl(INADDR_ANY);
        in.sin_port = reinterpret_cast<const sockaddr_in&>(tcp).sin_port;
    }
    return auto_local_address(any);
}

bool is_local_address(const socket_address& a) noexcept
{
    if (a.addr.ss_family == AF_INET &&
        (ntohl(reinterpret_cast<const sockaddr_in&>(a.addr).sin_addr.s_addr) >> 24) == 127)
        return true;
    if (a.addr.ss_family == AF_INET6 &&
        IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(a.addr).sin6_addr))
        return true;
    if (a.addr.ss_family != AF_INET && a.addr.ss_family != AF_INET6)
        return false;
    // An address of this namespace is one a socket here can bind (port 0: any).
    const int fd = ::socket(a.addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    sockaddr_storage b = a.addr;
    if (b.ss_family == AF_INET6)
        reinterpret_cast<sockaddr_in6&>(b).sin6_port = 0;
    else
        reinterpret_cast<sockaddr_in&>(b).sin_port = 0;
    const bool local = ::bind(fd, reinterpret_cast<const sockaddr*>(&b), a.len) == 0;
    ::close(fd);
    return local;
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
