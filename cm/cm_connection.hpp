// A verbs RC connection as rdma_cm sets it up: the verbs half (QP, CQ, data path:
// verbs/verbs_connection.hpp) plus the cm_id, the connection-management state the event
// loop writes, and the QP transitions with the attributes rdma_cm negotiated. The flow
// itself (connect, accept) is written out in cm_flow.cpp.
#pragma once

#include <rdmx/connection.hpp>

#include <vector>

#include "cm/cm_handles.hpp"
#include "cm/event_loop.hpp"
#include "resolve.hpp"
#include "verbs/verbs_connection.hpp"

namespace rdmx::cm
{

class cm_domain;

class cm_connection final : public verbs::verbs_connection
{
public:
    /// Takes its room on the shared completion queues of `opts` at once: throws
    /// errc::no_resources (naming `verb`) before anything is set up.
    cm_connection(cm_domain& dom, const connection_options& opts, std::string_view verb = "connect");
    ~cm_connection() override;

    /// Client side: resolve, route, QP, rdma_connect; waits for ESTABLISHED.
    void connect(const uri& address, std::span<const std::byte> private_data);
    /// Server side: takes over `id` (from a CONNECT_REQUEST), QP, rdma_accept; waits.
    void accept(cm_id_ptr id, const rdma_conn_param& request, std::span<const std::byte> private_data,
                std::vector<std::byte> peer_private_data);

    connection_state state() const noexcept override;
    std::error_code last_error() const noexcept override;
    std::span<const std::byte> peer_private_data() const noexcept override { return peer_private_; }
    void disconnect() noexcept override;
    native_handles native() const noexcept override;

private:
    void on_error_completion(std::error_code status) noexcept override;
    /// Resolves the first of `addrs` that rdma_cm can reach from this domain's device:
    /// creates the id, attaches it, waits for ADDR_RESOLVED. Throws the last failure.
    void resolve_addr(const uri& address, std::vector<detail::socket_address>& addrs);
    /// Creates the QP (verbs_connection::create_qp), routes its asynchronous events to this
    /// connection, and moves it to INIT.
    void setup_qp();
    /// Moves the QP to RTR or RTS with the attributes rdma_cm negotiated
    /// (rdma_init_qp_attr), then overrides the ones that are ours to choose. rdma_cm alone
    /// would give each side the RNR retry count the *peer* offered (IB CM REQ/REP) and a
    /// min_rnr_timer of 0 (655 ms); doing the transitions here makes connection_options
    /// mean this side's own behaviour, as it does on TCP.
    /// `rd_atomic`, when not 0, overrides the negotiated read depth: max_dest_rd_atomic at
    /// RTR, max_rd_atomic at RTS (the passive side applies what its accept promised, as
    /// librdmacm's rdma_accept does).
    void modify_qp(ibv_qp_state to, std::uint8_t rd_atomic = 0);
    rdma_conn_param conn_param(std::span<const std::byte> private_data) const noexcept;

    cm_domain& domain_;
    connection_options opts_;
    std::vector<std::byte> peer_private_;
    mutable cm_state cm_;
    // Destruction order matters and is done by hand in the destructor: detach from the
    // event loop, destroy the QP, then the CQ, then its channel (destroy_queues), then
    // the cm_id (which waits for its events to be acknowledged).
    cm_id_ptr id_;
};

} // namespace rdmx::cm
