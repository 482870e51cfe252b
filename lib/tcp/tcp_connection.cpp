// The connection object the application holds: a thin facade over the engine, which it
// closes on destruction (the engine lingers on until the peer has what it is owed).
#include "tcp/tcp_connection.hpp"

namespace rdmx::tcp
{

tcp_connection::tcp_connection(std::shared_ptr<tcp_domain> dom, std::shared_ptr<connection_engine> engine,
                               std::vector<std::byte> peer_private_data,
                               std::shared_ptr<shared_receive_queue> srq)
    : dom_(std::move(dom)), engine_(std::move(engine)), srq_(std::move(srq))
{
    engine_->set_owner(this);
    engine_->set_peer_private_data(std::move(peer_private_data));
}

tcp_connection::~tcp_connection()
{
    engine_->detach_queues();
    engine_->close();
    dom_->release_windows_of(engine_->id());
}

std::unique_ptr<tcp_connection> prepare_connection(tcp_domain& dom, unique_fd fd,
                                                   const connection_limits& lim,
                                                   const connection_options& opts, std::uint32_t peer_max_rd,
                                                   std::vector<std::byte> peer_private_data,
                                                   detail::cq_reservation shared,
                                                   std::span<const recv_request> initial_recvs, bool started)
{
    auto st =
        std::make_shared<connection_engine>(dom, std::move(fd), lim, opts, peer_max_rd, std::move(shared));
    auto conn =
        std::make_unique<tcp_connection>(dom.shared_from_this(), st, std::move(peer_private_data), opts.srq);
    st->attach_queues(); // if it throws, the connection's destructor detaches
    st->bind_events(opts.events, conn.get(), opts.context, started);
    if (!initial_recvs.empty()) {
        std::size_t posted = 0;
        if (auto ec = conn->post_recv(initial_recvs, &posted); ec || posted != initial_recvs.size())
            throw error(ec ? ec : make_error_code(errc::would_block),
                        "initial_recvs: more receives than recv_queue_depth, or an invalid one");
    }
    return conn;
}

std::unique_ptr<connection> make_connection(tcp_domain& dom, unique_fd fd, const connection_limits& lim,
                                            const connection_options& opts, std::uint32_t peer_max_rd,
                                            std::vector<std::byte> peer_private_data,
                                            detail::cq_reservation shared,
                                            std::span<const recv_request> initial_recvs)
{
    auto conn = prepare_connection(dom, std::move(fd), lim, opts, peer_max_rd, std::move(peer_private_data),
                                   std::move(shared), initial_recvs, false);
    conn->engine().start();
    return conn;
}

} // namespace rdmx::tcp
