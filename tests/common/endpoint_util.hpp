// Helpers for the endpoint tests: open endpoints on a backend, regions with a pattern, and
// a pump that drives several endpoints until a condition holds.
#pragma once

#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "common/endpoint_options.hpp"
#include "common/test_data.hpp"
#include "common/test_util.hpp"

namespace rdmx::test
{

struct ep_handle {
    std::unique_ptr<domain> dom;
    std::unique_ptr<endpoint> ep;
    std::vector<endpoint_completion> done;
    /// Polls once, keeping what completed.
    std::size_t poll()
    {
        endpoint_completion out[64];
        std::size_t n = ep->poll(out);
        done.insert(done.end(), out, out + n);
        return n;
    }
};

class ep_fixture : public testing::TestWithParam<backend>
{
protected:
    void SetUp() override
    {
        b_ = GetParam();
        if (b_ == backend::verbs && host_for(b_).empty())
            GTEST_SKIP() << "verbs run needs RDMX_TEST_RDMA_ADDR (an IP on an RDMA device)";
        dom_ = domain::open(address(b_, 0));
    }

    endpoint_options small_options() const { return small_endpoint_options(); }

    /// An endpoint on `port` of the test's domain (regions from region() work with it).
    ep_handle open_ep(std::uint16_t port = 0, const endpoint_options* opts = nullptr)
    {
        ep_handle h;
        auto o = opts ? *opts : small_options();
        h.ep = endpoint::open(*dom_, address(b_, port), o);
        return h;
    }

    std::unique_ptr<memory_region> region(std::size_t len,
                                          access acc = access::local_write | access::remote_read)
    {
        mem_.push_back(std::make_unique<std::vector<std::byte>>(len));
        return dom_for_regions().register_memory(mem_.back()->data(), len, acc);
    }

    static void fill(memory_region& m, std::size_t off, std::size_t len, int seed)
    {
        fill_pattern({m.data() + off, len}, static_cast<std::uint64_t>(seed));
    }
    static bool check(const memory_region& m, std::size_t off, std::size_t len, int seed)
    {
        return wrong_bytes({m.data() + off, len}, static_cast<std::uint64_t>(seed)) == 0;
    }

    /// Polls every endpoint until done() or the timeout; true if done() became true.
    bool pump(std::initializer_list<ep_handle*> eps, const std::function<bool()>& done,
              std::chrono::milliseconds timeout = std::chrono::seconds(20))
    {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!done()) {
            if (std::chrono::steady_clock::now() >= deadline)
                return false;
            std::size_t n = 0;
            for (auto* e : eps)
                n += e->poll();
            if (n == 0)
                std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        return true;
    }

    /// Regions must come from the domain of the endpoint that uses them.
    domain& dom_for_regions() { return *dom_; }

    backend b_{};
    std::vector<std::unique_ptr<std::vector<std::byte>>> mem_; // before dom_: regions go first
    std::unique_ptr<domain> dom_;
};

} // namespace rdmx::test
