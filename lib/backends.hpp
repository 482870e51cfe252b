// Internal: how domain::open reaches each backend. The backends define these (the TCP one
// in lib/tcp/, the verbs one in cm/, which builds the verbs domain with rdma_cm, or
// lib/no_verbs.cpp when the rdma feature is off), so that no core file includes a backend.
#pragma once

#include <chrono>
#include <memory>

#include <rdmx/connection.hpp>

namespace rdmx::detail
{

std::unique_ptr<domain> open_tcp_domain();

/// Opens the verbs domain of the device that `address` maps to. With `required` false,
/// returns nullptr (instead of throwing errc::no_device) when no RDMA device serves it.
std::unique_ptr<domain> open_verbs_domain(const uri& address, std::chrono::milliseconds timeout,
                                          bool required);

} // namespace rdmx::detail
