// Internal: how domain::open reaches each backend. The backends define these (the TCP one
// in lib/tcp/, the verbs one in cm/, which builds the verbs domain with rdma_cm, or
// lib/no_verbs.cpp when the rdma feature is off), so that no core file includes a backend.
//
// A backend's domain is shared: domain::open hands the application a handle (domain.cpp)
// holding one reference, and each region, listener, request and connection made from it
// holds another (shared_from_this), declared before whatever it must outlive. The domain's
// resources (the TCP engine thread, the verbs PD and event thread) thus go with the last of
// them, in any order of destruction. One reference lives on a backend thread: the verbs
// domain's reaper (cm/reaper.hpp) holds the domain while it destroys what a connection's
// destructor must not wait for, and lets its own thread go when that was the last one.
#pragma once

#include <chrono>
#include <memory>

#include <rdmx/connection.hpp>

namespace rdmx::detail
{

/// The TCP backend's domain; with `b` backend::shm, the same engine over UNIX sockets for
/// peers on this host (shm://). `local_peers` (auto://'s TCP domain): auto:// listeners
/// and connections of this domain use UNIX sockets for peers on this host.
std::shared_ptr<domain> open_tcp_domain(backend b = backend::tcp, bool local_peers = false);

/// Opens the verbs domain of the device that `address` maps to. With `required` false,
/// returns nullptr (instead of throwing errc::no_device) when no RDMA device serves it.
std::shared_ptr<domain> open_verbs_domain(const uri& address, std::chrono::milliseconds timeout,
                                          bool required);

/// Waits until nothing of `d` (a backend's domain) is still being destroyed in the
/// background: the verbs domain's reaper has destroyed what it was handed (cm/reaper.hpp).
/// The application's handle calls it as it goes, so that closing a domain leaves no
/// kernel objects of its connections behind.
void settle_verbs_domain(domain& d) noexcept;

/// The backend's domain behind a domain that domain::open returned (for tests that reach
/// into a backend); any other domain is returned as it is.
domain& backend_domain(domain& d) noexcept;

} // namespace rdmx::detail
