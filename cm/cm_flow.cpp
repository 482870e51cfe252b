// The rdma_cm connection flow, written out step by step:
//   client: rdma_create_id -> rdma_resolve_addr -> ADDR_RESOLVED -> rdma_resolve_route ->
//           ROUTE_RESOLVED -> QP to INIT -> rdma_connect -> CONNECT_RESPONSE (| REJECTED |
//           UNREACHABLE ...) -> QP to RTR, RTS -> rdma_establish
//   server: rdma_create_id -> rdma_bind_addr -> rdma_listen -> CONNECT_REQUEST ->
//           rdma_migrate_id -> QP to INIT, RTR, RTS -> rdma_accept -> ESTABLISHED
//           (or rdma_reject)
// iWARP differs (the kernel's iw_cm, RFC 5044 MPA): the provider moves the QP to RTS itself
// when the MPA exchange completes, on both sides, so we take the QP to INIT only; the
// active side gets ESTABLISHED directly (no CONNECT_RESPONSE, no rdma_establish), carrying
// the accept's private data. And siw makes the TCP connection inside rdma_connect,
// blocking: there the call runs on a thread of a pool (cm/connect_call.hpp), not on the
// domain's event loop.
// The QP is ours (ibv_create_qp), not rdma_cm's, so that its RNR and retry attributes are
// the ones this side asked for (see cm_connection::modify_qp).
// One flow for both calls: start_connect's steps run on the domain's event loop (step(),
// after each rdma_cm event), and a blocking connect() is start_connect plus a wait for the
// state to leave `connecting`. Every step is bounded by connection_options::timeout. A
// name that resolves to several addresses is tried address by address, as the TCP backend
// does.
#include <poll.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "cm/cm_connection.hpp"
#include "cm/connect_call.hpp"
#include "cm/cm_domain.hpp"
#include "cm/event_loop.hpp"
#include "log.hpp"
#include "resolve.hpp"
#include "validate.hpp"

