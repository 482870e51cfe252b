// The end of a connection, as its connection manager learns it, told to the data path.
// siw needs it (verbs_connection::strands_): a request posted to its user-mapped send queue
// after the QP went to the error state is never completed, so the data path completes
// such requests itself once the connection has ended and the QP's own flush is polled.
#pragma once

#include <atomic>

namespace rdmx::verbs
{

struct qp_end {
    /// The connection ended (state error or disconnected); never cleared.
    std::atomic<bool> ended{false};
    /// The shared completion queue the send side reports to (null: its own CQ): told that
    /// one of its connections may have requests to complete (completion_queue::poll()).
    std::atomic<bool>* send_cq_watch = nullptr;

    void raise() noexcept
    {
        ended.store(true, std::memory_order_release);
        if (send_cq_watch)
            send_cq_watch->store(true, std::memory_order_release);
    }
};

} // namespace rdmx::verbs
