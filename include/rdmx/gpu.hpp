// CUDA device buffers for samples and tests. Device memory itself needs nothing from here:
// domain::register_memory takes a device pointer (rdmx/memory.hpp, memory_type). These
// helpers use the CUDA driver API through the same run-time loading as the library: no
// CUDA header or library is needed to build or link against them, and on a machine without
// a driver or GPU they report that instead of failing to load.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace rdmx::gpu
{

/// Number of CUDA devices visible; 0 without a GPU or without the driver (loads the
/// driver, libcuda.so.1, on the first call).
int device_count() noexcept;

/// Why CUDA device memory cannot be had here ("libcuda.so.1: cannot open shared object
/// file ...", "cuInit: CUDA_ERROR_NO_DEVICE ..."); empty when the driver works.
std::string unavailable_reason();

/// How a device_buffer's memory is allocated.
enum class allocation {
    plain, ///< cuMemAlloc (what cudaMalloc does)
    /// CUDA virtual memory: `pieces` physical allocations (cuMemCreate) mapped back to back
    /// in one reserved range (cuMemAddressReserve + cuMemMap), as PyTorch's expandable
    /// segments do. Each piece is a multiple of the allocation granularity (2 MiB on most
    /// GPUs), GPUDirect RDMA capable where the device supports that.
    virtual_memory,
};

/// Device memory on one GPU, freed on destruction.
class device_buffer
{
public:
    /// Throws rdmx::error naming the CUDA call ("cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY
    /// ..."), or errc::not_supported naming what is missing when there is no driver.
    explicit device_buffer(std::size_t size, int device = 0, allocation kind = allocation::plain,
                           std::size_t pieces = 1);
    ~device_buffer();
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;

    void* data() const noexcept { return reinterpret_cast<void*>(ptr_); }
    std::size_t size() const noexcept { return size_; }
    int device() const noexcept { return device_; }
    /// Synchronous copies (cuMemcpyHtoD / DtoH); throw invalid_argument out of range.
    void copy_from_host(const void* src, std::size_t n, std::size_t offset = 0);
    void copy_to_host(void* dst, std::size_t n, std::size_t offset = 0) const;

private:
    void release() noexcept;

    unsigned long long ptr_ = 0;
    std::size_t size_ = 0;
    int device_ = 0;
    allocation kind_ = allocation::plain;
    std::size_t reserved_ = 0;                ///< virtual memory: the reserved range
    std::size_t piece_ = 0;                   ///< virtual memory: bytes per allocation
    std::vector<unsigned long long> handles_; ///< virtual memory: cuMemCreate's handles
};

} // namespace rdmx::gpu
