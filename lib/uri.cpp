#include <rdmx/error.hpp>
#include <rdmx/uri.hpp>

#include <charconv>

#include "resolve.hpp"

namespace rdmx
{

const char* to_string(backend b) noexcept
{
    switch (b) {
    case backend::verbs: return "verbs";
    case backend::tcp: return "tcp";
    case backend::shm: return "shm";
    }
    return "?";
}

namespace
{
[[noreturn]] void bad(std::string_view text, const char* why)
{
    throw_error(errc::invalid_argument, "bad address '" + std::string(text) + "': " + why);
}
} // namespace

uri uri::parse(std::string_view text)
{
    uri u;
    std::string_view rest = text;
    if (auto p = rest.find("://"); p != std::string_view::npos) {
        auto s = rest.substr(0, p);
        if (s == "rdma")
            u.scheme = scheme::rdma;
        else if (s == "tcp")
            u.scheme = scheme::tcp;
        else if (s == "auto")
            u.scheme = scheme::automatic;
        else if (s == "shm")
            u.scheme = scheme::shm;
        else
            bad(text, "scheme must be rdma://, tcp://, shm:// or auto://");
        rest.remove_prefix(p + 3);
    }
    std::string_view port;
    if (!rest.empty() && rest.front() == '[') {
        auto close = rest.find(']');
        if (close == std::string_view::npos)
            bad(text, "missing ']'");
        u.host = std::string(rest.substr(1, close - 1));
        rest.remove_prefix(close + 1);
        if (!rest.empty()) {
            if (rest.front() != ':')
                bad(text, "expected ':' after ']'");
            port = rest.substr(1);
            if (port.empty())
                bad(text, "empty port");
        }
    } else {
        auto colon = rest.rfind(':');
        if (colon != std::string_view::npos && rest.find(':') != colon)
            bad(text, "IPv6 addresses need brackets: [::1]:port");
        if (colon == std::string_view::npos) {
            u.host = std::string(rest);
        } else {
            u.host = std::string(rest.substr(0, colon));
            port = rest.substr(colon + 1);
            if (port.empty())
                bad(text, "empty port");
        }
    }
    if (u.host.empty())
        bad(text, "empty host");
    if (u.host.find_first_of("/?#@ ") != std::string::npos)
        bad(text, "unexpected character in host");
    if (u.scheme == scheme::shm) {
        if (u.host.size() > max_shm_name)
            bad(text, "an shm:// name has at most 16 bytes");
        for (char c : u.host)
            if (!detail::shm_name_char(c))
                bad(text, "an shm:// name has letters, digits, '-', '_' and '.' only");
    }
    if (port.empty()) {
        u.port = default_port;
    } else {
        unsigned v = 0;
        auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
        if (ec != std::errc{} || ptr != port.data() + port.size() || v > 65535)
            bad(text, "port must be a number 0..65535");
        u.port = static_cast<std::uint16_t>(v);
    }
    return u;
}

std::string uri::to_string() const
{
    const char* s = scheme == scheme::rdma  ? "rdma://"
                    : scheme == scheme::tcp ? "tcp://"
                    : scheme == scheme::shm ? "shm://"
                                            : "auto://";
    bool v6 = host.find(':') != std::string::npos;
    return std::string(s) + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

} // namespace rdmx
