// object_store_server: an object store that serves many clients from ONE thread.
//
//   object_store_server tcp://0.0.0.0:7480
//   object_store_server rdma://192.168.77.1:7480 --max-clients 128
//
// The protocol is in object_store.hpp: PUT and GET are small RPCs over send/recv, the
// data moves by one-sided RDMA (the server reads a PUT's data out of the client's buffer
// and writes a GET's data into it). How the server is built:
//   - One shared completion queue takes the send and receive completions of every
//     connection; each completion names its connection (completion::context).
//   - One shared receive queue holds the receives for every client's requests: the server
//     posts them once and reposts each as soon as its request is read, instead of carving
//     a receive pool per connection (--no-srq does that instead, for comparison: two
//     receives per client, posted with start_accept before the client may send).
//   - Connections are accepted with start_accept (never blocking the thread) and report
//     established / disconnected / error on one event queue.
//   - The thread sleeps in epoll_wait on four fds: the listener's (a pending request),
//     the event queue's, the completion queue's (armed with request_notify) and a
//     signalfd (SIGINT / SIGTERM end it cleanly).
//   - A client that dies or misbehaves is retired: its connection is disconnected, its
//     in-flight operations complete (with errors: flushed, retry exceeded) and free what
//     they held, then its connection is destroyed. The other clients never notice.
#include <CLI/CLI.hpp>

#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <rdmx/rdmx.hpp>

#include "object_store.hpp"

using namespace std::chrono_literals;
namespace os = object_store;

namespace
{

/// Send-queue requests a connection may have outstanding: a window bind, one RDMA read or
/// write and the reply (the client has one request at a time), with room to spare.
constexpr std::uint32_t send_depth = 8;
/// --no-srq: receives per connection (one request outstanding, one to spare).
constexpr std::uint32_t recv_depth = 2;
/// Retired connections whose flushed completions never came are destroyed after this.
constexpr auto retire_bound = 10s;

/// wr_id of the send-queue requests (the connection is in completion::context), and the
/// bit that marks a receive of the SRQ (the rest of its wr_id is the buffer's slot).
enum wr_kind : std::uint64_t { wr_read = 1, wr_write = 2, wr_reply = 3, wr_bind = 4, wr_recv = 1ull << 63 };

/// A stored object: its bytes, registered so that the NIC can read a PUT into it and
/// write it out for a GET. Shared: a GET in flight keeps an object alive that a PUT of
/// the same key has replaced meanwhile.
struct object {
    std::vector<std::byte> data;
    std::unique_ptr<rdmx::memory_region> mr;
    std::uint64_t version = 0;
};

enum class client_state { connecting, established, retired };

struct client {
    std::uint64_t id = 0;
    client_state state = client_state::connecting;
    // Declared before `conn`, so destroyed after it: the connection's posted RDMA names
    // this memory until the connection is gone.
    std::shared_ptr<object> op_object; ///< the object the RDMA in flight reads into / writes from
    std::uint64_t op_key = 0;
    std::uint64_t op_version = 0;
    std::uint64_t op_invalidate = 0; ///< the client's window to revoke with the reply (0: none)
    std::array<std::byte, os::message_size * recv_depth> recv_buf{}; ///< --no-srq only
    std::unique_ptr<rdmx::memory_region> recv_mr;
    std::array<std::byte, os::message_size> reply_buf{};
    std::unique_ptr<rdmx::memory_region> reply_mr;
    bool reply_busy = false;          ///< reply_buf is in flight
    std::optional<os::reply> pending; ///< a reply that waits for reply_buf
    std::uint64_t pending_invalidate = 0;
    int inflight = 0; ///< send-queue requests posted and not completed
    std::chrono::steady_clock::time_point retired_at;
    std::unique_ptr<rdmx::connection> conn;
    // After `conn`, so destroyed before it: windows this server bound for this client over
    // the version words of the keys it was told about (key -> window).
    std::unordered_map<std::uint64_t, std::unique_ptr<rdmx::memory_window>> words;
};

class server
{
public:
    server(const std::string& address, std::uint32_t max_clients, std::uint32_t srq_depth, bool use_srq,
           std::uint32_t max_objects)
        : dom_(rdmx::domain::open(address)), events_(rdmx::event_queue::create()), versions_(max_objects)
    {
        // The version words, one per key, that clients compare-and-swap to claim an update;
        // each client reaches only those of keys it was told about, through a window of 8
        // bytes each (where the device has windows).
        atomics_ = dom_->limits().atomics;
        windows_ = dom_->limits().memory_windows;
        if (atomics_) {
            auto rights = rdmx::access::remote_read | rdmx::access::remote_atomic;
            versions_mr_ = dom_->register_memory(versions_.data(), versions_.size() * sizeof versions_[0],
                                                 windows_ ? rights | rdmx::access::bind_window : rights);
        }
        // The CQ holds every connection's send depth (+ 1: rdmx's own goodbye) and the
        // SRQ's depth once (or each connection's receive depth): with that size it cannot
        // overrun, and the library refuses a connection beyond it.
        cq_ = dom_->create_completion_queue({.depth = use_srq ? srq_depth + max_clients * (send_depth + 1)
                                                              : max_clients * (send_depth + 1 + recv_depth)});
        if (use_srq) {
            rdmx::shared_receive_queue_options sopts;
            sopts.depth = srq_depth;
            sopts.max_sge = 1;
            srq_ = dom_->create_shared_receive_queue(sopts);
            recv_bufs_.resize(std::size_t{srq_depth} * os::message_size);
            recv_mr_ = dom_->register_memory(recv_bufs_.data(), recv_bufs_.size(), rdmx::access::local_write);
            for (std::uint32_t i = 0; i < srq_depth; ++i)
                repost(i);
        }
        listener_ = dom_->listen(address);
        std::printf("object_store_server: listening on %s (backend %s, device %s, port %u): %s\n",
                    address.c_str(), rdmx::to_string(dom_->backend()), dom_->limits().device_name.c_str(),
                    listener_->port(),
                    !atomics_  ? "no atomics: versions checked by the server alone"
                    : windows_ ? "a window per client and version word"
                               : "no memory windows: the version table's key");
        std::fflush(stdout);
    }

