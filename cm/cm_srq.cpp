// The glue between a verbs shared receive queue and rdma_cm's side of the domain: the
// queue's asynchronous events (IBV_EVENT_SRQ_LIMIT_REACHED) come in on the device's async
// fd, which the domain's event loop reads (event_loop.cpp routes them here).
#include "cm/cm_domain.hpp"

#include <rdmx/queues.hpp>

#include "verbs/shared_receive_queue.hpp"

namespace rdmx::cm
{
namespace
{

class cm_srq final : public verbs::shared_receive_queue
{
public:
    cm_srq(cm_domain& dom, const shared_receive_queue_options& opts)
        : verbs::shared_receive_queue(dom.pd(), dom.shared_from_this(), opts)
    {
        register_srq(native(), this);
    }
    // Unrouted first (waits for a router using it), then the base destroys the SRQ, which
    // waits until its events were acknowledged.
    ~cm_srq() override { unregister_srq(native()); }
};

} // namespace

std::shared_ptr<shared_receive_queue>
cm_domain::create_shared_receive_queue(const shared_receive_queue_options& opts)
{
    return std::make_shared<cm_srq>(*this, opts);
}

} // namespace rdmx::cm
