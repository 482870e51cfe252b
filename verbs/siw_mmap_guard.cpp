// One CQ per siw context over the mmap offset rdma-core mistakes for none (siw_mmap_guard.hpp).
#include "verbs/siw_mmap_guard.hpp"

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "log.hpp"
#include "verbs/handles.hpp"

namespace rdmx::verbs
{
namespace
{

/// The page rdma-core takes for "no mapping": SIW_INVAL_UOBJ_KEY (<rdma/siw-abi.h>) / 4 KiB.
constexpr unsigned bad_page = 0x90000 / 4096;
/// CQEs of a CQ whose range spans bad_page from wherever it begins below it: 32 bytes a CQE
/// (struct siw_cqe), and siw rounds the count up to a power of two: 32768, 1 MiB.
constexpr int guard_cqes = (bad_page + 1) * 4096 / 32 + 1;

struct guard {
    cq_ptr cq;
};

std::mutex registry_mutex;
std::map<ibv_context*, std::weak_ptr<const guard>> registry;

} // namespace

std::shared_ptr<const void> guard_siw_mmap_offsets(ibv_context* ctx)
{
    std::lock_guard lock(registry_mutex);
    auto& slot = registry[ctx];
    if (auto held = slot.lock())
        return held;
    errno = 0;
    cq_ptr cq(ibv_create_cq(ctx, guard_cqes, nullptr, nullptr, 0));
    if (!cq) {
        const int err = errno;
        RDMX_LOG(warn,
                 "siw: no guard CQ over mmap page %u (ibv_create_cq of %d entries: %s): queues whose "
                 "mapping would begin there fail to be made",
                 bad_page, guard_cqes, err ? std::strerror(err) : "failed without an errno");
        registry.erase(ctx);
        return nullptr;
    }
    // The entry stays in the map after the guard goes (a context pointer, a weak pointer):
    // a later domain on the same context makes a new guard in it.
    auto g = std::shared_ptr<const guard>(new guard{std::move(cq)});
    slot = g;
    return g;
}

} // namespace rdmx::verbs