    /// Serves until SHUTDOWN or a signal; returns the counters.
    os::counters run()
    {
        sigset_t signals;
        sigemptyset(&signals);
        sigaddset(&signals, SIGINT);
        sigaddset(&signals, SIGTERM);
        sigprocmask(SIG_BLOCK, &signals, nullptr);
        int sfd = signalfd(-1, &signals, SFD_CLOEXEC);
        int ep = epoll_create1(EPOLL_CLOEXEC);
        if (sfd < 0 || ep < 0)
            throw std::system_error(errno, std::generic_category(), "signalfd / epoll_create1");
        for (int fd : {listener_->fd(), events_->fd(), cq_->fd(), sfd}) {
            epoll_event ev{.events = EPOLLIN, .data = {.fd = fd}};
            if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
                throw std::system_error(errno, std::generic_category(), "epoll_ctl");
        }

        while (!stop_) {
            // Drain everything, then arm the CQ and look once more (a completion that came
            // before arming raises no event), and only then sleep.
            // Each runs whatever the others found (no short-circuit).
            const bool accepted = accept_pending();
            const bool evented = drain_events();
            const bool completed = drain_completions();
            bool busy = accepted || evented || completed;
            if (busy)
                continue;
            if (auto ec = cq_->request_notify())
                throw rdmx::error(ec, "request_notify");
            if (drain_completions())
                continue;
            reap_retired();
            std::array<epoll_event, 4> ready;
            int n = epoll_wait(ep, ready.data(), ready.size(), retired_count_ ? 1000 : -1);
            if (n < 0 && errno != EINTR)
                throw std::system_error(errno, std::generic_category(), "epoll_wait");
            for (int i = 0; i < n; ++i) {
                if (ready[i].data.fd == cq_->fd())
                    cq_->ack_notify();
                else if (ready[i].data.fd == sfd) {
                    signalfd_siginfo si;
                    if (read(sfd, &si, sizeof si) == sizeof si)
                        std::printf("object_store_server: signal %u, exiting\n", si.ssi_signo);
                    stop_ = true;
                }
            }
        }
        close(ep);
        close(sfd);
        for (const auto& [id, c] : clients_)
            stats_.open += c->state != client_state::retired;
        clients_.clear(); // disconnects whoever is left
        return stats_;
    }

private:
    // --- connection management ---

