// The endpoint's set-up, address vector and connection management: incoming requests
// (identity, tie-break, restart), connection events and lazy dials; their timers are in
// ep_timers.cpp (docs/endpoints.md, "Connections").
#include "endpoint/ep_endpoint.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>

#include <rdmx/error.hpp>

#include "log.hpp"

namespace rdmx
{

const char* to_string(endpoint_op op) noexcept
{
    switch (op) {
    case endpoint_op::send: return "send";
    case endpoint_op::recv: return "recv";
    case endpoint_op::write: return "write";
    case endpoint_op::read: return "read";
    case endpoint_op::fetch_add: return "fetch_add";
    case endpoint_op::compare_swap: return "compare_swap";
    case endpoint_op::bind_window: return "bind_window";
    case endpoint_op::invalidate_window: return "invalidate_window";
    case endpoint_op::peer_down: return "peer_down";
    case endpoint_op::peer_restarted: return "peer_restarted";
    }
    return "?";
}

std::unique_ptr<endpoint> endpoint::open(domain& d, std::string_view address, const endpoint_options& opts)
{
    return std::make_unique<ep::endpoint_impl>(d, address, opts);
}

namespace ep
{
namespace
{

std::uint64_t draw_incarnation()
{
    std::random_device rd;
    std::uint64_t v = 0;
    while (v == 0)
        v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    return v;
}

void add_fd(int ep, int fd)
{
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
        throw_errno(errno, "epoll_ctl");
}

/// Whether our dial `c` can still end up a connection to `incarnation`: it is under way,
/// or that incarnation accepted it (its established event not seen yet).
bool dial_may_reach(const connection& c, std::uint64_t incarnation) noexcept
{
    if (c.state() == connection_state::connecting)
        return true;
    if (c.state() != connection_state::established)
        return false;
    auto inc = decode_accept(c.peer_private_data());
    return inc && *inc == incarnation;
}

} // namespace

endpoint_impl::endpoint_impl(domain& d, std::string_view address, const endpoint_options& opts)
    : dom_(d), opts_(opts), incarnation_(draw_incarnation())
{
    if (opts.eager_limit == 0 || opts.receive_buffers == 0 || opts.unexpected_limit == 0 ||
        opts.unexpected_limit > opts.receive_buffers || opts.max_posted_recvs == 0 ||
        opts.max_queued_ops == 0)
        throw_error(
            errc::invalid_argument,
            "endpoint::open: eager_limit, receive_buffers, max_posted_recvs and max_queued_ops must be "
            "positive, unexpected_limit in 1..receive_buffers");
    const auto& lim = d.limits();
    send_sge_ = std::min<std::uint32_t>(
        {opts.connection.max_send_sge, lim.max_sge, static_cast<std::uint32_t>(max_sges)});
    if (send_sge_ < 2)
        throw_error(errc::invalid_argument,
                    "endpoint::open: needs connection.max_send_sge >= 2 (header + data)");
    ctrl_size_ = static_cast<std::uint32_t>(header_size + remote_buffer::wire_size * max_rts_desc);
    buf_size_ = static_cast<std::uint32_t>(header_size) + std::max(opts.eager_limit, ctrl_size_);
    max_chunk_ = lim.max_msg_size ? std::min<std::uint64_t>(lim.max_msg_size, 1u << 30) : (1u << 30);
    delivery_acks_ = lim.iwarp;

    // The listener first: its port is part of the address that peers insert.
    // Opened with auto://: its peers are dialled by auto:// too, so that a peer's listener
    // on this host is reached over shm where auto:// chose TCP (docs/shm.md, "auto://").
    automatic_ = uri::parse(address).scheme == scheme::automatic;
    auto want = resolve_address(address, d.backend(), true, automatic_);
    listener_ = d.listen(address, 1024);
    want.key.port = listener_->port();
    want.text = to_text(want.key, d.backend(), automatic_);
    self_ = want;

    events_ = event_queue::create();
    cq_ = d.create_completion_queue({.depth = opts.completion_queue_depth});
    cqb_ = dynamic_cast<detail::completion_queue_base*>(cq_.get());
    shared_receive_queue_options qo;
    qo.depth = opts.receive_buffers;
    qo.max_sge = 1;
    srq_ = d.create_shared_receive_queue(qo);

    const std::uint32_t nops = opts.max_queued_ops + opts.completion_queue_depth;
    const std::uint32_t nrecvs = opts.max_posted_recvs;
    ops_.resize(nops);
    free_ops_ = free_list(nops);
    recvs_.resize(nrecvs);
    free_recvs_ = free_list(nrecvs);
    posted_recvs_ = index_list(nrecvs);
    pending_recvs_ = index_list(nrecvs);
    held_.resize(opts.receive_buffers);
    unexpected_ = index_list(opts.receive_buffers);
    deferred_reposts_.reserve(opts.receive_buffers);
    ring_.resize(2 * (static_cast<std::size_t>(nops) + nrecvs));

    recv_mem_.resize(static_cast<std::size_t>(buf_size_) * opts.receive_buffers);
    recv_mr_ = d.register_memory(recv_mem_.data(), recv_mem_.size(), access::local_write);
    // Per op: its header / rts area; per receive: its ack's header; one ready header.
    ready_offset_ = static_cast<std::size_t>(ctrl_size_) * nops + header_size * nrecvs;
    ctrl_mem_.resize(ready_offset_ + header_size);
    msg_header ready{msg_type::ready, 0, 0, 0, 0};
    ready.credit = initial_credit; // what the acceptor starts with anyway: nothing taken back
    encode(ready, ctrl_mem_.data() + ready_offset_);
    ctrl_mr_ = d.register_memory(ctrl_mem_.data(), ctrl_mem_.size(), access::local_write);
    for (std::uint32_t i = 0; i < opts.receive_buffers; ++i) {
        sge s{recv_mr_.get(), static_cast<std::size_t>(i) * buf_size_, buf_size_};
        if (auto ec = srq_->post_recv({&s, 1}, make_wr_id(wr_kind::srq, i)))
            throw_error(ec.value() ? static_cast<errc>(ec.value()) : errc::invalid_argument,
                        "endpoint::open: posting the receive buffers");
    }

    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || timer_fd_ < 0 || wake_fd_ < 0) {
        int err = errno;
        for (int fd : {epoll_fd_, timer_fd_, wake_fd_})
            if (fd >= 0)
                ::close(fd);
        throw_errno(err, "endpoint::open: epoll/timerfd/eventfd");
    }
    try {
        add_fd(epoll_fd_, listener_->fd());
        add_fd(epoll_fd_, events_->fd());
        add_fd(epoll_fd_, cq_->fd());
        // TCP: a sleeper on fd() wakes for data on the connections' sockets and reads it
        // in its poll(), so their engine threads need not wake for it as well (arm_cq).
        // Not when many endpoints of the domain do so already (nest_progress_fd): then
        // the engines read for this one's sleeper.
        if (cqb_) {
            const int pfd = cqb_->nest_progress_fd();
            if (pfd >= 0) {
                progress_nested_ = true;
                add_fd(epoll_fd_, pfd);
            }
        }
        add_fd(epoll_fd_, timer_fd_);
        add_fd(epoll_fd_, wake_fd_);
    } catch (...) {
        ::close(epoll_fd_);
        ::close(timer_fd_);
        ::close(wake_fd_);
        if (progress_nested_)
            cqb_->unnest_progress_fd();
        throw;
    }
    arm_cq();
    cq_armed_ = true;
    RDMX_LOG(debug, "endpoint %s open, incarnation %016llx", self_.text.c_str(),
             static_cast<unsigned long long>(incarnation_));
}

endpoint_impl::~endpoint_impl()
{
    // Connections first (a clean disconnect for each peer), before the regions and queues.
    for (auto& p : peers_)
        if (p) {
            p->chosen = nullptr;
            p->dial.reset();
            p->accepted.reset();
        }
    ::close(epoll_fd_);
    ::close(timer_fd_);
    ::close(wake_fd_);
    if (progress_nested_)
        cqb_->unnest_progress_fd();
}

// --- address vector ---

std::uint32_t endpoint_impl::index_of(rdmx::peer p) const noexcept
{
    auto v = static_cast<std::uint64_t>(p);
    auto i = static_cast<std::uint32_t>(v);
    auto g = static_cast<std::uint32_t>(v >> 32);
    if (p == any_peer || i >= peers_.size() || !peers_[i] || !peers_[i]->live || peers_[i]->gen != g)
        return nil;
    return i;
}

rdmx::peer endpoint_impl::handle_of(std::uint32_t i) const noexcept
{
    return static_cast<rdmx::peer>((static_cast<std::uint64_t>(peers_[i]->gen) << 32) | i);
}

std::uint32_t endpoint_impl::find_or_add(const resolved_address& a)
{
    if (auto it = by_address_.find(a.text); it != by_address_.end())
        return it->second;
    std::uint32_t i;
    if (!free_peers_.empty()) {
        i = free_peers_.back();
        free_peers_.pop_back();
    } else {
        i = static_cast<std::uint32_t>(peers_.size());
        peers_.push_back(std::make_unique<peer_entry>());
    }
    peer_entry& p = *peers_[i];
    std::uint32_t gen = p.gen;
    p = peer_entry{};
    p.gen = gen;
    p.live = true;
    p.addr = a;
    by_address_.emplace(a.text, i);
    ++live_peers_;
    // The lists of peers grow with the vector here, so that the data path never does.
    timers_.reserve(peers_.size());
    kick_.reserve(peers_.size());
    ack_due_.reserve(peers_.size());
    event_peers_.reserve(peers_.size());
    ensure_delivered_slot(i);
    return i;
}

rdmx::peer endpoint_impl::insert(std::string_view address)
{
    auto a = resolve_address(address, dom_.backend(), false, automatic_);
    if (a.key == self_.key)
        throw_error(errc::invalid_argument,
                    "endpoint::insert: " + a.text + " is this endpoint's own address (not supported)");
    return handle_of(find_or_add(a));
}

std::optional<std::string> endpoint_impl::address_of(rdmx::peer p) const
{
    std::uint32_t i = index_of(p);
    if (i == nil)
        return std::nullopt;
    return peers_[i]->addr.text;
}

void endpoint_impl::remove(rdmx::peer h) noexcept
{
    std::uint32_t pi = index_of(h);
    if (pi == nil)
        return;
    peer_entry& p = *peers_[pi];
    const std::error_code canceled = errc::canceled;
    fail_queued(pi, canceled);
    // The clean disconnect: destroying a connection disconnects it (the peer sees
    // `disconnected`); what was posted on it fails here, its completions are dropped.
    if (p.chosen)
        p.chosen->disconnect();
    if (p.chosen)
        drop_connection(pi, p.chosen, canceled);
    if (p.dial)
        drop_connection(pi, p.dial.get(), canceled);
    if (p.accepted)
        drop_connection(pi, p.accepted.get(), canceled);
    // Receives directed at it, and its held messages.
    fail_directed_recvs(pi, canceled);
    for (std::uint32_t b = 0; b < held_.size(); ++b)
        if ((held_[b].held || held_[b].claimed) && held_[b].peer == pi)
            release_unexpected(b);
    unlist(timers_, p.in_timers, pi);
    unlist(kick_, p.in_kick, pi);
    unlist(ack_due_, p.in_ack_due, pi);
    unlist(event_peers_, p.in_peer_events, pi); // its handle is stale now: nothing more about it
    by_address_.erase(p.addr.text);
    p.live = false;
    ++p.gen;
    if (p.gen == 0 || p.gen == ~std::uint32_t{0})
        p.gen = 1;
    free_peers_.push_back(pi);
    --live_peers_;
    settle(); // its canceled work is out
}

endpoint::stats endpoint_impl::statistics() const noexcept
{
    stats s;
    s.peers = live_peers_;
    s.connected = connected_peers_;
    s.connecting = connecting_peers_;
    s.unexpected = held_count_;
    return s;
}

// --- incoming requests ---

void endpoint_impl::take_requests() noexcept
{
    for (;;) {
        std::unique_ptr<connection_request> req;
        try {
            req = listener_->get_request(std::chrono::milliseconds(0));
        } catch (const std::exception& e) {
            RDMX_LOG(warn, "endpoint %s: get_request: %s", self_.text.c_str(), e.what());
            return;
        }
        if (!req)
            return;
        try {
            on_request(*req);
        } catch (const std::exception& e) {
            // start_accept refused at once (no room on the completion queue): the peer
            // was rejected by it; the peer redials or fails its operations.
            RDMX_LOG(warn, "endpoint %s: accepting: %s", self_.text.c_str(), e.what());
        }
    }
}

void endpoint_impl::on_request(connection_request& req)
{
    identity id;
    switch (decode(req.private_data(), id)) {
    case identity_status::ok: break;
    case identity_status::malformed: req.reject(encode_reject(reject_reason::malformed)); return;
    case identity_status::version_mismatch:
        req.reject(encode_reject(reject_reason::version_mismatch));
        return;
    }
    if (id.incarnation == incarnation_) {
        req.reject(encode_reject(reject_reason::self));
        return;
    }
    resolved_address a{id.listener, to_text(id.listener, dom_.backend(), automatic_)};
    std::uint32_t pi = find_or_add(a);
    peer_entry& p = *peers_[pi];
    if (p.remote_inc != 0 && p.remote_inc != id.incarnation) {
        // The peer restarted: what the old incarnation had is gone. Its outstanding work
        // fails; queued operations wait for the new one. A dial of ours still under way is
        // kept: the old incarnation is gone, so it reaches the new one, which may be
        // dialling us this very moment and accept it; so the tie-break below applies to it
        // as to any simultaneous connect (dropping it and accepting left the new
        // incarnation with our dial accepted and torn down, and what it posted there
        // failed).
        RDMX_LOG(debug, "endpoint %s: %s restarted", self_.text.c_str(), p.addr.text.c_str());
        note_peer_event(pi, endpoint_op::peer_restarted, {});
        if (p.chosen) {
            drop_connection(pi, p.chosen, errc::peer_lost);
            fail_directed_recvs(pi, errc::peer_lost); // the old incarnation sends nothing more
        }
        if (p.dial && !dial_may_reach(*p.dial, id.incarnation))
            drop_connection(pi, p.dial.get(), errc::peer_lost);
        if (p.accepted)
            drop_connection(pi, p.accepted.get(), errc::peer_lost);
        p.remote_inc = 0; // the old one's; the tie-break takes the new one
    }
    if (incarnation_ < id.incarnation && p.dial) {
        RDMX_LOG(debug, "endpoint %s: %s: duplicate request rejected", self_.text.c_str(),
                 p.addr.text.c_str());
        // Simultaneous connect (libfabric #7396): the lower incarnation keeps its own dial
        // and refuses the other; the higher accepts, so exactly one connection survives.
        p.remote_inc = id.incarnation;
        req.reject(encode_reject(reject_reason::duplicate));
        return;
    } else {
        // Known incarnation, and the peer dials again: its side of any connection we
        // still hold is gone (it dials only when it has none). Replace ours.
        if (p.chosen || p.accepted)
            RDMX_LOG(debug, "endpoint %s: %s dials again: replacing our connection", self_.text.c_str(),
                     p.addr.text.c_str());
        if (p.chosen)
            drop_connection(pi, p.chosen, errc::peer_lost);
        if (p.accepted)
            drop_connection(pi, p.accepted.get(), errc::peer_lost);
    }
    p.remote_inc = id.incarnation;
    connection_options o = opts_.connection;
    o.send_cq = cq_;
    o.recv_cq = cq_;
    o.srq = srq_;
    o.events = events_;
    o.context = static_cast<std::uint64_t>(handle_of(pi));
    auto reply = encode_accept(incarnation_);
    const auto before = class_of(p);
    p.accepted = req.start_accept(o, reply);
    p.accepted_up = p.accepted_heard = false;
    reclass(before, p);
}

// --- connection events ---

void endpoint_impl::poll_events() noexcept
{
    // on_event never comes back here (poll() calls this, outside every handler).
    while (std::size_t n = events_->poll(ev_batch_))
        for (std::size_t i = 0; i < n; ++i)
            on_event(ev_batch_[i]);
}

void endpoint_impl::on_event(const event& ev) noexcept
{
    std::uint32_t pi = index_of(static_cast<rdmx::peer>(ev.context));
    if (pi == nil || ev.conn == nullptr)
        return; // a removed peer's (its connections are gone with their events)
    peer_entry& p = *peers_[pi];
    connection* c = ev.conn;
    if (c != p.dial.get() && c != p.accepted.get())
        return; // a connection already replaced
    RDMX_LOG(debug, "endpoint %s: %s: %s on its %s (%s)", self_.text.c_str(), p.addr.text.c_str(),
             to_string(ev.type), c == p.dial.get() ? "dial" : "accepted", ev.cause.message().c_str());
    switch (ev.type) {
    case event_type::established:
        if (c == p.dial.get()) {
            auto inc = decode_accept(c->peer_private_data());
            if (!inc) {
                drop_connection(pi, c, errc::protocol_error);
                on_dial_failed(pi, errc::protocol_error, reject_reason::none);
                return;
            }
            if (p.remote_inc != 0 && p.remote_inc != *inc)
                note_peer_event(pi, endpoint_op::peer_restarted, {});
            if (p.remote_inc != 0 && p.remote_inc != *inc && p.chosen) { // restarted behind our back
                drop_connection(pi, p.chosen, errc::peer_lost);
                fail_directed_recvs(pi, errc::peer_lost);
            }
            p.remote_inc = *inc;
        }
        if (p.chosen && p.chosen != c) {
            // Two live connections to one peer (both sides accepted each other's request,
            // possible only around a restart): keep the one that was first.
            drop_connection(pi, c, errc::canceled);
            return;
        }
        if (c == p.accepted.get()) {
            // Chosen once its dialler is heard from too (heard_on): on siw an acceptor is
            // established once it sent its reply, which its dialler may never get.
            p.accepted_up = true;
            if (!p.accepted_heard)
                return;
        }
        on_connected(pi, c);
        return;
    case event_type::disconnected:
    case event_type::error: {
        std::error_code cause = ev.type == event_type::error ? ev.cause : std::error_code(errc::disconnected);
        if (c == p.chosen) {
            poll_cq(); // what completed before the end is not failed
            drop_connection(pi, c, cause);
            // Its connection ended (the peer died, disconnected, or the network failed):
            // a receive directed at it completes with that cause, as its operations do,
            // instead of waiting for a message that may never come. Held messages stay.
            fail_directed_recvs(pi, cause);
            if (p.queued.size != 0) {
                p.deadline = clock::now() + opts_.connect_deadline;
                start_dial(pi); // the next operation reaches a restarted peer (#6660)
                need_timers(pi);
            }
            return;
        }
        bool was_dial = c == p.dial.get();
        reject_reason why = reject_reason::none;
        if (was_dial && cause == errc::rejected)
            why = decode_reject(c->peer_private_data());
        drop_connection(pi, c, cause);
        if (was_dial)
            on_dial_failed(pi, cause, why);
        else if (!p.chosen && !p.dial && p.queued.size != 0)
            start_dial(pi);
        return;
    }
    case event_type::srq_limit_reached: return; // the endpoint does not arm the limit
    }
}

void endpoint_impl::on_connected(std::uint32_t pi, connection* c) noexcept
{
    peer_entry& p = *peers_[pi];
    RDMX_LOG(trace, "endpoint %s: %s: chosen: its %s, %u queued", self_.text.c_str(), p.addr.text.c_str(),
             c == p.dial.get() ? "dial" : "accepted", p.queued.size);
    const auto before = class_of(p);
    p.chosen = c;
    reclass(before, p);
    p.posted_wrs = 0;
    p.sq_depth = c->limits().send_queue_depth;
    // A quarter of the send queue (at least one slot) is kept for acknowledgements.
    p.user_budget = p.sq_depth - std::max<std::uint32_t>(1, p.sq_depth / 4);
    p.backoff = first_backoff;
    p.next_dial = clock::time_point::max();
    p.deadline = clock::time_point::max();
    p.last_cause.clear();
    p.dials = p.duplicates = 0;
    p.tx = p.peer_delivered = p.told = 0;
    p.peer_credit = p.told_grant = initial_credit; // both sides' start on a new connection
    p.delivered_posted = p.nudge_due = false;
    credit_moved(pi); // what came before it was chosen
    if (c == p.dial.get()) {
        // The ready message goes first (before anything queued), so that the acceptor
        // knows our side is up whether or not we have anything to send.
        if (auto ec = send_header(*c, ready_offset_, make_wr_id(wr_kind::ready, pi)))
            RDMX_LOG(warn, "endpoint %s: %s: posting the ready message: %s (the connection's end follows)",
                     self_.text.c_str(), p.addr.text.c_str(), ec.message().c_str());
        else
            ++p.posted_wrs;
        // On iWARP, until the acceptor answers: siw (Linux 6.1) sends its MPA reply before
        // it hands the socket to the QP, and what we send in between stays unread in the
        // acceptor's socket until more data comes. So, with backoff, one more header
        // (nudge()) until something comes back, which the acceptor's answer to the ready
        // (below) makes prompt. The acceptor cannot speak first: RFC 5044 7.1.2, and siw
        // fails the dial when it does ("Found on siw", docs/endpoints.md).
        if (delivery_acks_ && !p.dial_heard) {
            p.nudge_every = first_nudge;
            p.nudge_at = clock::now() + first_nudge;
            need_timers(pi);
        }
    } else if (delivery_acks_) {
        nudge(pi); // the answer to the dialler's first message: it may stop nudging
    }
    flush_queue(pi);
}

void endpoint_impl::heard_on(std::uint32_t pi, connection* c) noexcept
{
    peer_entry& p = *peers_[pi];
    if (c == p.dial.get()) {
        p.dial_heard = true; // the acceptor took our first message: it answers only then
        return;
    }
    if (p.chosen || c != p.accepted.get() || p.accepted_heard)
        return;
    p.accepted_heard = true;
    if (p.accepted_up)
        on_connected(pi, c);
}

void endpoint_impl::nudge(std::uint32_t pi) noexcept
{
    // A `delivered` message now, whatever the counts say (on_connected says why).
    peers_[pi]->nudge_due = true;
    need_ack(pi);
}

bool endpoint_impl::nudging(const peer_entry& p) const noexcept
{
    return delivery_acks_ && p.chosen && p.chosen == p.dial.get() && !p.dial_heard;
}

void endpoint_impl::start_dial(std::uint32_t pi) noexcept
{
    peer_entry& p = *peers_[pi];
    if (p.dial || p.accepted || p.chosen)
        return;
    p.dial_heard = false;
    p.next_dial = clock::time_point::max();
    connection_options o = opts_.connection;
    o.send_cq = cq_;
    o.recv_cq = cq_;
    o.srq = srq_;
    o.events = events_;
    o.context = static_cast<std::uint64_t>(handle_of(pi));
    auto pd = encode(identity{incarnation_, self_.key});
    RDMX_LOG(trace, "endpoint %s: dialling %s", self_.text.c_str(), p.addr.text.c_str());
    try {
        const auto before = class_of(p);
        ++p.dials;
        p.dial = dom_.start_connect(p.addr.text, o, pd);
        reclass(before, p);
    } catch (const rdmx::error& e) {
        RDMX_LOG(debug, "endpoint %s: dial %s: %s", self_.text.c_str(), p.addr.text.c_str(), e.what());
        on_dial_failed(pi, e.code(), reject_reason::none);
    } catch (const std::exception&) {
        on_dial_failed(pi, errc::no_resources, reject_reason::none);
    }
}

void endpoint_impl::on_dial_failed(std::uint32_t pi, std::error_code cause, reject_reason why) noexcept
{
    peer_entry& p = *peers_[pi];
    RDMX_LOG(trace, "endpoint %s: %s: dial failed: %s (%s), chosen %d accepted %d queued %u",
             self_.text.c_str(), p.addr.text.c_str(), cause.message().c_str(), to_string(why),
             p.chosen != nullptr, p.accepted != nullptr, p.queued.size);
    if (p.chosen || p.accepted)
        return; // the peer's own connection is (being) set up: ours was the duplicate
    if (cause == errc::rejected && why == reject_reason::duplicate) {
        ++p.duplicates;
        // The peer keeps its dial to us; wait (within the deadline) for it, and dial again
        // in case its connection was a stale one that it is about to lose.
        schedule_redial(pi);
        return;
    }
    if (p.queued.size == 0)
        return;
    p.last_cause = cause;
    // A server not up yet, or restarting. A reject that carries no endpoint's reason is
    // that too: a listener that is closing (its process exiting before it accepted, or
    // accepting and closing at once) or one shedding load rejects without our private
    // data; only the deadline ends these redials.
    if (cause == errc::connection_refused || cause == errc::unreachable || cause == errc::timed_out ||
        cause == errc::peer_lost || cause == errc::disconnected ||
        (cause == errc::rejected && why == reject_reason::none)) {
        schedule_redial(pi);
        return;
    }
    // Rejected by an endpoint for a reason that will not change (version, malformed, self),
    // or a failure that is not the network's: the queued operations fail.
    RDMX_LOG(debug, "endpoint %s: dial to %s failed for good: %s (reject reason: %s)", self_.text.c_str(),
             p.addr.text.c_str(), cause.message().c_str(), to_string(why));
    fail_queued(pi, cause);
}

void endpoint_impl::fail_directed_recvs(std::uint32_t pi, std::error_code cause) noexcept
{
    for (std::uint32_t ri = posted_recvs_.front(); ri != nil;) {
        std::uint32_t next = posted_recvs_.next(ri);
        if (recvs_[ri].from == pi) {
            posted_recvs_.erase(ri);
            recvs_[ri].status = cause;
            finish_recv(ri);
        }
        ri = next;
    }
}

void endpoint_impl::fail_queued(std::uint32_t pi, std::error_code cause) noexcept
{
    peer_entry& p = *peers_[pi];
    while (p.queued.head != nil) {
        std::uint32_t oi = p.queued.head;
        ops_[oi].status = cause;
        complete_op(oi);
    }
    p.deadline = clock::time_point::max();
}

void endpoint_impl::reclass(peer_class before, const peer_entry& p) noexcept
{
    const peer_class now = class_of(p);
    if (now == before)
        return;
    if (before == peer_class::connected)
        --connected_peers_;
    else if (before == peer_class::connecting)
        --connecting_peers_;
    if (now == peer_class::connected)
        ++connected_peers_;
    else if (now == peer_class::connecting)
        ++connecting_peers_;
}

void endpoint_impl::drop_connection(std::uint32_t pi, connection* c, std::error_code cause) noexcept
{
    peer_entry& p = *peers_[pi];
    struct reclass_at_end {
        endpoint_impl& e;
        const peer_entry& p;
        peer_class before;
        ~reclass_at_end() { e.reclass(before, p); }
    } counts{*this, p, class_of(p)};
    if (c == p.chosen) {
        if (cause != errc::canceled)
            note_peer_event(pi, endpoint_op::peer_down, cause);
        // Its outstanding operations fail with the cause; their completions, if any are
        // still in the queue, go with the connection.
        while (p.outstanding.head != nil) {
            std::uint32_t oi = p.outstanding.head;
            op_slot& o = ops_[oi];
            if (!o.status)
                o.status = cause;
            o.awaiting_local = o.awaiting_ack = false;
            complete_op(oi);
        }
        // Rendezvous receives reading over it, and the requests to read it still held.
        for (std::uint32_t ri = 0; ri < recvs_.size(); ++ri) {
            recv_slot& r = recvs_[ri];
            if (r.conn == c && r.st != recv_slot::state::free && r.st != recv_slot::state::posted) {
                pending_recvs_.erase(ri);
                if (r.st == recv_slot::state::ack_sent || r.st == recv_slot::state::ack_pending) {
                    free_recv(ri); // its completion is out already
                } else {
                    if (!r.status)
                        r.status = cause;
                    r.reads_outstanding = 0;
                    r.to_read = r.posted_bytes;
                    finish_recv(ri);
                }
            }
        }
        p.chosen = nullptr;
        p.posted_wrs = 0;
        p.delivered_posted = false;
    }
    for (std::uint32_t b = 0; b < held_.size(); ++b)
        if ((held_[b].held || held_[b].claimed) && held_[b].conn == c) {
            if (held_[b].hdr.type == msg_type::rts)
                release_unexpected(b); // its sender's operation fails with this connection
            else
                held_[b].conn = nullptr;
        }
    if (c == p.dial.get()) {
        p.dial.reset();
        p.rx_dial = 0;
    } else if (c == p.accepted.get()) {
        p.accepted.reset();
        p.accepted_up = p.accepted_heard = false;
        p.rx_accepted = 0;
    }
}

} // namespace ep
} // namespace rdmx
