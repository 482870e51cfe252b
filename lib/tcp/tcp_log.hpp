// Log messages that a peer can provoke (protocol violations, a completion ring overrun,
// accept failures), at level warn, through one process-wide rate limit (log.hpp,
// log_rate_limit): log_burst lines at once, refilled at log_lines_per_second; what it
// drops is counted and reported before the next line that passes.
#pragma once

#include <cstdint>

namespace rdmx::tcp
{

inline constexpr int log_lines_per_second = 10;
inline constexpr int log_burst = 10;

/// Logs "tcp: <printf-formatted text>" at level warn, unless the rate limit is spent.
/// Any thread; slow path only (a mutex and a clock read per call).
[[gnu::format(printf, 1, 2)]] void log_limited(const char* fmt, ...) noexcept;

/// Lines dropped by the limit since the process started (for tests).
std::uint64_t log_suppressed() noexcept;

} // namespace rdmx::tcp
