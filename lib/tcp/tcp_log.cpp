#include "tcp/tcp_log.hpp"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace rdmx::tcp
{
namespace
{

struct log_limiter {
    std::mutex mu;
    double tokens = log_burst;
    std::chrono::steady_clock::time_point refilled = std::chrono::steady_clock::now();
    std::uint64_t dropped = 0;     ///< since the last line that passed
    std::uint64_t dropped_all = 0; ///< since the start
};

log_limiter& limiter() noexcept
{
    static log_limiter l;
    return l;
}

} // namespace

void log_limited(const char* fmt, ...) noexcept
{
    log_limiter& l = limiter();
    std::uint64_t dropped = 0;
    {
        std::lock_guard lk(l.mu);
        auto now = std::chrono::steady_clock::now();
        std::chrono::duration<double> dt = now - l.refilled;
        l.refilled = now;
        l.tokens = std::min<double>(log_burst, l.tokens + dt.count() * log_lines_per_second);
        if (l.tokens < 1) {
            ++l.dropped;
            ++l.dropped_all;
            return;
        }
        l.tokens -= 1;
        dropped = l.dropped;
        l.dropped = 0;
    }
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    // One write per line, so that lines from several threads do not interleave.
    if (dropped > 0)
        std::fprintf(stderr, "rdmx tcp: %llu similar messages suppressed (rate limit)\nrdmx tcp: %s\n",
                     static_cast<unsigned long long>(dropped), line);
    else
        std::fprintf(stderr, "rdmx tcp: %s\n", line);
}

std::uint64_t log_suppressed() noexcept
{
    log_limiter& l = limiter();
    std::lock_guard lk(l.mu);
    return l.dropped_all;
}

} // namespace rdmx::tcp
