#include "tcp/tcp_log.hpp"

#include <cstdarg>
#include <cstdio>

#include "log.hpp"

namespace rdmx::tcp
{
namespace
{

constinit detail::log_rate_limit limit(log_lines_per_second, log_burst);

} // namespace

void log_limited(const char* fmt, ...) noexcept
{
    if (!detail::log_enabled(log_level::warn))
        return;
    char line[detail::log_line_max];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    detail::log_limited(limit, log_level::warn, "tcp: %s", line);
}

std::uint64_t log_suppressed() noexcept
{
    return limit.suppressed();
}

} // namespace rdmx::tcp
