// Address URIs: rdma://host:port, tcp://host:port, auto://host:port (or host:port).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rdmx
{

/// Which transport carries a connection.
enum class backend : std::uint8_t {
    verbs = 1, ///< libibverbs through rdma_cm (RC queue pairs)
    tcp = 2,   ///< the Boost.Asio TCP fallback
};

const char* to_string(backend b) noexcept;

/// What the URI asked for: a backend, or the automatic choice.
enum class scheme : std::uint8_t { rdma, tcp, automatic };

struct uri {
    rdmx::scheme scheme = scheme::automatic;
    std::string host;       ///< name or numeric address, IPv6 without brackets
    std::uint16_t port = 0; ///< 0 lets the listener pick a free port

    static constexpr std::uint16_t default_port = 7471;

    /// Parses "rdma://host:port", "tcp://[::1]:port", "auto://host", "host:port".
    /// Throws rdmx::error(invalid_argument) naming the problem.
    static uri parse(std::string_view text);
    std::string to_string() const;
};

} // namespace rdmx
