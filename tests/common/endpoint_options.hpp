// The endpoint options of the endpoint tests, shared with tests/endpoint_peer (a program of
// its own, without GoogleTest): small pools, so that back-pressure and the shared queues'
// limits are reached with few messages, and bounds short enough for a test.
#pragma once

#include <chrono>

#include <rdmx/endpoint.hpp>

namespace rdmx::test
{

inline endpoint_options small_endpoint_options()
{
    endpoint_options o;
    o.receive_buffers = 64;
    o.unexpected_limit = 48;
    o.completion_queue_depth = 2048;
    o.connection.send_queue_depth = 32;
    o.connection.timeout = std::chrono::milliseconds(3000);
    o.connect_deadline = std::chrono::milliseconds(8000);
    return o;
}

} // namespace rdmx::test
