// RAII for rdma_cm objects, as verbs/handles.hpp does for the verbs ones: one stateless
// deleter per handle type in a pointer-sized unique_ptr.
#pragma once

#include <rdma/rdma_cma.h>

#include <memory>

namespace rdmx::cm
{

struct event_channel_deleter {
    void operator()(rdma_event_channel* p) const noexcept { rdma_destroy_event_channel(p); }
};
struct cm_id_deleter {
    void operator()(rdma_cm_id* p) const noexcept { rdma_destroy_id(p); }
};

using event_channel_ptr = std::unique_ptr<rdma_event_channel, event_channel_deleter>;
using cm_id_ptr = std::unique_ptr<rdma_cm_id, cm_id_deleter>;

} // namespace rdmx::cm
