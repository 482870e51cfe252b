// GPU memory (docs/gpu.md): the CUDA driver loaded at run time, memory types found by
// register_memory, device buffers, dma-buf export. Tests that need a GPU skip, naming why,
// where none is visible; the suite "gpu-no-driver" runs the no_driver tests with
// RDMX_CUDA_DRIVER naming a file that does not exist, on every machine.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
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
static_assert(cuabi::cu_memhostalloc_portable == CU_MEMHOSTALLOC_PORTABLE);
static_assert(cuabi::cu_stream_non_blocking == CU_STREAM_NON_BLOCKING);
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

TEST_F(gpu, register_memory_finds_device_memory_and_tcp_takes_it_without_remote_atomics)
{
    rdmx::gpu::device_buffer buf(1 << 20);
    auto p = detail::place_memory(buf.data(), buf.size(), memory_type::detect, "register_memory");
    EXPECT_EQ(p.type, memory_type::cuda);
    EXPECT_EQ(p.device, 0);
    EXPECT_EQ(p.allocations, 1u);
    auto dom = domain::open("tcp://127.0.0.1:0");
    EXPECT_EQ(dom->register_memory(buf.data(), buf.size(), access::remote_write | access::remote_read)
                  ->memory_type(),
              memory_type::cuda);
    // The TCP target serves atomics with its CPU: on device memory they could not be atomic.
    errc code{};
    std::string w =
        what_of([&] { dom->register_memory(buf.data(), buf.size(), access::remote_atomic); }, &code);
    EXPECT_EQ(code, errc::not_supported);
    EXPECT_NE(w.find("remote_atomic on CUDA device memory (device 0)"), std::string::npos) << w;
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

/// Polls `c` until `n` completions came (10 s at most); each must have succeeded.
std::vector<completion> completions(connection& c, std::size_t n)
{
    std::vector<completion> out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
        completion buf[8];
        std::size_t got = c.poll(buf);
        out.insert(out.end(), buf, buf + got);
    }
    EXPECT_EQ(out.size(), n) << "completions missing after 10 s";
    for (const completion& x : out)
        EXPECT_FALSE(x.status) << "wr_id " << x.wr_id << ": " << x.status.message();
    return out;
}

// TCP moves device memory through host chunks (docs/gpu.md): every operation, device memory
// at both ends or at one, plain and virtual memory, pieces larger than a chunk.
TEST_F(gpu, tcp_carries_device_memory_in_every_operation)
{
    auto sdom = domain::open("tcp://127.0.0.1:0");
    auto cdom = domain::open("tcp://127.0.0.1:0");
    auto lst = sdom->listen("tcp://127.0.0.1:0");
    const std::string at = "tcp://127.0.0.1:" + std::to_string(lst->port());
    auto acc = std::async(std::launch::async,
                          [&] { return lst->get_request(std::chrono::seconds(10))->accept({}); });
    auto client = cdom->connect(at, {});
    auto server = acc.get();

    const std::size_t size = 3 << 20;
    std::vector<unsigned char> pattern(size), back(size);
    std::iota(pattern.begin(), pattern.end(), 7);
    for (auto kind : {rdmx::gpu::allocation::plain, rdmx::gpu::allocation::virtual_memory}) {
        SCOPED_TRACE(kind == rdmx::gpu::allocation::plain ? "plain" : "virtual memory");
        rdmx::gpu::device_buffer src(size, 0, kind, 2), dst(size, 0, kind, 2);
        std::vector<unsigned char> host(size);
        src.copy_from_host(pattern.data(), size);
        const access rw = access::local_write | access::remote_write | access::remote_read;
        auto ms = cdom->register_memory(src.data(), size, rw);
        auto md = sdom->register_memory(dst.data(), size, rw);
        auto mh = sdom->register_memory(host.data(), size, rw);
        ASSERT_EQ(ms->memory_type(), memory_type::cuda);

        // Write, device to device, from two SGEs, 2 MiB + 3 bytes to an odd offset.
        const sge w[] = {{ms.get(), 1, (1 << 20) + 1}, {ms.get(), 2 << 20, (1 << 20) + 2}};
        ASSERT_FALSE(client->post_write(w, md->remote(5, w[0].length + w[1].length), 1));
        completions(*client, 1);
        dst.copy_to_host(back.data(), size);
        EXPECT_EQ(std::memcmp(back.data() + 5, pattern.data() + 1, w[0].length), 0);
        EXPECT_EQ(std::memcmp(back.data() + 5 + w[0].length, pattern.data() + (2 << 20), w[1].length), 0);

        // Read, device at the target into host memory at the initiator... and host at the
        // target into device memory here.
        std::vector<unsigned char> local(size);
        auto ml = cdom->register_memory(local.data(), size, rw);
        const sge r{ml.get(), 0, size};
        ASSERT_FALSE(client->post_read({&r, 1}, md->remote(), 2));
        completions(*client, 1);
        EXPECT_EQ(std::memcmp(local.data(), back.data(), size), 0);
        std::memcpy(host.data(), pattern.data(), size);
        const sge r2{ms.get(), 0, size};
        src.copy_from_host(std::vector<unsigned char>(size).data(), size); // zeros first
        ASSERT_FALSE(client->post_read({&r2, 1}, mh->remote(), 3));
        completions(*client, 1);
        src.copy_to_host(back.data(), size);
        EXPECT_EQ(back, pattern);

        // Send from device memory into a device receive of two SGEs, then inline from device.
        const sge rv[] = {{md.get(), 0, 1000}, {md.get(), 1 << 20, 2 << 20}};
        ASSERT_FALSE(server->post_recv(rv, 10));
        const sge sd{ms.get(), 9, (1 << 20) + 77};
        ASSERT_FALSE(client->post_send({&sd, 1}, 4));
        completions(*client, 1);
        EXPECT_EQ(completions(*server, 1)[0].byte_len, sd.length);
        dst.copy_to_host(back.data(), size);
        EXPECT_EQ(std::memcmp(back.data(), pattern.data() + 9, 1000), 0);
        EXPECT_EQ(std::memcmp(back.data() + (1 << 20), pattern.data() + 1009, sd.length - 1000), 0);
        ASSERT_FALSE(server->post_recv({&rv[0], 1}, 11));
        const sge in{ms.get(), 100, 32};
        ASSERT_FALSE(client->post_send({&in, 1}, 5, send_flags::signaled | send_flags::inline_data));
        completions(*client, 1);
        completions(*server, 1);
        dst.copy_to_host(back.data(), 32);
        EXPECT_EQ(std::memcmp(back.data(), pattern.data() + 100, 32), 0);
    }
}

