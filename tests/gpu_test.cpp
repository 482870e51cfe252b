// GPU memory: runs only in builds with CUDA, and skips (reported as skipped) without a GPU.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include <rdmx/gpu.hpp>
#include <rdmx/rdmx.hpp>

namespace rdmx
{
namespace
{

TEST(gpu, device_buffer_round_trip)
{
    if (gpu::device_count() == 0)
        GTEST_SKIP() << "no CUDA device visible";
    std::vector<unsigned char> in(1 << 20), out(1 << 20);
    std::iota(in.begin(), in.end(), 0);
    gpu::device_buffer buf(in.size());
    buf.copy_from_host(in.data(), in.size());
    buf.copy_to_host(out.data(), out.size());
    EXPECT_EQ(in, out);
    EXPECT_THROW(buf.copy_to_host(out.data(), 2, in.size() - 1), error);
}

TEST(gpu, tcp_backend_refuses_device_memory)
{
    if (gpu::device_count() == 0)
        GTEST_SKIP() << "no CUDA device visible";
    auto dom = domain::open("tcp://127.0.0.1:0");
    gpu::device_buffer buf(4096);
    try {
        gpu::register_device_memory(*dom, buf, access::remote_write);
        ADD_FAILURE() << "TCP registered device memory";
    } catch (const error& e) {
        EXPECT_EQ(e.code(), errc::invalid_argument);
    }
}

} // namespace
} // namespace rdmx
