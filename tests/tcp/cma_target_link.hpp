// The test's side of tests/tcp/cma_target.cpp (cma_test.cpp, shared_map_test.cpp): the
// target started in a process of its own, and a connection to it that carries the region
// it offers.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

#include "common/child_process.hpp"

namespace rdmx::test
{

/// Declared in this order so that the connection goes before the child is killed.
struct cma_target_link {
    std::unique_ptr<child_process> child;
    std::unique_ptr<domain> dom;
    std::unique_ptr<connection> conn;
    remote_buffer region{}; ///< the target's region, from its private data
};

/// Starts cma_target at `addr` (shm://) in `mode`, waits until it listens and connects;
/// fatal failures (wrap in ASSERT_NO_FATAL_FAILURE) where any step fails.
inline void open_cma_target(const std::string& addr, const std::string& mode, cma_target_link& t)
{
    using namespace std::chrono_literals;
    const std::string program = sibling_program("cma_target");
    ASSERT_EQ(::access(program.c_str(), X_OK), 0) << program << ": " << std::strerror(errno);
    t.child = std::make_unique<child_process>(program, std::vector<std::string>{addr, mode});
    char ready = 0;
    ASSERT_TRUE(t.child->read_exact(&ready, 1, 10s)) << "cma_target did not start listening";
    t.dom = domain::open(addr);
    t.conn = t.dom->connect(addr);
    auto rb = remote_buffer::parse(t.conn->peer_private_data());
    ASSERT_TRUE(rb) << "cma_target's private data is not a remote_buffer";
    t.region = *rb;
}

} // namespace rdmx::test
