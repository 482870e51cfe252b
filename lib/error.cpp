#include <rdmx/error.hpp>

#include "errno_status.hpp"

#include <cerrno>
#include <cstring>
#include <string>

namespace rdmx
{
namespace
{

class rdmx_category final : public std::error_category
{
public:
    const char* name() const noexcept override { return "rdmx"; }

    std::string message(int ev) const override
    {
        switch (static_cast<errc>(ev)) {
        case errc::remote_access: return "remote access error (bad key, bounds or rights)";
        case errc::flushed: return "work request flushed";
        case errc::rnr_retry_exceeded: return "receiver not ready: RNR retries exceeded";
        case errc::transport_retry_exceeded: return "transport retries exceeded (peer not answering)";
        case errc::remote_invalid_request: return "remote invalid request";
        case errc::remote_operation: return "remote operation error";
        case errc::local_length: return "local length error (message larger than receive buffer)";
        case errc::local_protection: return "local protection error (buffer lacks access rights)";
        case errc::local_qp_operation: return "local queue pair operation error";
        case errc::bad_response: return "bad response from peer";
        case errc::completion_error: return "completion error";
        case errc::connection_refused: return "connection refused (nobody listens)";
        case errc::rejected: return "connection rejected by peer";
        case errc::unreachable: return "peer unreachable";
        case errc::timed_out: return "timed out";
        case errc::disconnected: return "disconnected";
        case errc::peer_lost: return "peer lost (it vanished without disconnecting)";
        case errc::canceled: return "canceled (the application gave the operation up)";
        case errc::would_block: return "queue full, try again";
        case errc::invalid_argument: return "invalid argument";
        case errc::not_connected: return "not connected";
        case errc::no_device: return "no RDMA device serves this address";
        case errc::protocol_error: return "protocol error from peer";
        case errc::not_supported: return "operation not supported by this device or transport";
        case errc::no_resources: return "no room on a shared queue for this connection";
        }
        return "unknown rdmx error " + std::to_string(ev);
    }
};

} // namespace

const std::error_category& category() noexcept
{
    static const rdmx_category cat;
    return cat;
}

void throw_errno(int err, const char* verb)
{
    // Some providers return negative errnos (libsiw), and some fail without setting errno
    // at all: "Success" must never be the reason a call failed.
    if (err < 0)
        err = -err;
    if (err == 0)
        throw error(std::error_code(EIO, std::system_category()),
                    std::string(verb) + ": provider failed without an errno");
    throw error(std::error_code(err, std::system_category()), verb);
}

void throw_error(errc code, const std::string& verb)
{
    throw error(make_error_code(code), verb);
}

namespace detail
{

errc errc_of_errno(int err) noexcept
{
    switch (err < 0 ? -err : err) {
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
    case ESHUTDOWN: return errc::peer_lost;
    case ENOTCONN:
    case EPERM:
    case EIO: return errc::not_connected;
    case ECONNREFUSED: return errc::connection_refused;
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EADDRNOTAVAIL:
    case EAFNOSUPPORT: return errc::unreachable;
    case ETIMEDOUT: return errc::timed_out;
    case ENOMEM:
    case ENOBUFS: return errc::no_resources;
    case EINVAL: return errc::invalid_argument;
    case EAGAIN: return errc::would_block;
    case EOPNOTSUPP: return errc::not_supported;
    default: return errc::completion_error;
    }
}

std::error_code in_rdmx_category(std::error_code ec) noexcept
{
    if (!ec || ec.category() == category())
        return ec;
    return errc_of_errno(ec.value());
}

} // namespace detail
} // namespace rdmx
