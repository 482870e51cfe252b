// Internal: what one connection tells its event queue (connection_options::events), the
// same on both backends. The backend calls report() after every change of the
// connection's state, under the lock that guards that state; this turns the changes into
// at most one `established` event (only for a connection started with start_connect /
// start_accept) and exactly one terminal event (`disconnected` or `error`, whichever comes
// first: a later, more precise cause changes state() and last_error() but sends no second
// event). close() ends the reporting when the connection object goes away and removes
// what it left unpolled, so that no event names a destroyed connection.
#pragma once

#include <memory>
#include <system_error>

#include <rdmx/queues.hpp>

#include "event_queue.hpp"

namespace rdmx::detail
{

class connection_events
{
public:
    /// `started`: the connection was started without waiting (start_connect /
    /// start_accept): its `established` is news to the application.
    void bind(std::shared_ptr<event_queue> q, connection* conn, std::uint64_t context, bool started) noexcept
    {
        queue_ = std::move(q);
        conn_ = conn;
        context_ = context;
        started_ = started;
    }

    /// The connection is now in `s`; `cause` is last_error(), `by_peer` whether a
    /// disconnect came from the peer.
    void report(connection_state s, std::error_code cause, bool by_peer) noexcept
    {
        if (!queue_ || terminal_)
            return;
        event ev;
        ev.context = context_;
        ev.conn = conn_;
        switch (s) {
        case connection_state::connecting: return;
        case connection_state::established:
            if (!started_ || established_)
                return;
            established_ = true;
            ev.type = event_type::established;
            break;
        case connection_state::disconnected:
            terminal_ = true;
            ev.type = event_type::disconnected;
            ev.cause = make_error_code(errc::disconnected);
            ev.by_peer = by_peer;
            break;
        case connection_state::error:
            terminal_ = true;
            ev.type = event_type::error;
            ev.cause = cause ? cause : make_error_code(errc::completion_error);
            break;
        }
        impl(*queue_).push(ev);
    }

    /// The connection object is going away: nothing more is reported, and its unpolled
    /// events are removed. Call under the same lock as report(), after which no report()
    /// may come with a pointer to the old object.
    void close() noexcept
    {
        if (!queue_)
            return;
        impl(*queue_).purge(conn_, nullptr);
        queue_.reset();
    }

    bool bound() const noexcept { return queue_ != nullptr; }

private:
    std::shared_ptr<event_queue> queue_;
    connection* conn_ = nullptr;
    std::uint64_t context_ = 0;
    bool started_ = false;
    bool established_ = false;
    bool terminal_ = false;
};

} // namespace rdmx::detail