namespace rdmx::cm
{
namespace
{

// The failure of `verb` on the way to `u` with `err` (an errno), as rdmx::error: the
// failures a caller handles by kind get rdmx's codes, as the CM events do.
error cm_error(const char* verb, const uri& u, int err)
{
    err = err < 0 ? -err : err;
    std::string what = std::string(verb) + " " + u.to_string() + ": " +
                       (err ? std::strerror(err) : "failed without an errno");
    if (err == 0)
        err = EIO;
    switch (err) {
    case ENETUNREACH:
    case EHOSTUNREACH:
    case EADDRNOTAVAIL:
    case ENODEV: return error(make_error_code(errc::unreachable), what);
    case ETIMEDOUT: return error(make_error_code(errc::timed_out), what);
    case ECONNREFUSED: return error(make_error_code(errc::connection_refused), what);
    default: return error(std::error_code(err, std::system_category()), what);
    }
}

[[noreturn]] void throw_cm(const char* verb, const uri& u)
{
    throw cm_error(verb, u, errno);
}

} // namespace

void cm_connection::connect(const uri& address, std::span<const std::byte> private_data,
                            std::span<const recv_request> initial_recvs)
{
    // One flow: start_connect's steps on the event loop, this thread waiting for their end.
    // The loop bounds each step by opts_.timeout, so the wait ends; the bound here only
    // guards against a loop that stopped (a step per address, then route and response).
    start_connect(address, private_data, initial_recvs, false);
    const std::string verb = "connect " + address.to_string();
    const auto bound = static_cast<int>(addrs_.size() + 2) * opts_.timeout + std::chrono::seconds(1);
    std::unique_lock lock(cm_.mutex);
    bool settled =
        cm_.changed.wait_for(lock, bound, [&] { return cm_.state != connection_state::connecting; });
    if (!settled)
        throw error(make_error_code(errc::timed_out), verb + ": the connection-management flow did not end");
    // Established, though perhaps ended since by a peer that left at once: the caller gets
    // the connection, and its state says so (sendable_ is set once, when established).
    if (sendable_.load(std::memory_order_acquire))
        return;
    if (cm_.state == connection_state::error)
        throw error(cm_.error, verb + ": " + cm_.what, cm_.private_data);
    throw error(make_error_code(errc::disconnected), verb + ": the peer left while connecting");
}

void cm_connection::accept(cm_id_ptr id, const rdma_conn_param& request,
                           std::span<const std::byte> private_data, std::vector<std::byte> peer_private_data,
                           std::optional<goodbye_target> peer_goodbye,
                           std::span<const recv_request> initial_recvs, bool wait)
{
    if (id->verbs != domain_.native_context())
        throw_error(errc::invalid_argument,
                    "rdma_accept: request arrived on another device than this domain's");
    id_ = std::move(id);
    id_->context = this;
    passive_ = true;
    peer_private_ = std::move(peer_private_data);
    {
        std::lock_guard lock(cm_.mutex);
        cm_.peer_goodbye = peer_goodbye;
    }
    // The request moved the id to the domain's channel already; from now on its events
    // are this connection's.
    if (!wait)
        begin_started(true);
    domain_.events().attach(id_.get(), &cm_);
    setup_qp();
    post_initial(initial_recvs); // before rdma_accept tells the client it may send
    std::array<std::byte, accept_wire_size> wire;
    rdma_conn_param param = conn_param(private_data, wire);
    // Never promise more reads than the initiator asked for, nor accept more than we allow.
    param.responder_resources = std::min(param.responder_resources, request.initiator_depth);
    param.initiator_depth = std::min(param.initiator_depth, request.responder_resources);
    // limits() says what this connection got: the reads it may have outstanding at the
    // peer are what the peer offered to serve, when that is fewer than ours.
    if (param.initiator_depth != 0)
        set_max_rd_atomic(param.initiator_depth);
    // (A depth of 0 keeps rdma_cm's value, which is then 0 as well.)
    // On iWARP these depths travel as IRD/ORD in the MPA exchange and the provider moves
    // the QP to RTS itself (it refuses RTS from us: the QP has no stream yet).
    if (!domain_.iwarp()) {
        modify_qp(IBV_QPS_RTR, param.responder_resources);
        modify_qp(IBV_QPS_RTS, param.initiator_depth);
    }
    mark_unanswered(true);
    if (rdma_accept(id_.get(), &param)) {
        const int err = errno;
        mark_unanswered(false);
        throw_errno(err, "rdma_accept");
    }
    if (!wait) {
        domain_.events().kick(); // the loop now bounds ESTABLISHED by the deadline
        return;
    }
    event_loop::wait_for(cm_, connection_state::established, "rdma_accept", opts_.timeout);
}

void cm_connection::post_initial(std::span<const recv_request> wrs)
{
    if (wrs.empty())
        return;
    std::size_t posted = 0;
    if (auto ec = post_recv(wrs, &posted); ec || posted != wrs.size())
        throw error(ec ? ec : make_error_code(errc::would_block),
                    "initial_recvs: more receives than recv_queue_depth, or an invalid one");
}

void cm_connection::begin_started(bool report_established) noexcept
{
    sendable_.store(false, std::memory_order_release);
    std::lock_guard lock(cm_.mutex);
    cm_.sendable = &sendable_;
    cm_.deadline = std::chrono::steady_clock::now() + opts_.timeout;
    cm_.events.bind(opts_.events, this, opts_.context, report_established);
}

void cm_connection::start_connect(const uri& address, std::span<const std::byte> private_data,
                                  std::span<const recv_request> initial_recvs, bool started)
{
    active_ = true;
    address_ = address;
    connect_private_.assign(private_data.begin(), private_data.end());
    // The caller's arrays are gone when the QP exists: copy the requests and their SGEs.
    std::size_t nsge = 0;
    for (const auto& wr : initial_recvs)
        nsge += wr.local.size();
    initial_sges_.reserve(nsge);
    for (const auto& wr : initial_recvs) {
        std::size_t first = initial_sges_.size();
        initial_sges_.insert(initial_sges_.end(), wr.local.begin(), wr.local.end());
        initial_recvs_.push_back(
            {.wr_id = wr.wr_id, .local = {initial_sges_.data() + first, wr.local.size()}});
    }
    // The name is resolved here (a numeric address at once); rdma_cm's steps on the loop.
    addrs_ = detail::resolve(address, false, "getaddrinfo");
    begin_started(started);
    flow_ = flow_step::addr;
    cm_.drive = this;
    resolve_next_address(false);
    domain_.events().kick();
}

void cm_connection::resolve_next_address(bool on_loop)
{
    for (;;) {
        try {
            resolve_address(on_loop);
            return;
        } catch (const error&) {
            if (addr_next_ == addrs_.size())
                throw;
        }
    }
}

void cm_connection::resolve_address(bool on_loop)
{
    if (id_) {
        // rdma_cm leaves an id whose resolution failed unusable for another address: a fresh
        // one, the old one kept (detached) until the destructor, for an event of it may be
        // in the loop's hands still (rdma_destroy_id would wait for its acknowledgement).
        if (on_loop)
            domain_.events().detach_from_loop(id_.get());
        else
            domain_.events().detach(id_.get());
        retired_ids_.push_back(std::move(id_));
    }
    const detail::socket_address& a = addrs_[addr_next_++];
    {
        std::lock_guard lock(cm_.mutex);
        cm_.resolved = resolve_step::none;
        cm_.addr_failed = false;
        cm_.spare_address = addr_next_ < addrs_.size();
        cm_.deadline = std::chrono::steady_clock::now() + opts_.timeout;
    }
    rdma_cm_id* raw = nullptr;
    if (rdma_create_id(domain_.events().channel(), &raw, this, RDMA_PS_TCP))
        throw_cm("rdma_create_id", address_);
    id_.reset(raw);
    if (on_loop)
        domain_.events().attach_from_loop(raw, &cm_);
    else
        domain_.events().attach(raw, &cm_);
    if (rdma_resolve_addr(raw, nullptr, const_cast<sockaddr*>(reinterpret_cast<const sockaddr*>(&a.addr)),
                          static_cast<int>(opts_.timeout.count())))
        throw_cm("rdma_resolve_addr", address_);
}

void cm_connection::step() noexcept
{
    // On the event loop thread, its lock held (detach() waits for us), cm_.mutex not held.
    resolve_step resolved;
    bool responded;
    bool addr_failed;
    {
        std::lock_guard lock(cm_.mutex);
        if (cm_.state != connection_state::connecting) {
            flow_ = flow_step::none;
            return;
        }
        resolved = cm_.resolved;
        responded = cm_.responded;
        addr_failed = cm_.addr_failed;
    }
    const auto next_deadline = std::chrono::steady_clock::now() + opts_.timeout;
    try {
        switch (flow_) {
        case flow_step::none: return;
        case flow_step::addr:
            // A name that resolves to several addresses is tried address by address: the
            // next one when this one failed (ADDR_ERROR, its deadline, another device).
            if (addr_failed || (resolved == resolve_step::addr_resolved &&
                                id_->verbs != domain_.native_context() && addr_next_ < addrs_.size())) {
                resolve_next_address(true);
                return;
            }
            if (resolved != resolve_step::addr_resolved)
                return;
            if (id_->verbs != domain_.native_context())
                throw error(make_error_code(errc::invalid_argument),
                            "rdma_resolve_addr " + address_.to_string() +
                                ": reached through another device than this domain's");
            flow_ = flow_step::route;
            {
                std::lock_guard lock(cm_.mutex);
                cm_.deadline = next_deadline;
            }
            if (rdma_resolve_route(id_.get(), static_cast<int>(opts_.timeout.count())))
                throw_cm("rdma_resolve_route", address_);
            return;
        case flow_step::route: {
            if (resolved != resolve_step::route_resolved)
                return;
            setup_qp();
            post_initial(initial_recvs_);
            flow_ = flow_step::response;
            {
                std::lock_guard lock(cm_.mutex);
                cm_.deadline = next_deadline;
            }
            std::array<std::byte, connect_wire_size> wire;
            rdma_conn_param param = conn_param(connect_private_, wire);
            mark_unanswered(true);
            if (domain_.iwarp()) {
                // siw connects the TCP stream inside the call, blocking (cm/connect_call.hpp).
                try {
                    call_ = connect_call::start(id_.get(), param, [this](int err) noexcept {
                        mark_unanswered(false); // iw_cm let go of the QP when it failed the call
                        try {
                            const error e = cm_error("rdma_connect", address_, err);
                            fail_flow(e.code(), e.what());
                        } catch (...) { // no memory for the message
                            fail_flow(std::error_code(err, std::system_category()), "rdma_connect failed");
                        }
                    });
                } catch (...) {
                    mark_unanswered(false);
                    throw;
                }
                return; // ESTABLISHED makes it established (handle())
            }
            if (rdma_connect(id_.get(), &param)) {
                const int err = errno;
                mark_unanswered(false); // iw_cm let go of the QP when it failed the call
                errno = err;
                throw_cm("rdma_connect", address_);
            }
            return;
        }
        case flow_step::response:
            if (!responded || domain_.iwarp())
                return;
            // INIT again first, as librdmacm does: before the connection existed rdma_cm
            // granted the QP no remote access; now it grants remote write (and read, if we
            // serve reads). Without an rdma_cm-owned QP no ESTABLISHED event comes on this
            // side: rdma_establish (the RTU) completes it.
            modify_qp(IBV_QPS_INIT);
            modify_qp(IBV_QPS_RTR);
            modify_qp(IBV_QPS_RTS);
            if (rdma_establish(id_.get()))
                throw_cm("rdma_establish", address_);
            flow_ = flow_step::none;
            sendable_.store(true, std::memory_order_release);
            std::lock_guard lock(cm_.mutex);
            if (cm_.state == connection_state::connecting) {
                cm_.state = connection_state::established;
                cm_.report();
                cm_.changed.notify_all();
            }
            return;
        }
    } catch (const std::exception& e) {
        flow_ = flow_step::none;
        std::error_code ec = make_error_code(errc::unreachable);
        if (auto* re = dynamic_cast<const std::system_error*>(&e))
            ec = re->code();
        fail_flow(ec, e.what());
    }
}

void cm_connection::fail_flow(std::error_code ec, const char* what) noexcept
{
    std::lock_guard lock(cm_.mutex);
    if (cm_.state != connection_state::connecting)
        return;
    RDMX_LOG(debug, "connect to %s:%u failed: %s", address_.host.c_str(), unsigned{address_.port}, what);
    cm_.state = connection_state::error;
    cm_.error = ec;
    try {
        cm_.what = what;
    } catch (...) { // no memory: the code says it
        cm_.what.clear();
    }
    verbs::flush_qp(cm_.qp);
    cm_.report();
    cm_.changed.notify_all();
}

namespace
{

class cm_request final : public connection_request
{
public:
    cm_request(cm_domain& dom, cm_id_ptr id, const rdma_conn_param& param)
        : owner_(dom.shared_from_this()), domain_(dom), param_(param)
    {
        // The user's bytes and the peer's goodbye target (cm/private_data.hpp).
        auto* p = static_cast<const std::byte*>(param.private_data);
        const auto d = decode_private_data({p, p ? param.private_data_len : 0u});
        private_.assign(d.user.begin(), d.user.end());
        peer_goodbye_ = d.peer;
        param_.private_data = nullptr;
        param_.private_data_len = 0;
        // Move the new id off the listener's channel at once, onto the domain's, whose
        // loop acknowledges its events: a request may outlive its listener (and its
        // channel), and an id's rdma_destroy_id waits for its events to be acknowledged.
        // Attach before migrating, so that no event of the id finds the loop unprepared.
        domain_.events().attach(id.get(), &cm_);
        if (rdma_migrate_id(id.get(), domain_.events().channel())) {
            int err = errno;
            domain_.events().detach(id.get());
            throw_errno(err, "rdma_migrate_id");
        }
        id_ = std::move(id);
    }
    ~cm_request() override
    {
        // Dropped without an answer: tell the peer now rather than let it time out.
        if (id_) {
            domain_.events().detach(id_.get());
            rdma_reject(id_.get(), nullptr, 0);
        }
    }

