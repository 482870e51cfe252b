// Our own protection domain on one opened device, the device's queried limits, and memory
// registration. How the device was found (rdma_cm resolves an address to it) is cm/'s
// business: this takes the context as given.
#pragma once

#include <rdmx/connection.hpp>

#include <memory>
#include <mutex>

#include "verbs/handles.hpp"

namespace rdmx::verbs
{

class verbs_window;

class protection_domain
{
public:
    /// `ctx` is not ours (librdmacm owns it) and must outlive this; `port_num` is the
    /// port whose limits (max message size) apply.
    protection_domain(ibv_context* ctx, std::uint8_t port_num);
    // Regions name it as their owner and connections keep a reference: it stays put.
    protection_domain(const protection_domain&) = delete;
    protection_domain& operator=(const protection_domain&) = delete;

    const device_limits& limits() const noexcept { return limits_; }
    /// Registers with ibv_reg_mr; the region's owner is this protection domain, and it holds
    /// `keepalive` (what owns this protection domain) until it is destroyed.
    std::unique_ptr<memory_region> register_memory(void* addr, std::size_t length, rdmx::access rights,
                                                   std::shared_ptr<const void> keepalive,
                                                   rdmx::memory_type type = memory_type::host,
                                                   int device = -1);
    /// An unbound type 2 window (verbs/verbs_memory.hpp); throws errc::not_supported
    /// without device_limits::memory_windows. Holds `keepalive` as a region does.
    std::unique_ptr<memory_window> allocate_window(std::shared_ptr<const void> keepalive) const;
    /// Guards the links between regions and the windows bound over them (bind on the data
    /// path, a region or window destroyed on any thread).
    std::mutex& window_mutex() const noexcept { return window_mutex_; }
    /// A receive polled says the peer invalidated our window with key `rkey`
    /// (send_with_invalidate): that window is unbound. Walks the windows under the mutex;
    /// only such receives call it.
    void note_invalidated(std::uint32_t rkey) const noexcept;
    /// The wc_flags bit that says a receive invalidated a window (send_with_invalidate):
    /// IBV_WC_WITH_INV, and on rxe the kernel's IB_WC_WITH_INVALIDATE (1 << 2), which rxe
    /// passes to user space untranslated, where it reads as IBV_WC_IP_CSUM_OK (meaningless
    /// on an RC QP; rxe 6.1 and rdma-core 44 seen so).
    unsigned wc_with_inv() const noexcept { return wc_with_inv_; }
    /// The QP `qp` is about to be destroyed: every window whose last bind it posted is
    /// revoked first (ibv_dealloc_mw, a fresh window in its place, unbound). rxe (linux
    /// 6.1) frees a QP that a bound type 2 window still references once its destroy times
    /// out waiting for it: the destroy stalls, and the window then points to freed memory
    /// (seen: its old key working through a later connection; a later QP's send queue
    /// stuck). docs/memory-windows.md, "verbs".
    void revoke_windows_of(const ibv_qp* qp) const noexcept;
    /// The domain's list of windows (verbs_window's constructor and destructor).
    void add_window(verbs_window* w) const noexcept;
    void remove_window(verbs_window* w) const noexcept;
    ibv_context* native_context() const noexcept { return ctx_; }
    ibv_pd* native_pd() const noexcept { return pd_.get(); }
    /// An iWARP device: its CM drives the QP to RTS itself and it has no write with immediate.
    bool iwarp() const noexcept { return iwarp_; }
    /// soft-iWARP (vendor id 0x626d74, "bmt"): see verbs_connection::strands_.
    bool siw() const noexcept { return siw_; }
    /// Entries a completion queue of this device may have (ibv_device_attr::max_cqe).
    std::uint32_t max_cqe() const noexcept { return max_cqe_; }
    /// The largest transport retry count (ibv_qp_attr::retry_cnt) that still means a
    /// number of retries: 7 (IBTA), and 6 on rxe, which takes 7 for "retry forever"
    /// (drivers/infiniband/sw/rxe/rxe_comp.c): a silent peer would never be noticed.
    std::uint8_t max_retry_count() const noexcept { return max_retry_count_; }

private:
    void probe_max_inline();
    /// CUDA device memory: dma-buf (cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr),
    /// else ibv_reg_mr (nvidia-peermem); throws naming both attempts.
    mr_ptr register_device_memory(void* addr, std::size_t length, int flags, int device) const;

    ibv_context* ctx_;
    /// siw: the guard of the context's mmap offsets (verbs/siw_mmap_guard.hpp).
    std::shared_ptr<const void> siw_guard_;
    pd_ptr pd_;
    device_limits limits_;
    bool iwarp_ = false;
    bool siw_ = false;
    std::uint32_t max_cqe_ = 0;
    std::uint8_t max_retry_count_ = 7;
    unsigned wc_with_inv_ = IBV_WC_WITH_INV;
    mutable std::mutex window_mutex_;
    mutable verbs_window* windows_ = nullptr; ///< all windows allocated here (window_mutex_)
};

} // namespace rdmx::verbs
