#include "log.hpp"

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace rdmx
{
namespace detail
{

constinit std::atomic<int> log_threshold{log_level_unread};

namespace
{

constexpr log_level default_level = log_level::warn;
constexpr std::array<const char*, 6> level_names{"off", "error", "warn", "info", "debug", "trace"};

// The sink and the lock that hands it one message at a time. Never destroyed: engine
// threads may still log while static objects are destroyed at exit.
struct sink_slot {
    std::mutex mu;
    log_sink sink; // empty: the default, stderr
};

sink_slot& slot()
{
    static sink_slot* s = new sink_slot;
    return *s;
}

void send(log_level l, std::string_view text) noexcept
{
    sink_slot& s = slot();
    std::lock_guard lk(s.mu);
    if (!s.sink) {
        // One write per line (stderr is unbuffered), so lines of several threads never mix.
        std::fprintf(stderr, "rdmx: %.*s\n", static_cast<int>(text.size()), text.data());
        return;
    }
    try {
        s.sink(l, text);
    } catch (...) { // a sink that throws loses its message, never the library's thread
    }
}

void vlog(log_level l, const char* fmt, va_list ap) noexcept
{
    char line[log_line_max];
    int n = std::vsnprintf(line, sizeof line, fmt, ap);
    if (n < 0)
        return;
    send(l, std::string_view(line, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof line - 1)));
}

// Reads RDMX_LOG once (the first caller does; the others wait for it) and, unless
// set_log_level came first, makes it the level. Returns the level in force.
int read_environment() noexcept
{
    static const bool done = [] {
        bool unknown = false;
        const char* value = std::getenv("RDMX_LOG");
        log_level l = log_level_from_env(value, default_level, unknown);
        int expected = log_level_unread;
        log_threshold.compare_exchange_strong(expected, static_cast<int>(l));
        if (unknown && log_enabled(log_level::warn)) {
            char line[log_line_max];
            std::snprintf(line, sizeof line,
                          "RDMX_LOG=%.64s is not a level (off, error, warn, info, debug, trace); using %s",
                          value, to_string(default_level));
            send(log_level::warn, line);
        }
        return true;
    }();
    (void)done;
    return log_threshold.load(std::memory_order_relaxed);
}

} // namespace

log_level log_level_from_env(const char* value, log_level fallback, bool& unknown) noexcept
{
    unknown = false;
    if (value == nullptr || *value == '\0')
        return fallback;
    if (auto l = parse_log_level(value))
        return *l;
    unknown = true;
    return fallback;
}

void log_write(log_level l, const char* fmt, ...) noexcept
{
    if (static_cast<int>(l) > read_environment())
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(l, fmt, ap);
    va_end(ap);
}

bool log_rate_limit::admit(std::uint64_t& dropped) noexcept
{
    std::lock_guard lk(mu_);
    auto now = std::chrono::steady_clock::now();
    std::chrono::duration<double> dt = now - refilled_;
    refilled_ = now;
    tokens_ = std::min<double>(burst_, tokens_ + dt.count() * per_second_);
    if (tokens_ < 1) {
        ++dropped_;
        ++dropped_all_;
        return false;
    }
    tokens_ -= 1;
    dropped = dropped_;
    dropped_ = 0;
    return true;
}

std::uint64_t log_rate_limit::suppressed() noexcept
{
    std::lock_guard lk(mu_);
    return dropped_all_;
}

void log_limited(log_rate_limit& limit, log_level l, const char* fmt, ...) noexcept
{
    if (static_cast<int>(l) > read_environment())
        return;
    std::uint64_t dropped = 0;
    if (!limit.admit(dropped))
        return;
    if (dropped > 0) {
        char count[64];
        std::snprintf(count, sizeof count, "%llu similar messages suppressed (rate limit)",
                      static_cast<unsigned long long>(dropped));
        send(l, count);
    }
    va_list ap;
    va_start(ap, fmt);
    vlog(l, fmt, ap);
    va_end(ap);
}

} // namespace detail

const char* to_string(log_level l) noexcept
{
    auto i = static_cast<std::size_t>(l);
    return i < detail::level_names.size() ? detail::level_names[i] : "?";
}

std::optional<log_level> parse_log_level(std::string_view name) noexcept
{
    for (std::size_t i = 0; i < detail::level_names.size(); ++i) {
        std::string_view candidate = detail::level_names[i];
        if (name.size() == candidate.size() &&
            std::equal(name.begin(), name.end(), candidate.begin(),
                       [](char a, char b) { return (a >= 'A' && a <= 'Z' ? a - 'A' + 'a' : a) == b; }))
            return static_cast<log_level>(i);
    }
    return std::nullopt;
}

log_level get_log_level() noexcept
{
    return static_cast<log_level>(detail::read_environment());
}

void set_log_level(log_level l) noexcept
{
    detail::read_environment(); // so that a later first read cannot undo this choice
    detail::log_threshold.store(static_cast<int>(l), std::memory_order_relaxed);
}

void set_log_sink(log_sink sink)
{
    detail::sink_slot& s = detail::slot();
    std::lock_guard lk(s.mu);
    s.sink = std::move(sink);
}

} // namespace rdmx