    bool accept_pending()
    {
        bool any = false;
        while (auto req = listener_->get_request(0ms)) {
            any = true;
            auto c = std::make_unique<client>();
            c->id = next_id_++;
            c->reply_mr = dom_->register_memory(c->reply_buf.data(), c->reply_buf.size(), rdmx::access::none);
            rdmx::connection_options opts;
            opts.send_queue_depth = send_depth;
            opts.max_send_sge = 1;
            opts.send_cq = cq_;
            opts.recv_cq = cq_;
            opts.events = events_;
            opts.context = c->id;
            std::array<rdmx::sge, recv_depth> sges;
            std::array<rdmx::recv_request, recv_depth> recvs;
            if (srq_)
                opts.srq = srq_;
            else {
                opts.recv_queue_depth = recv_depth;
                opts.max_recv_sge = 1;
                c->recv_mr =
                    dom_->register_memory(c->recv_buf.data(), c->recv_buf.size(), rdmx::access::local_write);
                for (std::uint32_t k = 0; k < recv_depth; ++k) {
                    sges[k] = {c->recv_mr.get(), k * os::message_size, os::message_size};
                    recvs[k] = {.wr_id = wr_recv | k, .local = {&sges[k], 1}};
                }
            }
            try {
                // Without an SRQ the receives go up before the client hears it may send.
                c->conn = req->start_accept(opts, {}, srq_ ? std::span<const rdmx::recv_request>{} : recvs);
            } catch (const rdmx::error& e) {
                // errc::no_resources: the shared queues are full (--max-clients).
                std::fprintf(stderr, "object_store_server: refusing a client: %s\n", e.what());
                req->reject();
                continue;
            }
            ++stats_.accepted;
            clients_.emplace(c->id, std::move(c));
        }
        return any;
    }

    bool drain_events()
    {
        std::array<rdmx::event, 16> evs;
        bool any = false;
        while (std::size_t n = events_->poll(evs)) {
            any = true;
            for (const auto& ev : std::span(evs).first(n)) {
                client* c = find(ev.context);
                if (!c)
                    continue; // an event of a listener or SRQ: none are asked for
                switch (ev.type) {
                case rdmx::event_type::established:
                    if (c->state == client_state::connecting)
                        c->state = client_state::established;
                    break;
                case rdmx::event_type::disconnected:
                    if (c->state != client_state::retired)
                        ++stats_.closed;
                    retire(*c, nullptr);
                    break;
                case rdmx::event_type::error:
                    if (c->state != client_state::retired)
                        ++stats_.lost;
                    retire(*c, ev.cause.message().c_str());
                    break;
                case rdmx::event_type::srq_limit_reached: // receives are reposted at once
                    break;
                }
            }
        }
        return any;
    }

    /// Stops serving a client: disconnect() flushes what it has posted; the connection is
    /// destroyed once those completions are in (reap_retired).
    void retire(client& c, const char* why)
    {
        if (c.state == client_state::retired)
            return;
        if (why)
            std::printf("object_store_server: client %llu lost: %s\n", static_cast<unsigned long long>(c.id),
                        why);
        c.state = client_state::retired;
        c.retired_at = std::chrono::steady_clock::now();
        c.pending.reset();
        ++retired_count_;
        c.conn->disconnect();
    }

    void reap_retired()
    {
        if (!retired_count_)
            return;
        auto now = std::chrono::steady_clock::now();
        for (auto it = clients_.begin(); it != clients_.end();) {
            client& c = *it->second;
            if (c.state == client_state::retired && (c.inflight == 0 || now - c.retired_at > retire_bound)) {
                --retired_count_;
                it = clients_.erase(it);
            } else
                ++it;
        }
    }

