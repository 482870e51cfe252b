// One-sided operations by peer handle: write, read, the atomics and memory-window bind and
// invalidate. Each is checked up front as the connection would check it, then takes an
// operation slot and is issued like a send (ep_datapath.cpp): dialled, queued and posted
// on the peer's chosen connection alone. No allocation.
#include "endpoint/ep_endpoint.hpp"

namespace rdmx::ep
{

std::error_code endpoint_impl::write(rdmx::peer to, std::span<const sge> local, const remote_buffer& remote,
                                     std::uint64_t context) noexcept
{
    std::uint32_t pi = index_of(to);
    std::uint64_t total = 0;
    if (pi == nil || local.size() > send_sge_)
        return errc::invalid_argument;
    if (auto ec = check_sges(local, access::none, &total))
        return ec;
    return start_op(pi, endpoint_op::write, false, 0, local, total, remote, context);
}

std::error_code endpoint_impl::read(rdmx::peer from, std::span<const sge> local, const remote_buffer& remote,
                                    std::uint64_t context) noexcept
{
    std::uint32_t pi = index_of(from);
    std::uint64_t total = 0;
    if (pi == nil || local.size() > send_sge_)
        return errc::invalid_argument;
    if (auto ec = check_sges(local, access::local_write, &total))
        return ec;
    return start_op(pi, endpoint_op::read, false, 0, local, total, remote, context);
}

// Atomics and windows by peer handle go through the same slot, queue and connection as
// write and read: the first one to an idle peer dials it, they wait (bounded, with the
// connect deadline) while it connects, and they are posted on the peer's chosen connection
// alone, so a window is never bound on a connection that a simultaneous connect's
// tie-break tears down. What the device lacks is refused before any of that.

std::error_code endpoint_impl::fetch_add(rdmx::peer to, const sge& local, const remote_buffer& remote,
                                         std::uint64_t add, std::uint64_t context) noexcept
{
    return start_atomic(index_of(to), endpoint_op::fetch_add, local, remote, add, 0, context);
}

std::error_code endpoint_impl::compare_swap(rdmx::peer to, const sge& local, const remote_buffer& remote,
                                            std::uint64_t compare, std::uint64_t swap,
                                            std::uint64_t context) noexcept
{
    return start_atomic(index_of(to), endpoint_op::compare_swap, local, remote, compare, swap, context);
}

std::error_code endpoint_impl::start_atomic(std::uint32_t pi, endpoint_op kind, const sge& local,
                                            const remote_buffer& remote, std::uint64_t compare_add,
                                            std::uint64_t swap, std::uint64_t context) noexcept
{
    if (!dom_.limits().atomics)
        return errc::not_supported; // siw: atomic_cap = IBV_ATOMIC_NONE
    if (pi == nil)
        return errc::invalid_argument;
    // The connection's own checks (docs/atomics.md), here so that a queued atomic cannot
    // fail later for what was wrong when it was issued.
    std::uint64_t total = 0;
    if (auto ec = check_sges({&local, 1}, access::none, &total))
        return ec;
    if (local.length != 8 || remote.addr % 8 != 0 || remote.length < 8 || remote.backend != dom_.backend())
        return errc::invalid_argument;
    if (!any(local.region->access() & access::local_write))
        return errc::local_protection; // as connection::post: the old value lands there
    std::uint32_t oi = take_op(pi, kind, context);
    if (oi == nil)
        return errc::would_block;
    op_slot& o = ops_[oi];
    o.length = 8;
    o.nsge = 1;
    o.sges[0] = local;
    o.remote = remote;
    o.compare_add = compare_add;
    o.swap = swap;
    return issue(pi, oi);
}

std::error_code endpoint_impl::bind_window(rdmx::peer to, memory_window& window, const memory_region& region,
                                           std::uint64_t offset, std::uint64_t length, rdmx::access rights,
                                           std::uint64_t context) noexcept
{
    if (!dom_.limits().memory_windows)
        return errc::not_supported; // siw: no type 2 windows
    std::uint32_t pi = index_of(to);
    if (pi == nil)
        return errc::invalid_argument;
    // What the window and the region must be (rdmx/memory.hpp; the connection checks the same
    // in post()), checked before queueing.
    constexpr access remote_rights = access::remote_read | access::remote_write | access::remote_atomic;
    if (window.owner() != ctrl_mr_->owner() || region.owner() != ctrl_mr_->owner() || length == 0 ||
        offset > region.size() || length > region.size() - offset ||
        !any(region.access() & access::bind_window) || (rights & remote_rights) != rights ||
        (rights & region.access()) != rights)
        return errc::invalid_argument;
    std::uint32_t oi = take_op(pi, endpoint_op::bind_window, context);
    if (oi == nil)
        return errc::would_block;
    op_slot& o = ops_[oi];
    o.length = length;
    o.sges[0] = sge{&region, static_cast<std::size_t>(offset), static_cast<std::size_t>(length)};
    o.window = &window;
    o.rights = rights;
    return issue(pi, oi);
}

std::error_code endpoint_impl::invalidate_window(rdmx::peer to, memory_window& window,
                                                 std::uint64_t context) noexcept
{
    if (!dom_.limits().memory_windows)
        return errc::not_supported;
    std::uint32_t pi = index_of(to);
    if (pi == nil || window.owner() != ctrl_mr_->owner())
        return errc::invalid_argument;
    std::uint32_t oi = take_op(pi, endpoint_op::invalidate_window, context);
    if (oi == nil)
        return errc::would_block;
    // Posted like the rest, also when the connection the window was bound on is gone (it
    // revoked the window): verbs still holds it bound and refuses to bind it again until an
    // invalidation frees it, which any connection of the domain may post.
    ops_[oi].window = &window;
    return issue(pi, oi);
}

} // namespace rdmx::ep
