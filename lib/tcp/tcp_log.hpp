// Reports on stderr that a peer can provoke (protocol violations, a completion ring
// overrun, accept failures). A peer that opens connection after connection must not be
// able to fill the logs, so the lines are rate limited, process-wide: a token bucket of
// log_burst lines that refills at log_lines_per_second; what it drops is counted and
// reported in one line before the next line that passes.
#pragma once

#include <cstdint>

namespace rdmx::tcp
{

inline constexpr int log_lines_per_second = 10;
inline constexpr int log_burst = 10;

/// Writes "rdmx tcp: <printf-formatted text>\n" to stderr, unless the rate limit is spent.
/// Any thread; slow path only (a mutex and a clock read per call).
[[gnu::format(printf, 1, 2)]] void log_limited(const char* fmt, ...) noexcept;

/// Lines dropped by the limit since the process started (for tests).
std::uint64_t log_suppressed() noexcept;

} // namespace rdmx::tcp