    client* find(std::uint64_t id)
    {
        auto it = clients_.find(id);
        return it == clients_.end() ? nullptr : it->second.get();
    }

    // --- the data path ---

    void repost(std::uint64_t slot)
    {
        rdmx::sge s{recv_mr_.get(), slot * os::message_size, os::message_size};
        if (auto ec = srq_->post_recv({&s, 1}, wr_recv | slot))
            throw rdmx::error(ec, "shared_receive_queue::post_recv");
    }

    bool drain_completions()
    {
        std::array<rdmx::completion, 32> wcs;
        bool any = false;
        while (std::size_t n = cq_->poll(wcs)) {
            any = true;
            for (const auto& wc : std::span(wcs).first(n))
                complete(wc);
        }
        return any;
    }

    void complete(const rdmx::completion& wc)
    {
        client* c = find(wc.context); // null: a client destroyed meanwhile
        if (wc.wr_id & wr_recv) {
            // A receive (an error completion has no opcode: the wr_id tells). Read the
            // request out and give the slot back at once.
            std::uint64_t slot = wc.wr_id & ~wr_recv;
            os::request req{};
            if (srq_) {
                std::memcpy(&req, recv_bufs_.data() + slot * os::message_size,
                            std::min<std::size_t>(sizeof req, wc.byte_len));
                repost(slot);
            }
            if (!c || c->state == client_state::retired)
                return;
            if (!srq_ && !wc.status) {
                std::memcpy(&req, c->recv_buf.data() + slot * os::message_size,
                            std::min<std::size_t>(sizeof req, wc.byte_len));
                rdmx::sge sg{c->recv_mr.get(), slot * os::message_size, os::message_size};
                if (auto ec = c->conn->post_recv({&sg, 1}, wc.wr_id)) {
                    ++stats_.lost;
                    return retire(*c, ec.message().c_str());
                }
            }
            if (wc.status) {
                ++stats_.lost;
                return retire(*c, wc.status.message().c_str());
            }
            if (wc.byte_len != sizeof req || req.magic != os::magic) {
                ++stats_.lost;
                return retire(*c, "malformed request");
            }
            return handle(*c, req);
        }
        if (!c)
            return;
        --c->inflight;
        if (wc.wr_id == wr_reply)
            c->reply_busy = false;
        if (wc.status) {
            ++stats_.failed;
            if (c->state != client_state::retired) {
                ++stats_.lost;
                retire(*c, wc.status.message().c_str());
            }
            if (c->inflight == 0)
                c->op_object.reset();
            return;
        }
        switch (wc.wr_id) {
        case wr_read: { // the PUT's data is in: the object replaces the key's
            c->op_object->version = c->op_version;
            auto& obj = objects_[c->op_key] = std::move(c->op_object);
            if (!atomics_) // no client can claim the version: the server keeps the word
                versions_[slots_.at(c->op_key)] = obj->version;
            ++stats_.puts;
            reply_about(*c, c->op_key, {.status = os::status::ok, .size = obj->data.size()});
            break;
        }
        case wr_bind: break;
        case wr_write: // the GET's data is out (its reply is already posted behind it)
            c->op_object.reset();
            ++stats_.gets;
            break;
        case wr_reply:
            if (stopping_after_reply_ == c->id)
                stop_ = true;
            if (c->pending) {
                auto r = *c->pending;
                c->pending.reset();
                c->op_invalidate = c->pending_invalidate;
                send_reply(*c, r);
            }
            break;
        }
    }

