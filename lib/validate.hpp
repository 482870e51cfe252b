// Internal: the checks every backend runs on a work request before posting it, so that
// both backends reject the same bad input with the same error code, before any byte moves.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>

#include <rdmx/connection.hpp>

namespace rdmx::detail {

/// Largest single message on either backend (RoCE allows 2 GiB; 1 GiB keeps frame
/// lengths far from 32-bit overflow on TCP).
inline constexpr std::uint64_t max_message_size = 1ull << 30;

/// Checks a local scatter/gather list: count within `max_sge`, every region registered in
/// domain `owner`, every range inside its region, and local_write where the NIC writes.
/// On success sets `total` to the summed length.
std::error_code check_local(std::span<const sge> list, const void* owner, std::uint32_t max_sge,
                            bool needs_local_write, std::uint64_t& total) noexcept;

/// Full check of a send-queue request against the connection's limits.
std::error_code check_send(const work_request& wr, const void* owner, rdmx::backend b,
                           const connection_limits& lim, std::uint64_t& total) noexcept;

inline std::error_code check_recv(const recv_request& wr, const void* owner,
                                  const connection_limits& lim, std::uint64_t& total) noexcept
{
    return check_local(wr.local, owner, lim.max_recv_sge, true, total);
}

/// The IBTA encoding of the RNR NAK timer (connection_options::min_rnr_timer) in time.
std::chrono::microseconds rnr_delay(std::uint8_t code) noexcept;

} // namespace rdmx::detail
