// Address URIs: rdma://host:port, tcp://host:port, shm://name:port, auto://host:port (or
// host:port).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rdmx
{

/// Which transport carries a connection.
enum class backend : std::uint8_t {
    verbs = 1, ///< libibverbs through rdma_cm (RC queue pairs)
    tcp = 2,   ///< the Boost.Asio TCP fallback
    /// Peers on the same host (docs/shm.md): the TCP backend's engine over a UNIX stream
    /// socket named in the abstract namespace of the network namespace.
    shm = 3,
};

const char* to_string(backend b) noexcept;

/// What the URI asked for: a backend, or the automatic choice.
enum class scheme : std::uint8_t { rdma, tcp, automatic, shm };

struct uri {
    rdmx::scheme scheme = scheme::automatic;
    /// Name or numeric address, IPv6 without brackets; for shm:// a name of at most
    /// max_shm_name bytes (letters, digits, '-', '_', '.'), which with the port names the
    /// listener on this host.
    std::string host;
    std::uint16_t port = 0; ///< 0 lets the listener pick a free port

    static constexpr std::uint16_t default_port = 7471;
    /// The longest shm:// name (an endpoint carries it in its 40-byte identity).
    static constexpr std::size_t max_shm_name = 16;

    /// Parses "rdma://host:port", "tcp://[::1]:port", "shm://name:port", "auto://host",
    /// "host:port".
    /// Throws rdmx::error(invalid_argument) naming the problem.
    static uri parse(std::string_view text);
    std::string to_string() const;
};

} // namespace rdmx
