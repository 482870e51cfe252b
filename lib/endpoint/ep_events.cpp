// Peer events (endpoint_options::peer_events): a peer's connection that ended, a peer that
// restarted, noted where the connection flow sees them (ep_connect.cpp) and handed out by
// poll() as completions while the ring has room. No allocation: the list of peers with an
// event pending is reserved with the address vector.
#include "endpoint/ep_endpoint.hpp"

namespace rdmx::ep
{

void endpoint_impl::note_peer_event(std::uint32_t pi, endpoint_op what, std::error_code cause) noexcept
{
    if (!opts_.peer_events)
        return;
    peer_entry& p = *peers_[pi];
    if (what == endpoint_op::peer_restarted)
        p.restarted = true;
    else if (!p.down_cause) // the first cause, of the connection that was up
        p.down_cause = cause ? cause : make_error_code(errc::disconnected);
    list_once(event_peers_, p.in_peer_events, pi);
}

void endpoint_impl::emit_peer_events() noexcept
{
    // The ring holds an entry for every slot in use plus as many more (the constructor):
    // events take only what the slots in flight cannot need.
    auto room = [&] { return ring_count_ + ops_in_use_ + recvs_in_use_ + 1 < ring_.size(); };
    std::size_t k = 0;
    for (; k < event_peers_.size() && room(); ++k) {
        peer_entry& p = *peers_[event_peers_[k]];
        endpoint_completion c;
        c.peer = handle_of(event_peers_[k]);
        if (p.down_cause) {
            c.op = endpoint_op::peer_down;
            c.status = p.down_cause;
            push(c);
            p.down_cause.clear();
        }
        if (p.restarted && room()) {
            c.op = endpoint_op::peer_restarted;
            c.status.clear();
            push(c);
            p.restarted = false;
        }
        if (p.restarted) // no room left for it: the next poll()
            break;
        p.in_peer_events = false;
    }
    event_peers_.erase(event_peers_.begin(), event_peers_.begin() + static_cast<std::ptrdiff_t>(k));
}

} // namespace rdmx::ep
