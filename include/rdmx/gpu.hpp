// GPU memory (GPUDirect RDMA). Installed and built only when rdmx is configured with CUDA
// (RDMX_HAVE_CUDA in <rdmx/config.hpp>), in its own library: link librdmx-gpu
// (`pkg-config rdmx-gpu`); the core librdmx does not depend on CUDA.
#pragma once

#include <cstddef>
#include <memory>

#include <rdmx/connection.hpp>

namespace rdmx::gpu
{

/// Number of CUDA devices visible (0 when there is no GPU or no driver).
int device_count() noexcept;

/// Device memory from cudaMalloc, freed on destruction.
class device_buffer
{
public:
    /// Throws rdmx::error naming the CUDA call ("cudaMalloc: out of memory").
    device_buffer(std::size_t size, int device = 0);
    ~device_buffer();
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;

    void* data() const noexcept { return ptr_; }
    std::size_t size() const noexcept { return size_; }
    void copy_from_host(const void* src, std::size_t n, std::size_t offset = 0);
    void copy_to_host(void* dst, std::size_t n, std::size_t offset = 0) const;

private:
    void* ptr_ = nullptr;
    std::size_t size_ = 0;
    int device_ = 0;
};

/// Registers device memory for RDMA. Needs the verbs backend and a GPUDirect-capable stack
/// (nvidia-peermem or dma-buf); the TCP backend cannot reach device memory and throws
/// errc::invalid_argument.
std::unique_ptr<memory_region> register_device_memory(domain& dom, const device_buffer& buf,
                                                      rdmx::access rights);

} // namespace rdmx::gpu
