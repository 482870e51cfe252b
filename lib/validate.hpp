// Internal: the checks every backend runs on a work request before posting it, and on the
// options and private data of a connection before setting it up, so that both backends
// reject the same bad input with the same error code, before any byte moves.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <system_error>

#include <rdmx/connection.hpp>
#include <rdmx/memory.hpp>

namespace rdmx::detail
{

/// Largest single message on either backend (RoCE allows 2 GiB; 1 GiB keeps frame
/// lengths far from 32-bit overflow on TCP).
inline constexpr std::uint64_t max_message_size = 1ull << 30;

/// Success as a value. `std::error_code{}` calls std::system_category(), an out-of-line
/// libstdc++ function, and the data path returns success a few times per request.
inline const std::error_code no_error{};

// The checks return errc{} (zero) for success, so that the data path builds an error_code
// only for a failure. They are inline: they run on every request of both backends.

/// Checks a local scatter/gather list: count within `max_sge`, every region registered in
/// domain `owner`, every range inside its region, and local_write where the NIC writes.
/// On success sets `total` to the summed length.
inline errc check_local(std::span<const sge> list, const void* owner, std::uint32_t max_sge,
                        bool needs_local_write, std::uint64_t& total) noexcept
{
    if (list.size() > max_sge)
        return errc::invalid_argument;
    std::uint64_t sum = 0;
    for (const sge& s : list) {
        if (s.region == nullptr || s.region->owner() != owner)
            return errc::invalid_argument;
        if (s.offset > s.region->size() || s.length > s.region->size() - s.offset)
            return errc::invalid_argument;
        if (needs_local_write && s.length > 0 && !any(s.region->access() & access::local_write))
            return errc::local_protection;
        sum += s.length;
    }
    if (sum > max_message_size)
        return errc::invalid_argument;
    total = sum;
    return {};
}

/// Bytes an atomic operates on, at the target and in the local sge.
inline constexpr std::uint64_t atomic_size = 8;

inline bool is_atomic(opcode op) noexcept
{
    return op == opcode::fetch_add || op == opcode::compare_swap;
}

/// The rights a memory window may carry (work_request::bind_access).
inline constexpr access window_rights = access::remote_read | access::remote_write | access::remote_atomic;

inline bool is_window_op(opcode op) noexcept
{
    return op == opcode::bind_window || op == opcode::invalidate_window;
}

/// bind_window and invalidate_window (local operations, nothing travels): a window of this
/// domain, no local list, no inline data; a bind also needs a region of this domain
/// registered with access::bind_window, a non-empty range inside it, and rights that are
/// remote rights of the region. Every violation is errc::invalid_argument (a device
/// without memory windows is the backend's not_supported, checked before this).
inline errc check_window_op(const work_request& wr, const void* owner) noexcept
{
    if (wr.window == nullptr || wr.window->owner() != owner)
        return errc::invalid_argument;
    if (!wr.local.empty() || has(wr.flags, send_flags::inline_data))
        return errc::invalid_argument;
    if (wr.opcode == opcode::invalidate_window)
        return {};
    const memory_region* r = wr.bind_region;
    if (r == nullptr || r->owner() != owner || !any(r->access() & access::bind_window))
        return errc::invalid_argument;
    if (wr.bind_length == 0 || wr.bind_offset > r->size() || wr.bind_length > r->size() - wr.bind_offset)
        return errc::invalid_argument;
    // Only remote rights, and only those the region grants: a window never widens access.
    if ((static_cast<std::uint32_t>(wr.bind_access) & ~static_cast<std::uint32_t>(window_rights)) != 0 ||
        (wr.bind_access & r->access()) != wr.bind_access)
        return errc::invalid_argument;
    return {};
}

/// True when request `i` of a post list binds or invalidates a window that an earlier
/// request of the list binds or invalidates too: refused on both backends (verbs would
/// fill the second with the key the first replaces).
inline bool window_repeated(std::span<const work_request> wrs, std::size_t i) noexcept
{
    for (std::size_t j = 0; j < i; ++j)
        if (is_window_op(wrs[j].opcode) && wrs[j].window == wrs[i].window)
            return true;
    return false;
}

/// Full check of a send-queue request against the connection's limits.
inline errc check_send(const work_request& wr, const void* owner, rdmx::backend b,
                       const connection_limits& lim, std::uint64_t& total) noexcept
{
    if (wr.wr_id == reserved_wr_id) [[unlikely]]
        return errc::invalid_argument;
    const bool atomic = is_atomic(wr.opcode);
    // Reads and atomics land in local memory: the NIC writes it.
    const bool lands_locally = wr.opcode == opcode::read || atomic;
    switch (wr.opcode) {
    case opcode::send:
    case opcode::write:
    case opcode::write_with_imm:
    case opcode::read:
    case opcode::fetch_add:
    case opcode::compare_swap:
    case opcode::send_with_invalidate: break;
    case opcode::bind_window:
    case opcode::invalidate_window: return check_window_op(wr, owner);
    default: return errc::invalid_argument;
    }
    if (errc e = check_local(wr.local, owner, lim.max_send_sge, lands_locally, total); e != errc{})
        return e;
    if (has(wr.flags, send_flags::inline_data) && (lands_locally || total > lim.max_inline))
        return errc::invalid_argument;
    // A verbs provider copies inline data with the CPU, which cannot read device memory
    // (TCP stages it: docs/gpu.md).
    if (has(wr.flags, send_flags::inline_data) && b == backend::verbs)
        for (const sge& s : wr.local)
            if (s.region->memory_type() == memory_type::cuda)
                return errc::invalid_argument;
    // An atomic returns exactly one 8-byte value into one SGE, and its target must be
    // naturally aligned (verbs requires it; the TCP target serves it as a native atomic).
    if (atomic && (wr.local.size() != 1 || total != atomic_size || wr.remote.addr % atomic_size != 0))
        return errc::invalid_argument;
    if (wr.opcode != opcode::send && wr.opcode != opcode::send_with_invalidate) {
        // The descriptor came from the peer: it must be for this backend and the transfer
        // must fit in the range it names. The target checks again (keys can be forged).
        if (wr.remote.backend != b || total > wr.remote.length)
            return errc::invalid_argument;
    }
    return {};
}

inline errc check_recv(const recv_request& wr, const void* owner, const connection_limits& lim,
                       std::uint64_t& total) noexcept
{
    if (wr.wr_id == reserved_wr_id) [[unlikely]]
        return errc::invalid_argument;
    return check_local(wr.local, owner, lim.max_recv_sge, true, total);
}

/// What a connection asks for (`opts`), clamped to what the device grants (`dev`: the
/// domain's limits), and SGE lists to at most `max_sge_per_wr` (what a backend's prebuilt
/// work requests hold, where that is less than the device allows). Set-up only.
connection_limits clamp_limits(const connection_options& opts, const device_limits& dev,
                               std::uint32_t max_sge_per_wr = UINT32_MAX) noexcept;

/// The message private data travels with; each has its limit (max_*_private_data).
enum class private_data_use : std::uint8_t { connect, accept, reject };
/// Throws errc::invalid_argument, "`verb`: private data over N bytes", when `data` is
/// longer than `use` allows. Called before anything is sent, so that a request whose
/// accept or reject fails this check is still unanswered.
void check_private_data(private_data_use use, std::span<const std::byte> data, std::string_view verb);

/// The IBTA encoding of the RNR NAK timer (connection_options::min_rnr_timer) in time.
std::chrono::microseconds rnr_delay(std::uint8_t code) noexcept;

} // namespace rdmx::detail
