// GPU memory (docs/gpu.md): the CUDA driver loaded at run time, memory types found by
// register_memory, device buffers, dma-buf export. Tests that need a GPU skip, naming why,
// where none is visible; the suite "gpu-no-driver" runs the no_driver tests with
// RDMX_CUDA_DRIVER naming a file that does not exist, on every machine.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numeric>
#include <vector>

#include <rdmx/gpu.hpp>
#include <rdmx/rdmx.hpp>

#include "cuda_driver.hpp"

#if __has_include(<cuda.h>)
#include <cstddef>

#include <cuda.h>
// The driver ABI lib/cuda_driver.hpp declares, checked against the toolkit's own.
namespace cuabi = rdmx::detail;
static_assert(cuabi::cu_success == CUDA_SUCCESS);
static_assert(cuabi::cu_error_invalid_value == CUDA_ERROR_INVALID_VALUE);
static_assert(cuabi::cu_pointer_attribute_memory_type == CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
static_assert(cuabi::cu_pointer_attribute_is_managed == CU_POINTER_ATTRIBUTE_IS_MANAGED);
static_assert(cuabi::cu_pointer_attribute_device_ordinal == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
static_assert(cuabi::cu_memorytype_device == CU_MEMORYTYPE_DEVICE);
static_assert(cuabi::cu_device_attribute_virtual_memory_management_supported ==
              CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
static_assert(cuabi::cu_device_attribute_gpu_direct_rdma_with_cuda_vmm_supported ==
              CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
static_assert(cuabi::cu_device_attribute_dma_buf_supported == CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
static_assert(cuabi::cu_mem_range_handle_type_dma_buf_fd == CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD);
static_assert(cuabi::cu_mem_allocation_type_pinned == CU_MEM_ALLOCATION_TYPE_PINNED);
static_assert(cuabi::cu_mem_location_type_device == CU_MEM_LOCATION_TYPE_DEVICE);
static_assert(cuabi::cu_mem_access_flags_prot_readwrite == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
static_assert(cuabi::cu_mem_alloc_granularity_minimum == CU_MEM_ALLOC_GRANULARITY_MINIMUM);
static_assert(cuabi::cu_mem_attach_global == CU_MEM_ATTACH_GLOBAL);
static_assert(sizeof(cuabi::cu_deviceptr) == sizeof(CUdeviceptr));
static_assert(sizeof(cuabi::cu_mem_handle) == sizeof(CUmemGenericAllocationHandle));
static_assert(sizeof(cuabi::cu_mem_allocation_prop) == sizeof(CUmemAllocationProp));
static_assert(offsetof(cuabi::cu_mem_allocation_prop, location) == offsetof(CUmemAllocationProp, location));
static_assert(offsetof(cuabi::cu_mem_allocation_prop, alloc_flags) ==
              offsetof(CUmemAllocationProp, allocFlags));
static_assert(sizeof(cuabi::cu_mem_access_desc) == sizeof(CUmemAccessDesc));
static_assert(offsetof(cuabi::cu_mem_access_desc, flags) == offsetof(CUmemAccessDesc, flags));
#endif

namespace rdmx
{
namespace
{

std::string what_of(const std::function<void()>& f, errc* code = nullptr)
{
    try {
        f();
    } catch (const error& e) {
        if (code)
            *code = static_cast<errc>(e.code().value());
        return e.what();
    }
    return "(nothing thrown)";
}

// ---- without a driver (any machine) ------------------------------------------------------

TEST(cuda_driver, a_missing_library_is_named_in_the_reason)
{
    std::string why;
    auto d = detail::load_cuda_driver("/nonexistent/libcuda.so.1", why);
    EXPECT_EQ(d, nullptr);
    EXPECT_NE(why.find("/nonexistent/libcuda.so.1"), std::string::npos) << why;
    EXPECT_NE(why.find("no NVIDIA driver"), std::string::npos) << why;
}

TEST(cuda_driver, the_toolkits_stub_library_is_no_driver)
{
    const char* stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (!std::filesystem::exists(stub))
        GTEST_SKIP() << "no CUDA toolkit here (" << stub << ")";
    // In a child process: the stub's SONAME is libcuda.so.1, so once loaded it would be
    // what every later dlopen("libcuda.so.1") of this process gets, the real driver's place.
    EXPECT_EXIT(
        {
            std::string why;
            auto d = detail::load_cuda_driver(stub, why);
            std::fprintf(stderr, "%s\n", why.c_str());
            std::exit(d == nullptr ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "cuInit: CUDA_ERROR_STUB_LIBRARY");
}

TEST(memory_type, host_memory_registers_as_host_whether_named_or_found)
{
    auto dom = domain::open("tcp://127.0.0.1:0");
    std::vector<std::byte> mem(4096);
    auto a = dom->register_memory(mem.data(), mem.size(), access::remote_write);
    EXPECT_EQ(a->memory_type(), memory_type::host);
    auto b = dom->register_memory(mem.data(), mem.size(), access::remote_write, memory_type::host);
    EXPECT_EQ(b->memory_type(), memory_type::host);
}

bool driver_hidden()
{
    const char* p = std::getenv("RDMX_CUDA_DRIVER");
    return p && std::string(p).find("/nonexistent/") == 0;
}

TEST(no_driver, device_memory_is_refused_naming_the_missing_driver)
{
    if (!driver_hidden())
        GTEST_SKIP() << "runs as meson test gpu-no-driver (RDMX_CUDA_DRIVER=/nonexistent/...)";
    auto dom = domain::open("tcp://127.0.0.1:0");
    std::vector<std::byte> mem(4096);
    errc code{};
    std::string w = what_of(
        [&] { dom->register_memory(mem.data(), mem.size(), access::local_write, memory_type::cuda); }, &code);
    EXPECT_EQ(code, errc::not_supported);
    EXPECT_NE(w.find("register_memory: CUDA device memory needs the CUDA driver"), std::string::npos) << w;
    EXPECT_NE(w.find("/nonexistent/libcuda.so.1"), std::string::npos) << w;
    // Found by itself, the same memory is host memory.
    EXPECT_EQ(dom->register_memory(mem.data(), mem.size(), access::local_write)->memory_type(),
              memory_type::host);
    EXPECT_EQ(gpu::device_count(), 0);
    EXPECT_NE(gpu::unavailable_reason().find("libcuda.so.1"), std::string::npos) << gpu::unavailable_reason();
    code = {};
    w = what_of([] { gpu::device_buffer b(4096); }, &code);
    EXPECT_EQ(code, errc::not_supported);
    EXPECT_NE(w.find("device_buffer: "), std::string::npos) << w;
}

// ---- with a GPU ----------------------------------------------------------------------------

class gpu : public ::testing::Test
{
protected:
    void SetUp() override
    {
        if (rdmx::gpu::device_count() == 0)
            GTEST_SKIP() << "no CUDA device: " << rdmx::gpu::unavailable_reason();
        driver_ = detail::cuda();
    }
    const detail::cuda_driver* driver_ = nullptr;
};

TEST_F(gpu, device_buffers_round_trip_plain_and_virtual)
{
    std::vector<unsigned char> in(3 << 20), out(in.size());
    std::iota(in.begin(), in.end(), 0);
    for (auto kind : {rdmx::gpu::allocation::plain, rdmx::gpu::allocation::virtual_memory}) {
        rdmx::gpu::device_buffer buf(in.size(), 0, kind, 2);
        buf.copy_from_host(in.data(), in.size());
        std::fill(out.begin(), out.end(), 0);
        buf.copy_to_host(out.data(), out.size());
        EXPECT_EQ(in, out);
        EXPECT_THROW(buf.copy_to_host(out.data(), 2, in.size() - 1), error);
    }
}

TEST_F(gpu, register_memory_finds_device_memory_and_tcp_refuses_it_naming_it)
{
    rdmx::gpu::device_buffer buf(1 << 20);
    auto p = detail::place_memory(buf.data(), buf.size(), memory_type::detect, "register_memory");
    EXPECT_EQ(p.type, memory_type::cuda);
    EXPECT_EQ(p.device, 0);
    EXPECT_EQ(p.allocations, 1u);
    auto dom = domain::open("tcp://127.0.0.1:0");
    errc code{};
    std::string w =
        what_of([&] { dom->register_memory(buf.data(), buf.size(), access::remote_write); }, &code);
    EXPECT_EQ(code, errc::not_supported);
    EXPECT_NE(w.find("TCP backend cannot reach CUDA device memory (device 0)"), std::string::npos) << w;
    // Host memory in the same process (the driver loaded) is still host memory.
    std::vector<std::byte> mem(4096);
    EXPECT_EQ(dom->register_memory(mem.data(), mem.size(), access::local_write)->memory_type(),
              memory_type::host);
    // And host memory named as device memory is the caller's mistake.
    code = {};
    w = what_of([&] { dom->register_memory(mem.data(), mem.size(), access::local_write, memory_type::cuda); },
                &code);
    EXPECT_EQ(code, errc::invalid_argument);
    EXPECT_NE(w.find("does not know"), std::string::npos) << w;
}

TEST_F(gpu, registration_leaves_the_threads_current_context_as_it_was)
{
    rdmx::gpu::device_buffer buf(1 << 20);
    ASSERT_EQ(driver_->ctx_set_current(nullptr), detail::cu_success);
    auto p = detail::place_memory(buf.data(), buf.size(), memory_type::detect, "register_memory");
    EXPECT_EQ(p.type, memory_type::cuda);
    std::string why;
    auto ex = detail::export_dmabuf(buf.data(), buf.size(), 0, why);
    if (ex.fd >= 0)
        ::close(ex.fd);
    detail::cu_context now = reinterpret_cast<detail::cu_context>(1);
    ASSERT_EQ(driver_->ctx_get_current(&now), detail::cu_success);
    EXPECT_EQ(now, nullptr) << "rdmx left its primary context current on the application's thread";
}

TEST_F(gpu, a_range_past_its_allocation_is_refused)
{
    rdmx::gpu::device_buffer buf(1 << 20);
    errc code{};
    std::string w = what_of(
        [&] {
            detail::place_memory(buf.data(), std::size_t{1} << 36, memory_type::detect, "register_memory");
        },
        &code);
    EXPECT_EQ(code, errc::invalid_argument);
    EXPECT_NE(w.find("runs past the CUDA device memory mapped there"), std::string::npos) << w;
}

TEST_F(gpu, virtual_memory_spanning_allocations_is_placed_as_one_range)
{
    rdmx::gpu::device_buffer buf(8 << 20, 0, rdmx::gpu::allocation::virtual_memory, 2);
    auto p = detail::place_memory(buf.data(), buf.size(), memory_type::detect, "register_memory");
    EXPECT_EQ(p.type, memory_type::cuda);
    EXPECT_EQ(p.allocations, 2u);
    // Inside one piece, one allocation.
    auto q = detail::place_memory(buf.data(), 4096, memory_type::detect, "register_memory");
    EXPECT_EQ(q.allocations, 1u);
}

TEST_F(gpu, managed_memory_is_refused)
{
    detail::cu_deviceptr m = 0;
    detail::device_scope scope(*driver_, 0);
    ASSERT_EQ(driver_->mem_alloc_managed(&m, 1 << 20, detail::cu_mem_attach_global), detail::cu_success);
    errc code{};
    std::string w = what_of(
        [&] {
            detail::place_memory(reinterpret_cast<void*>(m), 1 << 20, memory_type::detect, "register_memory");
        },
        &code);
    driver_->mem_free(m);
    EXPECT_EQ(code, errc::not_supported);
    EXPECT_NE(w.find("managed memory"), std::string::npos) << w;
}

// dma-buf export is what verbs registers device memory through first; rdma-core imports
// the fd (ibv_reg_dmabuf_mr) only where an RDMA device exists, which the GPU machine lacks.
void expect_export(const detail::cuda_driver* d, const rdmx::gpu::device_buffer& buf, std::size_t offset,
                   std::size_t len)
{
    detail::cu_device dev;
    int supported = 0;
    ASSERT_EQ(d->device_get(&dev, buf.device()), detail::cu_success);
    d->device_get_attribute(&supported, detail::cu_device_attribute_dma_buf_supported, dev);
    std::string why;
    auto ex = detail::export_dmabuf(static_cast<char*>(buf.data()) + offset, len, buf.device(), why);
    if (!supported) {
        EXPECT_EQ(ex.fd, -1);
        GTEST_SKIP() << "this GPU or kernel exports no dma-buf: " << why;
    }
    ASSERT_GE(ex.fd, 0) << why;
    auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(ex.offset, offset % page);
    ::close(ex.fd);
}

TEST_F(gpu, device_memory_exports_a_dma_buf)
{
    rdmx::gpu::device_buffer buf(4 << 20);
    expect_export(driver_, buf, 0, buf.size());
    expect_export(driver_, buf, 100, 5000); // not page aligned: the pages around it
}

TEST_F(gpu, virtual_memory_across_allocations_exports_one_dma_buf)
{
    rdmx::gpu::device_buffer buf(8 << 20, 0, rdmx::gpu::allocation::virtual_memory, 2);
    expect_export(driver_, buf, 0, buf.size());
}

} // namespace
} // namespace rdmx