    void handle(client& c, const os::request& req)
    {
        // The client's window is revoked by whatever reply this request gets.
        auto buf = rdmx::remote_buffer::parse(req.buffer);
        c.op_invalidate = buf && (req.flags & os::buffer_is_window) ? buf->key : 0;
        switch (req.op) {
        case os::op::put: {
            if (!buf || req.size < 1 || req.size > os::max_object || buf->length < req.size)
                return send_reply(c, {.status = os::status::bad_request, .key = req.key});
            if (auto st = admit_put(req); st != os::status::ok) {
                stats_.conflicts += st == os::status::conflict;
                return send_reply(c, {.status = st, .key = req.key});
            }
            auto obj = std::make_shared<object>();
            obj->data.resize(req.size);
            obj->mr = dom_->register_memory(obj->data.data(), obj->data.size(), rdmx::access::local_write);
            rdmx::sge s{obj->mr.get(), 0, obj->data.size()};
            c.op_object = std::move(obj);
            c.op_key = req.key;
            c.op_version = req.version;
            return post(c, [&] { return c.conn->post_read({&s, 1}, *buf, wr_read); });
        }
        case os::op::get: {
            auto it = objects_.find(req.key);
            if (!buf)
                return send_reply(c, {.status = os::status::bad_request, .key = req.key});
            if (it == objects_.end())
                return send_reply(c, {.status = os::status::not_found, .key = req.key});
            if (buf->length < it->second->data.size())
                return send_reply(c, {.status = os::status::too_small, .key = req.key});
            c.op_object = it->second;
            rdmx::sge s{c.op_object->mr.get(), 0, c.op_object->data.size()};
            // The reply goes right behind the write: RC delivers them in order, so the
            // client sees the data before the reply.
            post(c, [&] { return c.conn->post_write({&s, 1}, *buf, wr_write); });
            return reply_about(c, req.key, {.status = os::status::ok, .size = c.op_object->data.size()});
        }
        case os::op::shutdown:
            std::printf("object_store_server: shutdown requested by client %llu\n",
                        static_cast<unsigned long long>(c.id));
            stopping_after_reply_ = c.id;
            return send_reply(c, {.status = os::status::ok, .stats = stats_});
        }
        send_reply(c, {.status = os::status::bad_request, .key = req.key});
    }

    /// Whether a PUT may store its version (object_store.hpp): version 0 creates a key;
    /// version v + 1 of a key whose data is version v needs the key's version word at v + 1
    /// (the writer's compare-and-swap claimed it; without atomics the server alone orders
    /// the versions).
    os::status admit_put(const os::request& req)
    {
        auto it = objects_.find(req.key);
        if (it == objects_.end()) {
            if (req.version != 0)
                return os::status::conflict;
            if (!slots_.count(req.key)) {
                if (slots_.size() == versions_.size())
                    return os::status::bad_request; // --max-objects reached
                std::uint32_t slot = static_cast<std::uint32_t>(slots_.size());
                slots_.emplace(req.key, slot);
                word(slot).store(0);
            }
            return os::status::ok;
        }
        if (req.version != it->second->version + 1)
            return os::status::conflict;
        if (atomics_ && word(slots_.at(req.key)).load() != req.version)
            return os::status::conflict;
        return os::status::ok;
    }

    /// A key's version word, which clients' compare-and-swap changes under the server.
    std::atomic_ref<std::uint64_t> word(std::uint32_t slot) { return std::atomic_ref(versions_[slot]); }

    /// Replies about an existing key: its data's version and the descriptor of its version
    /// word for this client (a window bound for it on first use).
    void reply_about(client& c, std::uint64_t key, os::reply r)
    {
        r.key = key;
        r.version = objects_.at(key)->version;
        if (atomics_) {
            std::uint64_t off = std::uint64_t{slots_.at(key)} * sizeof versions_[0];
            if (!windows_)
                r.version_word = versions_mr_->remote(off, sizeof versions_[0]).serialize();
            else {
                auto& w = c.words[key];
                if (!w) {
                    w = dom_->allocate_window();
                    // Bound before the reply is sent: posts on one connection are ordered.
                    post(c, [&] {
                        return c.conn->post_bind_window(
                            *w, *versions_mr_, off, sizeof versions_[0],
                            rdmx::access::remote_read | rdmx::access::remote_atomic, wr_bind);
                    });
                }
                r.version_word = w->remote().serialize();
            }
        }
        send_reply(c, r);
    }

