// Internal: an OS errno seen on the data path or in a connection's set-up, as the rdmx code
// that names the same failure on every backend. Completion statuses and connection causes
// that reach an application are always in rdmx's category (README, "Errors"); an errno
// becomes one of these where it enters (a socket call, a verbs post), and this is the one
// table for it.
#pragma once

#include <system_error>

#include <rdmx/error.hpp>

namespace rdmx::detail
{

/// The rdmx code for an errno (positive or negative): the peer's end (ECONNRESET, EPIPE:
/// peer_lost), a connection that is not up (ENOTCONN, EPERM and EIO from a post on a QP
/// that left RTS: not_connected), refused, unreachable, timed out, no memory; anything else
/// completion_error.
errc errc_of_errno(int err) noexcept;

/// `ec` when it is rdmx's already (or empty); otherwise its errno's rdmx code.
std::error_code in_rdmx_category(std::error_code ec) noexcept;

} // namespace rdmx::detail
