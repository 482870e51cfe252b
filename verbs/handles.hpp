// RAII for verbs objects: one stateless deleter per handle type, each wrapped in a
// pointer-sized unique_ptr (the spead2 pattern). Destroy errors cannot be reported from a
// destructor; they are ignored on purpose. rdma_cm's handles are cm/'s (cm/cm_handles.hpp).
#pragma once

#include <infiniband/verbs.h>

#include <memory>

namespace rdmx::verbs
{

struct pd_deleter {
    void operator()(ibv_pd* p) const noexcept { ibv_dealloc_pd(p); }
};
struct cq_deleter {
    void operator()(ibv_cq* p) const noexcept { ibv_destroy_cq(p); }
};
struct comp_channel_deleter {
    void operator()(ibv_comp_channel* p) const noexcept { ibv_destroy_comp_channel(p); }
};
struct mr_deleter {
    void operator()(ibv_mr* p) const noexcept { ibv_dereg_mr(p); }
};
struct mw_deleter {
    void operator()(ibv_mw* p) const noexcept { ibv_dealloc_mw(p); }
};
struct qp_deleter {
    void operator()(ibv_qp* p) const noexcept { ibv_destroy_qp(p); }
};
struct srq_deleter {
    void operator()(ibv_srq* p) const noexcept { ibv_destroy_srq(p); }
};

using pd_ptr = std::unique_ptr<ibv_pd, pd_deleter>;
using cq_ptr = std::unique_ptr<ibv_cq, cq_deleter>;
using comp_channel_ptr = std::unique_ptr<ibv_comp_channel, comp_channel_deleter>;
using mr_ptr = std::unique_ptr<ibv_mr, mr_deleter>;
using mw_ptr = std::unique_ptr<ibv_mw, mw_deleter>;
using qp_ptr = std::unique_ptr<ibv_qp, qp_deleter>;
using srq_ptr = std::unique_ptr<ibv_srq, srq_deleter>;

} // namespace rdmx::verbs
