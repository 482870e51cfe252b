// The library side of <rdmx/log.hpp>: the RDMX_LOG macro every component logs with, and a
// rate limit for messages a peer can provoke.
//
//   RDMX_LOG(warn, "closing connection: %s", why);
//
// A level below the one in force costs one load and one compare: the arguments are not
// evaluated, nothing is formatted. A message that passes is formatted into a buffer on the
// stack (at most log_line_max bytes, longer ones are cut) and handed to the sink: no
// allocation, but a mutex and the sink's own cost, so it is for rare events only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include <rdmx/log.hpp>

namespace rdmx::detail
{

inline constexpr std::size_t log_line_max = 512;

/// The level in force as an int; log_level_unread until the environment has been read,
/// which lets every message through to log_write, where the environment is read.
inline constexpr int log_level_unread = static_cast<int>(log_level::trace) + 1;
extern std::atomic<int> log_threshold;

inline bool log_enabled(log_level l) noexcept
{
    return static_cast<int>(l) <= log_threshold.load(std::memory_order_relaxed);
}

/// Formats and sends one message, if `l` passes the level. Any thread; slow path.
[[gnu::cold, gnu::format(printf, 2, 3)]] void log_write(log_level l, const char* fmt, ...) noexcept;

/// The level RDMX_LOG's value names: `fallback` without a value, and for a value that is
/// no level (then `unknown` is set, for the caller to report).
log_level log_level_from_env(const char* value, log_level fallback, bool& unknown) noexcept;

/// A token bucket for messages that a peer can provoke (protocol violations, accept
/// failures): a peer that opens connection after connection must not be able to fill the
/// logs. `burst` lines pass at once, then `per_second`; what is dropped is counted and
/// reported in a message of its own before the next one that passes. Process-wide
/// objects, one per kind of message (constant-initialised, so usable from any thread at
/// any time).
class log_rate_limit
{
public:
    constexpr log_rate_limit(int per_second, int burst) noexcept
        : per_second_(per_second), burst_(burst), tokens_(burst)
    {
    }
    log_rate_limit(const log_rate_limit&) = delete;
    log_rate_limit& operator=(const log_rate_limit&) = delete;

    /// Whether a message may pass now; if so, `dropped` is how many did not since the
    /// last one that did. Takes a token.
    bool admit(std::uint64_t& dropped) noexcept;

    /// Messages dropped since the start (for tests).
    std::uint64_t suppressed() noexcept;

    int per_second() const noexcept { return per_second_; }
    int burst() const noexcept { return burst_; }

private:
    const int per_second_, burst_;
    std::mutex mu_;
    double tokens_;
    std::chrono::steady_clock::time_point refilled_{}; // the epoch: the first call refills fully
    std::uint64_t dropped_ = 0;                        ///< since the last message that passed
    std::uint64_t dropped_all_ = 0;                    ///< since the start
};

/// log_write through a rate limit: first the count of what the limit dropped, if any, then
/// the message. Messages below the level neither take a token nor count as dropped.
[[gnu::cold, gnu::format(printf, 3, 4)]] void log_limited(log_rate_limit& limit, log_level l, const char* fmt,
                                                          ...) noexcept;

} // namespace rdmx::detail

/// Logs a printf-formatted message at `level` (error, warn, info, debug, trace) when that
/// level is in force; otherwise evaluates nothing.
#define RDMX_LOG(level, ...)                                                                                 \
    do {                                                                                                     \
        if (::rdmx::detail::log_enabled(::rdmx::log_level::level)) [[unlikely]]                              \
            ::rdmx::detail::log_write(::rdmx::log_level::level, __VA_ARGS__);                                \
    } while (0)
