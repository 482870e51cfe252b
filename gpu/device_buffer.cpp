// rdmx::gpu::device_buffer on the CUDA driver API, loaded at run time (lib/cuda_driver.hpp).
#include <rdmx/error.hpp>
#include <rdmx/gpu.hpp>

#include <optional>

#include "cuda_driver.hpp"

namespace rdmx::gpu
{
namespace
{

const detail::cuda_driver& driver()
{
    std::string why;
    const detail::cuda_driver* d = detail::cuda(&why);
    if (d == nullptr)
        throw_error(errc::not_supported, "device_buffer: " + why);
    return *d;
}

void check(const detail::cuda_driver& d, detail::cu_result rc, const char* call)
{
    if (rc != detail::cu_success)
        throw_error(errc::invalid_argument, d.describe(call, rc));
}

} // namespace

int device_count() noexcept
{
    const detail::cuda_driver* d = detail::cuda();
    int n = 0;
    if (d == nullptr || d->device_get_count(&n) != detail::cu_success)
        return 0;
    return n;
}

std::string unavailable_reason()
{
    std::string why;
    if (detail::cuda(&why) != nullptr && device_count() == 0)
        why = "the CUDA driver sees no device";
    return why;
}

device_buffer::device_buffer(std::size_t size, int device, allocation kind, std::size_t pieces)
    : size_(size), device_(device), kind_(kind)
{
    const detail::cuda_driver& d = driver();
    detail::device_scope scope(d, device);
    if (kind == allocation::plain) {
        check(d, d.mem_alloc(&ptr_, size), "cuMemAlloc");
        return;
    }
    if (pieces == 0 || size == 0)
        throw_error(errc::invalid_argument,
                    "device_buffer: virtual memory needs a size and at least one piece");
    detail::cu_device dev;
    check(d, d.device_get(&dev, device), "cuDeviceGet");
    int vmm = 0, rdma = 0;
    check(d,
          d.device_get_attribute(&vmm, detail::cu_device_attribute_virtual_memory_management_supported, dev),
          "cuDeviceGetAttribute");
    if (!vmm)
        throw_error(errc::not_supported, "device_buffer: CUDA device " + std::to_string(device) +
                                             " has no virtual memory management (cuMemCreate)");
    d.device_get_attribute(&rdma, detail::cu_device_attribute_gpu_direct_rdma_with_cuda_vmm_supported, dev);
    detail::cu_mem_allocation_prop prop{};
    prop.type = detail::cu_mem_allocation_type_pinned;
    prop.location = {detail::cu_mem_location_type_device, device};
    prop.alloc_flags.gpu_direct_rdma_capable = rdma ? 1 : 0;
    std::size_t gran = 0;
    check(d, d.mem_get_allocation_granularity(&gran, &prop, detail::cu_mem_alloc_granularity_minimum),
          "cuMemGetAllocationGranularity");
    std::size_t per = (size + pieces - 1) / pieces;
    piece_ = (per + gran - 1) / gran * gran;
    reserved_ = piece_ * pieces;
    check(d, d.mem_address_reserve(&ptr_, reserved_, 0, 0, 0), "cuMemAddressReserve");
    try {
        for (std::size_t i = 0; i < pieces; ++i) {
            detail::cu_mem_handle h;
            check(d, d.mem_create(&h, piece_, &prop, 0), "cuMemCreate");
            handles_.push_back(h);
            check(d, d.mem_map(ptr_ + i * piece_, piece_, 0, h, 0), "cuMemMap");
        }
        detail::cu_mem_access_desc acc{{detail::cu_mem_location_type_device, device},
                                       detail::cu_mem_access_flags_prot_readwrite};
        check(d, d.mem_set_access(ptr_, reserved_, &acc, 1), "cuMemSetAccess");
    } catch (...) {
        release();
        throw;
    }
}

device_buffer::~device_buffer()
{
    release();
}

void device_buffer::release() noexcept
{
    const detail::cuda_driver* d = detail::cuda();
    if (d == nullptr || ptr_ == 0)
        return;
    std::optional<detail::device_scope> scope;
    try {
        scope.emplace(*d, device_);
    } catch (const error&) {
        return;
    }
    if (kind_ == allocation::plain) {
        d->mem_free(ptr_);
    } else {
        for (std::size_t i = 0; i < handles_.size(); ++i) {
            d->mem_unmap(ptr_ + i * piece_, piece_);
            d->mem_release(handles_[i]);
        }
        handles_.clear();
        d->mem_address_free(ptr_, reserved_);
    }
    ptr_ = 0;
}

void device_buffer::copy_from_host(const void* src, std::size_t n, std::size_t offset)
{
    if (offset > size_ || n > size_ - offset)
        throw_error(errc::invalid_argument, "device_buffer::copy_from_host: out of range");
    const detail::cuda_driver& d = driver();
    detail::device_scope scope(d, device_);
    check(d, d.memcpy_htod(ptr_ + offset, src, n), "cuMemcpyHtoD");
}

void device_buffer::copy_to_host(void* dst, std::size_t n, std::size_t offset) const
{
    if (offset > size_ || n > size_ - offset)
        throw_error(errc::invalid_argument, "device_buffer::copy_to_host: out of range");
    const detail::cuda_driver& d = driver();
    detail::device_scope scope(d, device_);
    check(d, d.memcpy_dtoh(dst, ptr_ + offset, n), "cuMemcpyDtoH");
}

} // namespace rdmx::gpu
