// CUDA device memory and its registration for GPUDirect RDMA.
#include <rdmx/gpu.hpp>

#include <cuda_runtime_api.h>

#include <string>

namespace rdmx::gpu
{
namespace
{

void check(cudaError_t rc, const char* call)
{
    if (rc != cudaSuccess)
        throw error(make_error_code(errc::invalid_argument),
                    std::string(call) + ": " + cudaGetErrorString(rc));
}

} // namespace

int device_count() noexcept
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

device_buffer::device_buffer(std::size_t size, int device) : size_(size), device_(device)
{
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaMalloc(&ptr_, size), "cudaMalloc");
}

device_buffer::~device_buffer()
{
    cudaSetDevice(device_);
    cudaFree(ptr_);
}

void device_buffer::copy_from_host(const void* src, std::size_t n, std::size_t offset)
{
    if (offset > size_ || n > size_ - offset)
        throw_error(errc::invalid_argument, "device_buffer::copy_from_host: out of range");
    check(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, n, cudaMemcpyHostToDevice), "cudaMemcpy");
}

void device_buffer::copy_to_host(void* dst, std::size_t n, std::size_t offset) const
{
    if (offset > size_ || n > size_ - offset)
        throw_error(errc::invalid_argument, "device_buffer::copy_to_host: out of range");
    check(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

std::unique_ptr<memory_region> register_device_memory(domain& dom, const device_buffer& buf,
                                                      rdmx::access rights)
{
    if (dom.backend() != backend::verbs)
        throw_error(errc::invalid_argument,
                    "register_device_memory: GPU memory needs the verbs backend (GPUDirect RDMA); "
                    "the TCP backend cannot reach device memory");
    // With nvidia-peermem loaded, ibv_reg_mr pins device pages like host pages.
    return dom.register_memory(buf.data(), buf.size(), rights);
}

} // namespace rdmx::gpu
