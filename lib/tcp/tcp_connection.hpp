// The connection object an application holds on the TCP backend: a facade over the
// connection_engine (tcp_engine.hpp), which outlives it until the peer has what it is owed.
#pragma once

#include <memory>
#include <vector>

#include "tcp/tcp_engine.hpp"

namespace rdmx::tcp
{

class tcp_connection final : public connection
{
public:
    /// `srq`: connection_options::srq, held here for the engine.
    tcp_connection(std::shared_ptr<tcp_domain> dom, std::shared_ptr<connection_engine> engine,
                   std::vector<std::byte> peer_private_data, std::shared_ptr<shared_receive_queue> srq);
    ~tcp_connection() override;

    connection_engine& engine() noexcept { return *engine_; }

    /// shm for a connection over a UNIX socket, also one that auto:// chose on a TCP domain.
    rdmx::backend backend() const noexcept override
    {
        return engine_->local() ? backend::shm : dom_->backend();
    }
    connection_state state() const noexcept override { return engine_->state(); }
    std::error_code last_error() const noexcept override { return engine_->last_error(); }
    const connection_limits& limits() const noexcept override { return engine_->limits(); }
    std::span<const std::byte> peer_private_data() const noexcept override
    {
        return engine_->peer_private_data();
    }

    using connection::post_recv;
    std::error_code post(std::span<const work_request> wrs, std::size_t* posted) noexcept override
    {
        return engine_->post(wrs, posted);
    }
    std::error_code post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept override
    {
        return engine_->post_recv(wrs, posted);
    }
    std::size_t poll(std::span<completion> out) noexcept override { return engine_->poll(out); }
    int completion_fd() const noexcept override { return engine_->event_fd(); }
    std::error_code request_notify(bool solicited_only) noexcept override
    {
        return engine_->request_notify(solicited_only);
    }
    std::error_code ack_notify() noexcept override { return engine_->ack_notify(); }
    void disconnect() noexcept override { engine_->disconnect(); }

private:
    /// Keeps the engine thread that engine_ runs on (and the regions it reaches) alive;
    /// declared first, so it goes after engine_ was handed to that thread to linger.
    std::shared_ptr<tcp_domain> dom_;
    std::shared_ptr<connection_engine> engine_;
    /// The engine takes receives from it until close() (in the destructor).
    std::shared_ptr<shared_receive_queue> srq_;
};

/// Builds the rings (all allocation happens here), ties the connection to opts.events and
/// posts `initial_recvs` (throws what post_recv returns), all before the engine reads.
/// `shared`: the room taken on the shared completion queues of `opts`.
std::unique_ptr<tcp_connection> prepare_connection(tcp_domain& dom, unique_fd fd,
                                                   const connection_limits& lim,
                                                   const connection_options& opts, std::uint32_t peer_max_rd,
                                                   std::vector<std::byte> peer_private_data,
                                                   detail::cq_reservation shared,
                                                   std::span<const recv_request> initial_recvs, bool started);
/// prepare_connection, then starts the engine on `fd`.
std::unique_ptr<connection> make_connection(tcp_domain& dom, unique_fd fd, const connection_limits& lim,
                                            const connection_options& opts, std::uint32_t peer_max_rd,
                                            std::vector<std::byte> peer_private_data,
                                            detail::cq_reservation shared,
                                            std::span<const recv_request> initial_recvs = {});

} // namespace rdmx::tcp