    std::span<const std::byte> private_data() const noexcept override { return private_; }

    std::unique_ptr<connection> accept(const connection_options& opts,
                                       std::span<const std::byte> private_data,
                                       std::span<const recv_request> initial_recvs) override
    {
        return do_accept(opts, private_data, initial_recvs, true);
    }

    std::unique_ptr<connection> start_accept(const connection_options& opts,
                                             std::span<const std::byte> private_data,
                                             std::span<const recv_request> initial_recvs) override
    {
        return do_accept(opts, private_data, initial_recvs, false);
    }

    void reject(std::span<const std::byte> private_data) override
    {
        if (!id_)
            throw_error(errc::invalid_argument, "rdma_reject: request already answered");
        detail::check_private_data(detail::private_data_use::reject, private_data, "rdma_reject");
        if (rdma_reject(id_.get(), private_data.empty() ? nullptr : private_data.data(),
                        static_cast<std::uint8_t>(private_data.size())))
            throw_errno(errno, "rdma_reject");
        domain_.events().detach(id_.get());
        id_.reset();
    }

private:
    std::unique_ptr<connection> do_accept(const connection_options& opts,
                                          std::span<const std::byte> private_data,
                                          std::span<const recv_request> initial_recvs, bool wait)
    {
        if (!id_)
            throw_error(errc::invalid_argument, "rdma_accept: request already answered");
        detail::check_private_data(detail::private_data_use::accept, private_data, "rdma_accept");
        auto c = std::make_unique<cm_connection>(domain_, opts, wait ? "accept" : "start_accept");
        domain_.events().detach(id_.get()); // the connection attaches its own state
        c->accept(std::move(id_), param_, private_data, std::move(private_), peer_goodbye_, initial_recvs,
                  wait);
        return c;
    }

