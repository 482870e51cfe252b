// A domain's thread for tear-downs that would block the thread that asks for them. On
// iWARP the kernel holds a QP, and the cm_id it was connected through, from rdma_connect
// (or rdma_accept) until the provider answers: ibv_destroy_qp and rdma_destroy_id wait for
// that (siw: its MPA timer, 10 s, when the peer accepted the stream but never the
// connection). A connection destroyed in that window hands its QP, CQ and cm_id here
// instead, and its destructor returns at once (to its rdma_connect's thread while that
// call has not even returned, which hands them here when it does: cm/connect_call.hpp).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cm/cm_handles.hpp"
#include "verbs/verbs_connection.hpp"

namespace rdmx::cm
{

/// What is left of a connection for the reaper to destroy, in the order its members go:
/// the QP with its queues first, then the cm_id(s), then the domain they need alive.
struct connection_remains {
    std::shared_ptr<const void> keepalive; ///< the domain (its PD and event loop)
    std::vector<cm_id_ptr> retired_ids;
    cm_id_ptr id;
    std::optional<verbs::detached_queues> queues;
};

class reaper
{
public:
    reaper() : st_(std::make_shared<state>()) {}
    /// Waits for the thread, which has nothing left to do: every job holds the domain
    /// that owns this reaper, so the domain goes only after the last one did. When that
    /// last job is what destroys the domain (on the reaper's own thread), the thread is
    /// let go instead and ends by itself.
    ~reaper();
    reaper(const reaper&) = delete;
    reaper& operator=(const reaper&) = delete;

    /// Destroys `job` on the reaper's thread (started on first use). If that cannot be
    /// arranged (no memory, no thread), destroys it here, blocking, and says so in the log.
    void adopt(std::unique_ptr<connection_remains> job) noexcept;
    /// Waits until every job handed over so far is destroyed (not on the reaper's thread).
    void wait_idle() noexcept;

private:
    /// Shared with the thread, which may outlive this object (see the destructor).
    struct state {
        std::mutex mutex;
        std::condition_variable wake;
        std::condition_variable idle; ///< notified when a job is done
        std::deque<std::unique_ptr<connection_remains>> jobs;
        bool busy = false; ///< run() is destroying one
        bool stop = false;
    };
    static void run(std::shared_ptr<state> st) noexcept;

    const std::shared_ptr<state> st_;
    std::thread thread_; ///< started by the first adopt(), under st_->mutex
};

} // namespace rdmx::cm