    void send_reply(client& c, const os::reply& r)
    {
        if (c.state == client_state::retired)
            return;
        if (c.reply_busy) {
            c.pending = r;
            c.pending_invalidate = c.op_invalidate;
            return;
        }
        std::memcpy(c.reply_buf.data(), &r, sizeof r);
        rdmx::sge s{c.reply_mr.get(), 0, sizeof r};
        c.reply_busy = true;
        const std::uint64_t key = std::exchange(c.op_invalidate, 0);
        post(c, [&] {
            return key ? c.conn->post_send_invalidate({&s, 1}, key, wr_reply)
                       : c.conn->post_send({&s, 1}, wr_reply);
        });
    }

    /// Posts one send-queue request; a failure (the connection went down) retires the client.
    template <class F> void post(client& c, F&& f)
    {
        if (c.state == client_state::retired)
            return;
        if (auto ec = f()) {
            if (c.state != client_state::retired)
                ++stats_.lost;
            return retire(c, ec.message().c_str());
        }
        ++c.inflight;
    }

    std::unique_ptr<rdmx::domain> dom_;
    std::shared_ptr<rdmx::event_queue> events_;
    std::shared_ptr<rdmx::completion_queue> cq_;
    std::shared_ptr<rdmx::shared_receive_queue> srq_;
    std::vector<std::byte> recv_bufs_;
    std::unique_ptr<rdmx::memory_region> recv_mr_;
    std::unique_ptr<rdmx::listener> listener_;
    std::unordered_map<std::uint64_t, std::shared_ptr<object>> objects_;
    std::vector<std::uint64_t> versions_;                    ///< the version words
    std::unordered_map<std::uint64_t, std::uint32_t> slots_; ///< key -> its version word
    std::unique_ptr<rdmx::memory_region> versions_mr_;
    bool atomics_ = false, windows_ = false;
    std::unordered_map<std::uint64_t, std::unique_ptr<client>> clients_; // after the queues: destroyed first
    std::uint64_t next_id_ = 1;
    std::size_t retired_count_ = 0;
    std::uint64_t stopping_after_reply_ = 0;
    bool stop_ = false;
    os::counters stats_;
};

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"rdmx object store: PUT/GET over RPC, data by RDMA read/write, many clients, one thread"};
    std::string address = "auto://0.0.0.0:7480";
    std::uint32_t max_clients = 64;
    std::uint32_t srq_depth = 256;
    bool no_srq = false;
    app.add_option("address", address,
                   "listen address: rdma://IP:PORT, tcp://IP:PORT, shm://NAME:PORT or auto://IP:PORT")
        ->capture_default_str();
    app.add_option("--max-clients", max_clients, "connections the shared completion queue has room for")
        ->capture_default_str()
        ->check(CLI::Range(1u, 65536u));
    app.add_option("--srq-depth", srq_depth, "receives in the shared receive queue")
        ->capture_default_str()
        ->check(CLI::Range(16u, 65536u));
    app.add_flag("--no-srq", no_srq, "receives per connection instead of one shared receive queue");
    std::uint32_t max_objects = 4096;
    app.add_option("--max-objects", max_objects, "keys the version table has room for")
        ->capture_default_str()
        ->check(CLI::Range(1u, 1u << 24));
    CLI11_PARSE(app, argc, argv);

    try {
        server s(address, max_clients, srq_depth, !no_srq, max_objects);
        auto st = s.run();
        std::printf("object_store_server: done: accepted %llu, closed %llu, lost %llu, puts %llu, gets %llu, "
                    "failed operations %llu, conflicts %llu, still open %llu\n",
                    static_cast<unsigned long long>(st.accepted), static_cast<unsigned long long>(st.closed),
                    static_cast<unsigned long long>(st.lost), static_cast<unsigned long long>(st.puts),
                    static_cast<unsigned long long>(st.gets), static_cast<unsigned long long>(st.failed),
                    static_cast<unsigned long long>(st.conflicts), static_cast<unsigned long long>(st.open));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "object_store_server: %s\n", e.what());
        return 1;
    }
    return 0;
}
