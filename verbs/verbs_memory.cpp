#include "verbs/verbs_memory.hpp"

#include <cerrno>

#include "verbs/protection_domain.hpp"

namespace rdmx::verbs
{

verbs_region::verbs_region(const protection_domain& pd, std::shared_ptr<const void> keepalive, mr_ptr mr,
                           std::byte* data, rdmx::access acc, rdmx::memory_type type, int device)
    : memory_region(&pd, backend::verbs, data, mr->length, acc, mr->lkey, mr->rkey, type, device), pd_(pd),
      keepalive_(std::move(keepalive)), mr_(std::move(mr))
{
}

verbs_region::~verbs_region()
{
    // The windows go first: rxe refuses to deregister an MR with windows bound over it (and
    // would leave them, and the memory, reachable); elsewhere revoking them is the promise.
    std::lock_guard lk(pd_.window_mutex());
    while (verbs_window* w = windows_) {
        windows_ = w->next_;
        w->region_ = nullptr;
        w->next_ = nullptr;
        w->revoke();
    }
    mr_.reset();
}

verbs_window::verbs_window(const protection_domain& pd, std::shared_ptr<const void> keepalive)
    : memory_window(&pd, backend::verbs), pd_(pd), keepalive_(std::move(keepalive)),
      mw_(ibv_alloc_mw(pd.native_pd(), IBV_MW_TYPE_2))
{
    if (!mw_)
        throw_errno(errno, "ibv_alloc_mw");
    pd_.add_window(this);
}

verbs_window::~verbs_window()
{
    pd_.remove_window(this);
    {
        std::lock_guard lk(pd_.window_mutex());
        unlink();
    }
    mw_.reset(); // ibv_dealloc_mw: a bound type 2 window is invalidated with it
}

void verbs_window::unlink() noexcept
{
    if (!region_)
        return;
    for (verbs_window** p = &region_->windows_; *p; p = &(*p)->next_)
        if (*p == this) {
            *p = next_;
            break;
        }
    region_ = nullptr;
    next_ = nullptr;
}

void verbs_window::on_bind(const verbs_region& region, std::uint64_t addr, std::uint64_t length,
                           std::uint32_t rkey, const ibv_qp* via) noexcept
{
    std::lock_guard lk(pd_.window_mutex()); // note_invalidated reads the key
    via_ = via;
    // The provider posts a bind with the window's current key and checks it (rxe: the
    // kernel compares it with its own): ibv_post_send does not update it, so we do.
    mw_->rkey = rkey;
    remote_ = remote_buffer{.addr = addr, .length = length, .key = rkey, .backend = backend::verbs};
    bound_.store(true, std::memory_order_relaxed);
    if (region_ == &region)
        return;
    unlink();
    region_ = &region;
    next_ = region.windows_;
    region.windows_ = this;
}

void verbs_window::revoke_unlinked() noexcept
{
    unlink();
    via_ = nullptr;
    revoke();
}

void verbs_window::revoke() noexcept
{
    mw_.reset();
    // A fresh window in its place, unbound; the old key is gone with the old one.
    mw_.reset(ibv_alloc_mw(pd_.native_pd(), IBV_MW_TYPE_2));
    bound_.store(false, std::memory_order_relaxed);
}

} // namespace rdmx::verbs
