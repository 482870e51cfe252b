// The machine's side of the GPU benchmark (tests/gpu/device-check.sh): cuMemcpyDtoH and
// cuMemcpyHtoD bandwidth between one device buffer and page-locked host memory, one
// synchronous copy per call as the TCP backend's staging makes them (docs/gpu.md), at the
// staging chunk's size and at the sizes the rdmx_perf rows use. Prints one line per size;
// exits 77 (skipped) without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include <rdmx/gpu.hpp>

#include "cuda_driver.hpp"

int main()
{
    using clock = std::chrono::steady_clock;
    if (rdmx::gpu::device_count() == 0) {
        std::printf("copy_bw: no CUDA device: %s\n", rdmx::gpu::unavailable_reason().c_str());
        return 77;
    }
    const std::size_t max = 16 << 20;
    const rdmx::detail::cuda_driver& d = *rdmx::detail::cuda();
    void* host = nullptr;
    {
        rdmx::detail::device_scope scope(d, 0);
        if (!d.mem_host_alloc || d.mem_host_alloc(&host, max, rdmx::detail::cu_memhostalloc_portable) != 0) {
            std::printf("copy_bw: cuMemHostAlloc failed\n");
            return 1;
        }
    }
    rdmx::gpu::device_buffer dev(max);
    std::printf("%10s %14s %14s   (page-locked host memory, synchronous copies)\n", "bytes", "DtoH GB/s",
                "HtoD GB/s");
    for (std::size_t size : {std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20,
                             std::size_t{4} << 20, std::size_t{16} << 20}) {
        const std::size_t iters = std::max<std::size_t>(20, (std::size_t{512} << 20) / size);
        double gbs[2];
        for (int dir = 0; dir < 2; ++dir) {
            for (int i = 0; i < 3; ++i) // warm-up
                dir == 0 ? dev.copy_to_host(host, size) : dev.copy_from_host(host, size);
            const auto t0 = clock::now();
            for (std::size_t i = 0; i < iters; ++i)
                dir == 0 ? dev.copy_to_host(host, size) : dev.copy_from_host(host, size);
            const double s = std::chrono::duration<double>(clock::now() - t0).count();
            gbs[dir] = static_cast<double>(size) * static_cast<double>(iters) / s / 1e9;
        }
        std::printf("%10zu %14.2f %14.2f\n", size, gbs[0], gbs[1]);
    }
    rdmx::detail::device_scope scope(d, 0);
    d.mem_free_host(host);
    return 0;
}
