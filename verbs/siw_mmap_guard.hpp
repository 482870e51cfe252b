// siw hands each CQ, SQ, RQ and SRQ to user space as a range of pages of the device
// context's file, at an offset the kernel gives out, lowest free first
// (rdma_user_mmap_entry_insert). rdma-core's siw provider (providers/siw/siw.c) takes the
// offset SIW_INVAL_UOBJ_KEY (0x90000: page 144) for the kernel's "no mapping" and fails the
// creation without an errno, yet the kernel hands out that offset like any other: whenever
// a queue's range would begin at page 144. So once a context holds about 144 pages of
// queues, every CQ, QP or SRQ whose range would begin there fails, and the process makes no
// more until a queue below goes. Found as `ibv_create_qp` failing (with a stale errno,
// EAGAIN) in the 19th of 64 endpoints of one process (rdmx_ep_perf -t conn_rate -n 64 on
// siw; docs/failure-semantics.md).
//
// The guard: one CQ per device context whose range spans page 144, made while the context
// holds few queues (by the first protection_domain on it) and kept while one uses it.
#pragma once

#include <infiniband/verbs.h>

#include <memory>

namespace rdmx::verbs
{

/// The guard of siw context `ctx`, shared by every holder (made by the first): keep it
/// while queues of `ctx` are made. Null if it could not be made (logged; queues may then
/// fail as described above).
std::shared_ptr<const void> guard_siw_mmap_offsets(ibv_context* ctx);

} // namespace rdmx::verbs