// Endpoints over TCP with device memory at both ends: an eager message (copied out of the
// endpoint's host buffer by the driver) and a rendezvous one (read by the receiver straight
// into device memory, staged by the connection).
TEST_F(gpu, tcp_endpoints_carry_device_memory_eager_and_by_rendezvous)
{
    auto dom = domain::open("tcp://127.0.0.1:0");
    auto a = endpoint::open(*dom, "tcp://127.0.0.1:0");
    auto b = endpoint::open(*dom, "tcp://127.0.0.1:0");
    const std::size_t size = 2 << 20;
    std::vector<unsigned char> pattern(size), back(size);
    std::iota(pattern.begin(), pattern.end(), 3);
    rdmx::gpu::device_buffer src(size), dst(size);
    src.copy_from_host(pattern.data(), size);
    auto ms = dom->register_memory(src.data(), size, access::local_write | access::remote_read);
    auto md = dom->register_memory(dst.data(), size, access::local_write | access::remote_write);
    const rdmx::peer to_b = a->insert(b->address());
    for (std::size_t len : {std::size_t{4000}, size - 1}) { // under and over eager_limit
        SCOPED_TRACE(len);
        const sge rs{md.get(), 0, size}, ss{ms.get(), 1, len};
        ASSERT_FALSE(b->recv(rdmx::any_peer, 7, 0, {&rs, 1}, 1));
        ASSERT_FALSE(a->send(to_b, 7, {&ss, 1}, 2));
        bool sent = false, received = false;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!(sent && received) && std::chrono::steady_clock::now() < deadline) {
            endpoint_completion c[4];
            for (endpoint* e : {a.get(), b.get()})
                for (std::size_t i = 0, n = e->poll(c); i < n; ++i) {
                    if (c[i].op != endpoint_op::send && c[i].op != endpoint_op::recv)
                        continue;
                    EXPECT_FALSE(c[i].status) << c[i].status.message();
                    (c[i].op == endpoint_op::send ? sent : received) = true;
                    if (c[i].op == endpoint_op::recv) {
                        EXPECT_EQ(c[i].length, len);
                    }
                }
        }
        ASSERT_TRUE(sent && received) << "no completion within 10 s";
        dst.copy_to_host(back.data(), len);
        EXPECT_EQ(std::memcmp(back.data(), pattern.data() + 1, len), 0);
    }
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