    std::shared_ptr<cm_domain> owner_; ///< keeps domain_ alive; declared first, destroyed last
    cm_domain& domain_;
    cm_state cm_;  ///< receives the id's events until accept() hands it over
    cm_id_ptr id_; ///< destroyed before cm_ (declared after it)
    rdma_conn_param param_;
    std::vector<std::byte> private_;             ///< the user's part of the request's
    std::optional<goodbye_target> peer_goodbye_; ///< none: not an rdmx peer
};

class cm_listener final : public listener
{
public:
    cm_listener(cm_domain& dom, const uri& u, int backlog) : owner_(dom.shared_from_this()), domain_(dom)
    {
        channel_.reset(rdma_create_event_channel());
        if (!channel_)
            throw_cm("rdma_create_event_channel", u);
        set_nonblocking(channel_->fd, "fcntl(rdma_cm listen channel, O_NONBLOCK)");
        rdma_cm_id* raw = nullptr;
        if (rdma_create_id(channel_.get(), &raw, nullptr, RDMA_PS_TCP))
            throw_cm("rdma_create_id", u);
        id_.reset(raw);
        bind(u);
        if (rdma_listen(id_.get(), backlog))
            throw_cm("rdma_listen", u);
        port_ = ntohs(rdma_get_src_port(id_.get()));
    }

