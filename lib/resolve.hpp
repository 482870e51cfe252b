// Internal: host name resolution for every backend (the TCP sockets and rdma_cm both take
// a sockaddr), so that both accept the same names and report the same failures.
#pragma once

#include <sys/socket.h>

#include <string_view>
#include <cstdint>
#include <string>
#include <vector>

#include <rdmx/uri.hpp>

namespace rdmx::detail
{

struct socket_address {
    sockaddr_storage addr{};
    socklen_t len = 0;
};

/// Whether an address of scheme `s` may be used on a domain of backend `b` (auto:// on
/// verbs and TCP domains: an shm domain takes shm:// only; auto:// reaches peers on this
/// host through a TCP domain that auto:// chose). Otherwise the caller throws invalid_argument, naming what
/// it is and was given (scheme_mismatch).
bool scheme_fits(scheme s, backend b) noexcept;
/// Throws rdmx::error(invalid_argument) "<what>: <scheme>:// address on a <backend> domain"
/// unless scheme_fits.
void check_scheme(const uri& u, backend b, std::string_view what);

/// A byte an shm:// name may hold: an ASCII letter or digit, '-', '_' or '.' (what
/// uri::parse takes, and an endpoint's identity carries back).
bool shm_name_char(char c) noexcept;

/// The UNIX socket of shm://name:port: in the abstract namespace (no file; the name is
/// the network namespace's, and goes with the last socket bound to it).
socket_address shm_socket_address(const std::string& name, std::uint16_t port) noexcept;

/// The UNIX socket an auto:// listener on the TCP address `tcp` (port resolved) opens
/// beside it: "rdmx-auto/<numeric address>:<port>" in the abstract namespace, so that a
/// client in the same network namespace (and so on the same host) that dials an address
/// of that listener reaches it without TCP (docs/shm.md, "auto://").
socket_address auto_local_address(const sockaddr_storage& tcp) noexcept;
/// The same for the wildcard address (0.0.0.0 or [::]) of `tcp`'s family and port: the
/// socket a wildcard listener that serves `tcp` opens.
socket_address auto_local_wildcard(const sockaddr_storage& tcp) noexcept;
/// Whether `a` (IPv4 or IPv6) is an address of this network namespace: loopback, or one a
/// socket here can bind.
bool is_local_address(const socket_address& a) noexcept;

/// getaddrinfo of host:port of `u` (numeric or by name; passive: for bind), IPv4 and IPv6
/// results only, in getaddrinfo's order of preference: callers try each in turn. A result
/// longer than sockaddr_storage is skipped, never copied in part. Throws
/// rdmx::error(unreachable), naming `what`, when nothing is left. For shm:// the one
/// shm_socket_address.
std::vector<socket_address> resolve(const uri& u, bool passive, std::string_view what);

} // namespace rdmx::detail
