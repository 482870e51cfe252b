// rdmx error codes: one category shared by both backends so that the same failure
// reads the same on verbs and on TCP.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace rdmx
{

/// Failures reported by rdmx. Completion statuses (the first group) mirror
/// `ibv_wc_status`; connection failures (the second group) mirror the rdma_cm events.
enum class errc : int {
    // --- completion status (ibv_wc_status) ---
    remote_access = 1,        ///< IBV_WC_REM_ACCESS_ERR: bad key, out of bounds, or no rights
    flushed,                  ///< IBV_WC_WR_FLUSH_ERR: work request flushed (disconnect or error)
    rnr_retry_exceeded,       ///< IBV_WC_RNR_RETRY_EXC_ERR: receiver not ready, retries used up
    transport_retry_exceeded, ///< IBV_WC_RETRY_EXC_ERR: peer did not answer within retries
    remote_invalid_request,   ///< IBV_WC_REM_INV_REQ_ERR: e.g. send larger than the posted receive
    remote_operation,         ///< IBV_WC_REM_OP_ERR: the responder could not complete the operation
    local_length,             ///< IBV_WC_LOC_LEN_ERR: incoming message larger than the receive
    local_protection,         ///< IBV_WC_LOC_PROT_ERR: local buffer lacks the needed access
    local_qp_operation,       ///< IBV_WC_LOC_QP_OP_ERR
    bad_response,             ///< IBV_WC_BAD_RESP_ERR: unexpected response from the peer
    completion_error,         ///< any other ibv_wc_status
    // --- connection management ---
    connection_refused, ///< nobody listens on the port (rdma_cm: REJECTED, invalid service id)
    rejected,           ///< the peer application rejected the request
    unreachable,        ///< address or route could not be resolved, or peer unreachable
    timed_out,          ///< a bounded wait expired
    disconnected,       ///< the connection is gone (peer disconnected or closed)
    // --- API usage ---
    would_block,      ///< queue full: try again after polling completions
    invalid_argument, ///< bad work request, region, offset or length
    not_connected,    ///< operation on a connection that is not established
    no_device,        ///< no RDMA device serves the address
    protocol_error,   ///< the TCP peer violated the wire protocol
    not_supported,    ///< the device or transport lacks the operation (write with immediate on iWARP)
    no_resources,     ///< a shared queue has no room for another connection's depth
    // --- connection management (later additions; values are kept stable) ---
    peer_lost, ///< the peer vanished without disconnecting (its process or host died)
    canceled,  ///< the application gave the operation up (endpoint: removed its peer, or closed)
};

/// The category of `rdmx::errc`; its name is "rdmx".
const std::error_category& category() noexcept;

inline std::error_code make_error_code(errc e) noexcept
{
    return {static_cast<int>(e), category()};
}

/// Exception thrown by set-up and connection management. `what()` starts with the
/// name of the verb or rdma_cm call that failed ("rdma_resolve_addr: ...").
class error : public std::system_error
{
public:
    error(std::error_code ec, const std::string& what) : std::system_error(ec, what) {}
    error(std::error_code ec, const std::string& what, std::vector<std::byte> private_data)
        : std::system_error(ec, what), private_data_(std::move(private_data))
    {
    }
    /// Private data carried by a reject (empty for other errors).
    std::span<const std::byte> private_data() const noexcept { return private_data_; }

private:
    std::vector<std::byte> private_data_;
};

/// Throws `rdmx::error` for an OS errno, naming the verb ("ibv_reg_mr: Cannot allocate memory").
/// A negative errno (as some providers return) counts as its positive; 0 (a provider that
/// failed without setting errno) becomes EIO, "<verb>: provider failed without an errno".
[[noreturn]] void throw_errno(int err, const char* verb);
/// Throws `rdmx::error` for an rdmx code, naming the verb.
[[noreturn]] void throw_error(errc code, const std::string& verb);

} // namespace rdmx

template <> struct std::is_error_code_enum<rdmx::errc> : std::true_type {
};