    std::unique_ptr<connection_request> get_request(std::chrono::milliseconds timeout) override
    {
        // The channel is non-blocking: take what is queued first, and sleep in poll() only
        // while nothing is. So a zero timeout takes a pending request and never blocks,
        // and an event that vanishes between poll() and the fetch (a child id destroyed
        // meanwhile discards its events) cannot block us either.
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            rdma_cm_event* ev = nullptr;
            if (rdma_get_cm_event(channel_.get(), &ev)) {
                if (errno == EINTR)
                    continue;
                if (errno != EAGAIN)
                    throw_errno(errno, "rdma_get_cm_event");
                auto left =
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
                if (left.count() <= 0)
                    return nullptr;
                pollfd pfd{channel_->fd, POLLIN, 0};
                int rc = ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30)));
                if (rc < 0 && errno != EINTR)
                    throw_errno(errno, "poll(rdma_cm listen channel)");
                continue;
            }
            switch (ev->event) {
            case RDMA_CM_EVENT_CONNECT_REQUEST: {
                // The request's private data lives in the event: copy it before the ack.
                cm_id_ptr child(ev->id);
                rdma_conn_param param = ev->param.conn;
                auto req = std::make_unique<cm_request>(domain_, std::move(child), param);
                rdma_ack_cm_event(ev);
                return req;
            }
            case RDMA_CM_EVENT_DEVICE_REMOVAL: {
                rdma_ack_cm_event(ev);
                throw_error(errc::no_device, "rdma_listen: RDMA_CM_EVENT_DEVICE_REMOVAL");
            }
            default:
                // Events of children that were rejected or never accepted (e.g. a late
                // DISCONNECTED) and ADDR_CHANGE of the listening id: nothing to do.
                rdma_ack_cm_event(ev);
                break;
            }
        }
    }

    /// The listen channel (non-blocking): readable while it holds an event, which
    /// get_request(0ms) takes (an event of a child id is acknowledged and dropped there).
    int fd() const noexcept override { return channel_->fd; }
    std::uint16_t port() const noexcept override { return port_; }
    rdmx::backend backend() const noexcept override { return backend::verbs; }

