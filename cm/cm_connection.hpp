// A verbs RC connection as rdma_cm sets it up: the verbs half (QP, CQ, data path:
// verbs/verbs_connection.hpp) plus the cm_id, the connection-management state the event
// loop writes, and the QP transitions with the attributes rdma_cm negotiated. The flow
// itself (connect, accept) is written out in cm_flow.cpp.
#pragma once

#include <rdmx/connection.hpp>

#include <memory>
#include <optional>
#include <vector>

#include "cm/cm_handles.hpp"
#include "cm/connect_call.hpp"
#include "cm/event_loop.hpp"
#include "resolve.hpp"
#include "verbs/verbs_connection.hpp"

namespace rdmx::cm
{

class cm_domain;

class cm_connection final : public verbs::verbs_connection, private cm_state::driver
{
public:
    /// Takes its room on the shared completion queues of `opts` at once: throws
    /// errc::no_resources (naming `verb`) before anything is set up.
    cm_connection(cm_domain& dom, const connection_options& opts, std::string_view verb = "connect");
    ~cm_connection() override;

    /// Client side: start_connect, then waits until the flow ends; throws its failure
    /// (rdmx::error naming the address and the event or verb, with a reject's private data).
    void connect(const uri& address, std::span<const std::byte> private_data,
                 std::span<const recv_request> initial_recvs);
    /// Client side without waiting: creates the id and starts rdma_resolve_addr on the
    /// first address the name resolves to; the event loop runs the rest (step()): the next
    /// address while one fails to resolve, then route, QP, `initial_recvs`, rdma_connect,
    /// rdma_establish. `started`: the established event goes to opts.events (not for
    /// connect(), whose return says it).
    void start_connect(const uri& address, std::span<const std::byte> private_data,
                       std::span<const recv_request> initial_recvs, bool started = true);
    /// Server side: takes over `id` (from a CONNECT_REQUEST), QP, `initial_recvs`,
    /// rdma_accept; waits unless `wait` is false (start_accept: the event loop sees
    /// ESTABLISHED, or the deadline). `peer_private_data` is the user's part of the
    /// request's, `peer_goodbye` where the peer wants our goodbye (none: not an rdmx peer).
    void accept(cm_id_ptr id, const rdma_conn_param& request, std::span<const std::byte> private_data,
                std::vector<std::byte> peer_private_data, std::optional<goodbye_target> peer_goodbye,
                std::span<const recv_request> initial_recvs, bool wait = true);

    connection_state state() const noexcept override;
    std::error_code last_error() const noexcept override;
    /// Active side: what the peer's accept or reject carried (written by the event loop
    /// before the state leaves `connecting`); passive side: the request's.
    std::span<const std::byte> peer_private_data() const noexcept override
    {
        return active_ ? std::span<const std::byte>(cm_.private_data) : peer_private_;
    }
    void disconnect() noexcept override;
    native_handles native() const noexcept override;

private:
    /// The event loop's call after each event of a connection started with start_connect:
    /// the next step of the flow, or the failure (thrown by a step) as the error event.
    void step() noexcept override;
    /// Fails the flow (state `error` with `ec` and `what`, reported) unless it ended already.
    void fail_flow(std::error_code ec, const char* what) noexcept;
    /// Posts `wrs` (initial_recvs) on the new QP; throws if not all fit or one is invalid.
    void post_initial(std::span<const recv_request> wrs);
    /// Starting (connect / start_connect / start_accept): state `connecting` with the first
    /// deadline, post() refused until established; `report_established`: the event too.
    void begin_started(bool report_established) noexcept;
    void on_error_completion(std::error_code status) noexcept override;
    /// On iWARP, sets cm_.connect_unanswered to `pending` (before rdma_connect or
    /// rdma_accept, and back if the call failed); elsewhere nothing waits for an answer.
    void mark_unanswered(bool pending) noexcept;
    /// Tear-down on a shared receive queue: the QP to error, then wait (bounded by
    /// last_wqe_timeout, logged if it passes) for IBV_EVENT_QP_LAST_WQE_REACHED.
    void await_last_wqe() noexcept;
    static constexpr std::chrono::milliseconds last_wqe_timeout{1000};
    /// Starts rdma_resolve_addr of addrs_[addr_next_] on a fresh id (the previous one
    /// retired), attached to the loop: from the loop thread (`on_loop`, a step) or not.
    /// Throws the verb's failure.
    void resolve_address(bool on_loop);
    /// resolve_address for each address left until one starts; throws the last failure.
    void resolve_next_address(bool on_loop);
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
    /// The parameters of rdma_connect / rdma_accept; the private data is `user` with the
    /// trailer (cm/private_data.hpp), written into `wire` (connect_wire_size or
    /// accept_wire_size bytes), which must outlive the call that takes them.
    rdma_conn_param conn_param(std::span<const std::byte> user, std::span<std::byte> wire) const noexcept;
    /// Writes the goodbye to an rdmx peer while the connection is still established (once),
    /// and waits for it within goodbye_timeout: the peer then tells this disconnect from a
    /// crash. A peer that is gone already does not hold a destructor longer than that.
    void say_goodbye() noexcept;
    static constexpr std::chrono::milliseconds goodbye_timeout{200};

    cm_domain& domain_;
    connection_options opts_;
    std::vector<std::byte> peer_private_;
    bool active_ = false; ///< this side connected (peer_private_data() is cm_.private_data)
    /// start_connect's flow: what step() waits for next.
    enum class flow_step : std::uint8_t { none, addr, route, response };
    flow_step flow_ = flow_step::none;
    uri address_;                               ///< start_connect: for messages
    std::vector<detail::socket_address> addrs_; ///< what address_ resolved to
    std::size_t addr_next_ = 0;                 ///< the next of addrs_ to try
    /// Ids of addresses that failed to resolve: detached, destroyed with the connection.
    std::vector<cm_id_ptr> retired_ids_;
    std::vector<std::byte> connect_private_; ///< start_connect: sent with rdma_connect
    /// iWARP: the rdma_connect running on its own thread (cm/connect_call.hpp), if started.
    std::shared_ptr<connect_call> call_;
    std::vector<recv_request> initial_recvs_; ///< start_connect: posted once the QP exists
    std::vector<sge> initial_sges_;           ///< what initial_recvs_ point to
    /// [0]: this side's goodbye flag, which the peer writes; [1]: the nonzero value this
    /// side writes to the peer's. Registered (goodbye_mr_, remote write) for the
    /// connection's life; the MR goes before the memory (declared after it).
    std::unique_ptr<std::uint64_t[]> goodbye_words_;
    verbs::mr_ptr goodbye_mr_;
    bool goodbye_sent_ = false; ///< say_goodbye() ran (under cm_.mutex)
    mutable cm_state cm_;
    // Destruction order matters and is done by hand in the destructor: detach from the
    // event loop, destroy the QP, then the CQ, then its channel (destroy_queues), then
    // the cm_id (which waits for its events to be acknowledged).
    cm_id_ptr id_;
};

} // namespace rdmx::cm
