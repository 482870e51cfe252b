// The library's log: rare events only (a connection closed because its peer broke the
// protocol, a CM event nobody expected, an engine thread that stopped). Nothing on the data
// path logs.
//
// The level comes from the environment variable RDMX_LOG (off, error, warn, info, debug,
// trace; case does not matter), read once, at the first message or the first call below;
// without it the level is warn. An unknown value is reported once, and warn applies.
// set_log_level overrides the environment: the program's choice comes last.
//
// Messages go to a sink: by default one line "rdmx: <message>" on stderr.
#pragma once

#include <functional>
#include <optional>
#include <string_view>

namespace rdmx
{

/// Most severe first: a level lets through itself and everything above it.
enum class log_level : int {
    off = 0, ///< nothing
    error,   ///< rdmx cannot do what it promised (an engine or event thread stopped)
    warn,    ///< something went wrong that the library handled (a peer violated the protocol)
    info,
    debug,
    trace,
};

/// "off", "error", "warn", "info", "debug", "trace".
const char* to_string(log_level l) noexcept;

/// The level a name (as RDMX_LOG takes it, any case) stands for; nullopt if none.
std::optional<log_level> parse_log_level(std::string_view name) noexcept;

/// The level in force now (RDMX_LOG, or the last set_log_level).
log_level get_log_level() noexcept;

/// Lets through messages of level `l` and above, from any thread, from now on.
void set_log_level(log_level l) noexcept;

/// Receives each message that passes the level: its level and its text, one line without
/// the trailing newline. The text lives only during the call.
using log_sink = std::function<void(log_level, std::string_view)>;

/// Sends all messages to `sink` from now on; an empty function restores the default
/// (stderr). Messages reach the sink one at a time, from whichever rdmx thread (or
/// application thread) has one, so it needs no lock of its own; once set_log_sink
/// returns, the previous sink is never called again. A sink must not call set_log_sink
/// and should return quickly: it runs on the library's engine and event threads.
void set_log_sink(log_sink sink);

} // namespace rdmx