private:
    /// Binds the id to the first address of `u` that rdma_cm takes on this domain's
    /// device. An id stays unbound when rdma_bind_addr fails, so the same id tries the
    /// next; one bound to another device is replaced by a fresh one first.
    void bind(const uri& u)
    {
        std::vector<detail::socket_address> addrs = detail::resolve(u, true, "getaddrinfo");
        for (std::size_t i = 0; i < addrs.size(); ++i) {
            const bool last = i + 1 == addrs.size();
            if (rdma_bind_addr(id_.get(), reinterpret_cast<sockaddr*>(&addrs[i].addr))) {
                if (last)
                    throw_cm("rdma_bind_addr", u);
                continue;
            }
            if (!id_->verbs || id_->verbs == domain_.native_context())
                return;
            if (last)
                throw error(make_error_code(errc::invalid_argument),
                            "rdma_bind_addr " + u.to_string() +
                                ": address belongs to another device than this domain's");
            rdma_cm_id* raw = nullptr;
            if (rdma_create_id(channel_.get(), &raw, nullptr, RDMA_PS_TCP))
                throw_cm("rdma_create_id", u);
            id_.reset(raw);
        }
    }

    std::shared_ptr<cm_domain> owner_; ///< keeps domain_ alive; declared first, destroyed last
    cm_domain& domain_;
    event_channel_ptr channel_; ///< destroyed after id_ (declared first)
    cm_id_ptr id_;
    std::uint16_t port_ = 0;
};

} // namespace

std::unique_ptr<listener> cm_domain::listen(std::string_view address, const listen_options& opts)
{
    const int backlog = opts.backlog;
    uri u = uri::parse(address);
    detail::check_scheme(u, backend::verbs, "listen");
    return std::make_unique<cm_listener>(*this, u, backlog);
}

} // namespace rdmx::cm
