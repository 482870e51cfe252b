// The connection object the application holds: a thin facade over the engine, which it
// closes on destruction (the engine lingers on until the peer has what it is owed).
#include "tcp/tcp_connection.hpp"

namespace rdmx::tcp
{

tcp_connection::tcp_connection(std::shared_ptr<tcp_domain> dom, std::shared_ptr<connection_engine> engine,
                               std::vector<std::byte> peer_private_data)
    : dom_(std::move(dom)), engine_(std::move(engine)), peer_pdata_(std::move(peer_private_data))
{
    engine_->set_owner(this);
}

tcp_connection::~tcp_connection()
{
    engine_->close();
}

std::unique_ptr<connection> make_connection(tcp_domain& dom, unique_fd fd, const connection_limits& lim,
                                            const connection_options& opts, std::uint32_t peer_max_rd,
                                            std::vector<std::byte> peer_private_data,
                                            detail::cq_reservation shared)
{
    auto st =
        std::make_shared<connection_engine>(dom, std::move(fd), lim, opts, peer_max_rd, std::move(shared));
    auto conn = std::make_unique<tcp_connection>(dom.shared_from_this(), st, std::move(peer_private_data));
    st->start();
    return conn;
}

} // namespace rdmx::tcp
