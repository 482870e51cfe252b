// The verbs backend's registered memory: a region is an ibv_mr, a window an ibv_mw (type 2)
// bound over part of one. The data path (verbs_datapath.cpp) binds and invalidates windows
// and keeps the links that protection_domain.cpp's regions need when they go: a region knows
// the windows bound over it, and revokes them before it deregisters (rxe refuses
// ibv_dereg_mr while windows are bound, IBTA 10.6.7.2.6).
#pragma once

#include <rdmx/memory.hpp>

#include <atomic>
#include <memory>

#include "verbs/handles.hpp"

namespace rdmx::verbs
{

class protection_domain;
class verbs_window;

class verbs_region final : public memory_region
{
public:
    /// `data` is the registered address (a dma-buf MR's own addr field holds its offset).
    verbs_region(const protection_domain& pd, std::shared_ptr<const void> keepalive, mr_ptr mr,
                 std::byte* data, rdmx::access acc, rdmx::memory_type type, int device);
    /// Revokes the windows bound over it (verbs_window::revoke), then deregisters.
    ~verbs_region() override;
    ibv_mr* native() const noexcept override { return mr_.get(); }

private:
    friend class verbs_window;
    const protection_domain& pd_;
    std::shared_ptr<const void> keepalive_; ///< owner of the PD; declared first: the MR goes before it
    mr_ptr mr_;
    /// The windows bound over it by a bind posted since (a list linked through
    /// verbs_window::next_; under protection_domain::window_mutex()).
    mutable verbs_window* windows_ = nullptr;
};

/// A type 2 window. Its binding is recorded when the bind is posted (on_bind); the link to
/// the region stays until it is bound elsewhere or destroyed, whether or not an invalidate
/// completed since, so that a region never goes with a window it does not know of.
class verbs_window final : public memory_window
{
public:
    /// Allocates with ibv_alloc_mw(IBV_MW_TYPE_2); throws the verb and errno.
    verbs_window(const protection_domain& pd, std::shared_ptr<const void> keepalive);
    ~verbs_window() override;
    ibv_mw* native() const noexcept override { return mw_.get(); }

    /// Data path, after ibv_post_send on `via` took a bind of this window over `region`'s
    /// [addr, addr + length) with key `rkey`: records the new descriptor, key and QP, and
    /// moves the link to `region`.
    void on_bind(const verbs_region& region, std::uint64_t addr, std::uint64_t length, std::uint32_t rkey,
                 const ibv_qp* via) noexcept;
    /// Data path, after ibv_post_send took an invalidate of it.
    void on_invalidate() noexcept { bound_.store(false, std::memory_order_relaxed); }
    /// Bound by the last bind posted, and since neither invalidated by a post of ours nor
    /// by the peer as far as a receive polled says (protection_domain::note_invalidated).
    /// A type 2 window must be invalid before it is bound again (IBTA o10-37.2.30: rxe
    /// fails such a bind, IBV_WC_MW_BIND_ERR, and the QP with it), so post() refuses that;
    /// and post() refuses to invalidate a window not bound: rxe (linux 6.1) invalidating a
    /// free type 2 window dereferences its null QP, a kernel panic. An invalidation the
    /// peer made is known here only once its receive was polled: invalidate after that.
    bool bound() const noexcept { return bound_.load(std::memory_order_relaxed); }

private:
    friend class verbs_region;
    friend class protection_domain;
    /// The region under it goes: ibv_dealloc_mw (which invalidates a bound type 2 window),
    /// then a fresh ibv_alloc_mw, so that the window stays usable, unbound. If that
    /// allocation fails the window is dead: native() is null and posts naming it are
    /// refused. Under the window mutex.
    void revoke() noexcept;
    /// protection_domain::revoke_windows_of: unlinked from its region, then revoke().
    void revoke_unlinked() noexcept;
    void unlink() noexcept; ///< from region_'s list; under the window mutex

    const protection_domain& pd_;
    std::shared_ptr<const void> keepalive_; ///< declared first: the MW goes before the PD
    mw_ptr mw_;
    const verbs_region* region_ = nullptr; ///< bound over it by the last bind posted
    const ibv_qp* via_ = nullptr;          ///< the QP that posted that bind (revoked with it)
    verbs_window* next_ = nullptr;         ///< in region_->windows_
    verbs_window* all_next_ = nullptr;     ///< in the domain's list of windows (its mutex)
    std::atomic<bool> bound_{false};
};

} // namespace rdmx::verbs
