// Address resolution for the endpoint's address vector (slow path: insert and open).
#include "endpoint/ep_address.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include <rdmx/error.hpp>

#include "resolve.hpp"

namespace rdmx::ep
{

std::string to_text(const net_address& key, backend b, bool automatic)
{
    char buf[INET6_ADDRSTRLEN] = {};
    std::string host;
    if (key.family == shm_family) {
        const auto* name = reinterpret_cast<const char*>(key.ip.data());
        return "shm://" + std::string(name, ::strnlen(name, key.ip.size())) + ":" + std::to_string(key.port);
    }
    if (key.family == 4) {
        ::inet_ntop(AF_INET, key.ip.data(), buf, sizeof buf);
        host = buf;
    } else {
        ::inet_ntop(AF_INET6, key.ip.data(), buf, sizeof buf);
        host = std::string("[") + buf + "]";
    }
    return std::string(automatic           ? "auto://"
                       : b == backend::tcp ? "tcp://"
                                           : "rdma://") +
           host + ":" + std::to_string(key.port);
}

resolved_address resolve_address(std::string_view text, backend b, bool allow_port0, bool automatic)
{
    uri u = uri::parse(text);
    // An endpoint on shm takes shm:// only: auto:// names a host, not a name on this one.
    if (!detail::scheme_fits(u.scheme, b) || (b == backend::shm && u.scheme != scheme::shm))
        throw_error(errc::invalid_argument, "endpoint: address " + std::string(text) +
                                                " is for another backend than the endpoint's (" +
                                                to_string(b) + ")");
    if (u.port == 0 && !allow_port0)
        throw_error(errc::invalid_argument, "endpoint: address " + std::string(text) + " has no port");
    resolved_address out;
    if (u.scheme == scheme::shm) { // uri::parse checked the name: it fits, and valid_shm_name
        out.key.family = shm_family;
        std::memcpy(out.key.ip.data(), u.host.data(), u.host.size());
        out.key.port = u.port;
        out.text = to_text(out.key, b);
        return out;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(u.host.c_str(), nullptr, &hints, &res);
    if (rc != 0 || res == nullptr)
        throw_error(errc::invalid_argument, "endpoint: cannot resolve " + u.host + ": " + ::gai_strerror(rc));
    if (res->ai_family == AF_INET) {
        out.key.family = 4;
        std::memcpy(out.key.ip.data(), &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, 4);
    } else {
        out.key.family = 6;
        std::memcpy(out.key.ip.data(), &reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr, 16);
    }
    ::freeaddrinfo(res);
    const bool wildcard =
        std::all_of(out.key.ip.begin(), out.key.ip.end(), [](std::uint8_t x) { return x == 0; });
    if (wildcard)
        throw_error(errc::invalid_argument, "endpoint: " + std::string(text) +
                                                " is a wildcard; an endpoint's address names one host");
    out.key.port = u.port;
    out.text = to_text(out.key, b, automatic);
    return out;
}

} // namespace rdmx::ep
