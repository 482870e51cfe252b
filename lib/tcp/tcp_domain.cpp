#include "tcp/tcp_domain.hpp"

#include <rdmx/queues.hpp>

#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends.hpp"
#include "log.hpp"
#include "tcp/tcp_completion_queue.hpp"
#include "tcp/tcp_connection.hpp"
#include "tcp/tcp_engine.hpp"
#include "tcp/tcp_ring.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_srq.hpp"
#include "tcp/tcp_wire.hpp"
#include "validate.hpp"

namespace rdmx
{
namespace tcp
{
namespace
{

// What this backend grants. Depths and SGE counts bound the per-connection rings, which
// are allocated at connect time; inline bounds the per-slot copy buffer.
constexpr std::uint32_t max_depth = 16384;
constexpr std::uint32_t max_sge = 32;
constexpr std::uint32_t max_inline = 4096;
constexpr std::uint32_t max_rd_atomic = 128;

class tcp_region final : public memory_region
{
public:
    tcp_region(std::shared_ptr<tcp_domain> dom, region_state* st, std::byte* data, std::size_t size,
               rdmx::access acc, std::uint64_t key, rdmx::memory_type type, int device) noexcept
        : memory_region(dom->owner(), dom->backend(), data, size, acc, 0, key, type, device),
          dom_(std::move(dom)), st_(st), tag_(st->tag.load())
    {
    }
    ~tcp_region() override { dom_->deregister(st_); }

    region_state* state() const noexcept { return st_; }
    std::uint64_t tag() const noexcept { return tag_; }

private:
    std::shared_ptr<tcp_domain> dom_; ///< its region pool holds st_
    region_state* st_;
    std::uint64_t tag_;
};

class tcp_window final : public memory_window
{
public:
    tcp_window(std::shared_ptr<tcp_domain> dom, window_state* st) noexcept
        : memory_window(dom->owner(), dom->backend()), dom_(std::move(dom)), st_(st)
    {
    }
    ~tcp_window() override { dom_->free_window(st_); }

    window_state* state() const noexcept { return st_; }
    void set_remote(const remote_buffer& rb) noexcept { remote_ = rb; }

private:
    std::shared_ptr<tcp_domain> dom_; ///< its window pool holds st_
    window_state* st_;
};

/// 0, or the errno of getrandom.
int try_random_key(std::uint64_t& k) noexcept
{
    for (;;) {
        ssize_t n = ::getrandom(&k, sizeof k, 0);
        if (n == static_cast<ssize_t>(sizeof k))
            return 0;
        if (n < 0 && errno != EINTR)
            return errno;
    }
}

std::uint64_t random_key()
{
    std::uint64_t k = 0;
    if (int err = try_random_key(k))
        throw_errno(err, "getrandom");
    return k;
}

} // namespace

seg region_seg(const memory_region& mr, std::size_t offset, std::size_t length) noexcept
{
    // validate.hpp checked that the region belongs to this domain, so it is a tcp_region.
    const auto& r = static_cast<const tcp_region&>(mr);
    return {r.state(), r.tag(), r.data() + offset, length};
}

std::span<const std::byte> encode_handshake(handshake_type type, std::uint32_t max_rd_atomic,
                                            std::span<const std::byte> private_data,
                                            std::span<std::byte, handshake::reply_size> out,
                                            std::string_view verb, bool ring)
{
    using detail::private_data_use;
    detail::check_private_data(type == handshake_type::hello    ? private_data_use::connect
                               : type == handshake_type::accept ? private_data_use::accept
                                                                : private_data_use::reject,
                               private_data, verb);
    handshake h;
    h.type = type;
    h.max_rd_atomic = max_rd_atomic;
    h.private_data_len = static_cast<std::uint8_t>(private_data.size());
    if (type != handshake_type::reject)
        h.flags = handshake_flag_goodbye; // this side always says goodbye (docs/wire-format.md)
    if (ring && type != handshake_type::reject)
        h.flags |= handshake_flag_ring; // HELLO: can take rings; ACCEPT: a memfd comes with it
    std::copy(private_data.begin(), private_data.end(), h.private_data.begin());
    h.encode(out.data());
    return out.first(h.wire_size());
}

tcp_domain::tcp_domain(rdmx::backend b, bool local_peers)
    : backend_(b), local_peers_(local_peers && b == backend::tcp), discard_(64 * 1024),
      work_(asio::make_work_guard(io_))
{
    limits_.device_name = to_string(b);
    limits_.max_qp_wr = max_depth;
    limits_.max_sge = max_sge;
    limits_.max_sge_rd = max_sge;
    limits_.max_inline = max_inline;
    limits_.max_qp_rd_atom = max_rd_atomic;
    limits_.max_qp_init_rd_atom = max_rd_atomic;
    limits_.max_mr_size = UINT64_MAX;
    limits_.max_msg_size = static_cast<std::uint32_t>(detail::max_message_size);
    if (const char* f = std::getenv("RDMX_TCP_FORCE_STAGING");
        f && (!std::strcmp(f, "1") || !std::strcmp(f, "2"))) {
        force_staging_ = true;
        if (f[0] == '2')
            bounce_.defer_host_copies(); // copies land only when waited for, as a GPU's may
    }
    engine_ = std::thread([this] {
        // Handlers are noexcept in spirit; an exception escaping one would be a bug, and
        // losing the engine silently would be worse than reporting it.
        try {
            io_.run();
        } catch (const std::exception& e) {
            RDMX_LOG(error, "tcp engine stopped: %s", e.what());
        }
    });
}

tcp_domain::~tcp_domain()
{
    // The last object made here is gone, but connections destroyed before it may still
    // owe their peers read responses, a NAK, the FIN: let the engine finish them, each
    // within its own linger bound (the slack covers the time its linger took to start).
    {
        std::unique_lock lk(linger_mu_);
        linger_cv_.wait_for(lk, linger_bound_ + std::chrono::milliseconds(500),
                            [this] { return lingering_ == 0; });
    }
    work_.reset();
    io_.stop();
    engine_.join();
}

std::unique_ptr<memory_region> tcp_domain::register_placed(void* addr, std::size_t length,
                                                           rdmx::access rights, rdmx::memory_type type,
                                                           int device)
{
    return register_region(addr, length, rights, type, device, nullptr);
}

std::unique_ptr<memory_region> tcp_domain::register_allocated(detail::shared_memory& mem, rdmx::access rights)
{
    // Peers on this host reach it by mapping the memfd where this domain serves them (shm://,
    // or auto:// with local peers) and the descriptor fits in the key.
    const bool share = (backend_ == backend::shm || local_peers_) && mem.fd() >= 0 &&
                       static_cast<std::uint64_t>(mem.fd()) <= shared_key_fd_mask;
    return register_region(mem.data(), mem.size(), rights, memory_type::host, -1, share ? &mem : nullptr);
}

std::unique_ptr<memory_region> tcp_domain::register_region(void* addr, std::size_t length,
                                                           rdmx::access rights, rdmx::memory_type type,
                                                           int device, detail::shared_memory* shared)
{
    // The engine reads and writes registered memory with the CPU (recv, send, memcpy);
    // device memory it reaches through host chunks and the driver's copies (staging). An
    // atomic there could not be atomic: the target would read, change and write the value
    // in three copies, racing the GPU and any other copy.
    if (type == memory_type::cuda && any(rights & access::remote_atomic))
        throw_error(errc::not_supported,
                    "register_memory: remote_atomic on CUDA device memory (device " + std::to_string(device) +
                        "): the TCP backend serves atomics with the CPU, which cannot make them atomic "
                        "on device memory");
    const staging stage = type == memory_type::cuda ? staging::cuda
                          : force_staging_          ? staging::host
                                                    : staging::none;
    if (addr == nullptr && length != 0)
        throw_error(errc::invalid_argument, "register_memory: null address");
    auto a = reinterpret_cast<std::uintptr_t>(addr);
    if (a + length < a)
        throw_error(errc::invalid_argument, "register_memory: range wraps around");
    // remote_write and remote_atomic imply local_write, as on verbs.
    if (any(rights & (access::remote_write | access::remote_atomic)))
        rights = rights | access::local_write;
    if (stage != staging::none)
        bounce_.prepare(stage, device);
    std::lock_guard lk(regions_mu_);
    std::uint64_t key;
    // The key of a region peers may map names its memfd (tcp_shared_map.hpp); no other key
    // has shared_key_bit, so a peer tries to map only those.
    do {
        key = random_key() & ~shared_key_bit;
        if (shared)
            key = (key & ~shared_key_fd_mask) | shared_key_bit | static_cast<std::uint64_t>(shared->fd());
    } while (key == 0 || keys_.count(key) != 0);
    region_state* st;
    if (!free_regions_.empty()) {
        st = free_regions_.back();
        free_regions_.pop_back();
    } else {
        st = &region_pool_.emplace_back();
    }
    st->base = static_cast<std::byte*>(addr);
    st->size = length;
    st->rights = rights;
    st->key = key;
    st->stage = stage;
    st->device = device;
    st->tag.store((((st->tag.load() >> 1) + 1) << 1) | 1);
    try {
        // Buckets for every region and window at once: a bind never rehashes.
        keys_.reserve(key_slots_ + 1);
        keys_.emplace(key, key_entry{st, nullptr});
        auto r = std::make_unique<tcp_region>(shared_from_this(), st, static_cast<std::byte*>(addr), length,
                                              rights, key, type, device);
        ++key_slots_;
        if (shared)
            shared->publish(key, static_cast<std::uint64_t>(rights));
        if (stage == staging::cuda)
            RDMX_LOG(info,
                     "register_memory: %zu bytes of CUDA device %d memory at %p registered on tcp, staged "
                     "through host chunks of %zu bytes (cuMemcpy on every transfer)",
                     length, device, addr, bounce_.chunk_size());
        return r;
    } catch (...) {
        keys_.erase(key);
        st->tag.store(st->tag.load() & ~std::uint64_t{1});
        free_regions_.push_back(st);
        throw;
    }
}

std::unique_ptr<memory_window> tcp_domain::allocate_window()
{
    std::lock_guard lk(regions_mu_);
    window_state* w;
    if (!free_windows_.empty()) {
        w = free_windows_.back();
        free_windows_.pop_back();
    } else {
        w = &window_pool_.emplace_back();
    }
    try {
        // The window's table entry, made now and kept out of the table until a bind: key
        // 0 is never a key in use, so it is free for the moment the node is made.
        if (w->node.empty()) {
            keys_.emplace(0, key_entry{nullptr, w});
            w->node = keys_.extract(0);
        }
        keys_.reserve(key_slots_ + 1);
        free_windows_.reserve(window_pool_.size()); // free_window() never allocates
        key_table::node_type node = std::move(w->node);
        *w = window_state{};
        w->node = std::move(node);
        auto mw = std::make_unique<tcp_window>(shared_from_this(), w);
        ++key_slots_;
        return mw;
    } catch (...) {
        free_windows_.push_back(w);
        throw;
    }
}

void tcp_domain::deregister(region_state* st) noexcept
{
    std::uint64_t tag;
    {
        std::lock_guard lk(regions_mu_);
        keys_.erase(st->key);
        tag = st->tag.load();
        st->tag.store(tag & ~std::uint64_t{1});
    }
    // From here on no frame that needs these bytes can start (its pin fails). One that
    // had started has its rest copied into memory of its engine while the region's memory
    // is still the caller's, so that it finishes with the region's real bytes: its header
    // promised them, and the peer would otherwise take whatever came instead for data.
    // A pump that pinned the region before the store above holds its engine's mutex until
    // the frame it left partly sent is recorded, so copy_frame_on_wire sees that frame.
    {
        std::lock_guard lk(engines_mu_);
        for (auto& w : engines_)
            if (auto e = w.lock())
                e->copy_frame_on_wire(st, tag);
    }
    // Socket calls that pinned the region before the store above are short and never
    // block: wait for them, so that no byte is touched once we return.
    while (st->users.load() != 0)
        std::this_thread::yield();
    std::lock_guard lk(regions_mu_);
    free_regions_.push_back(st);
    --key_slots_;
}

void tcp_domain::linger_begin(std::chrono::steady_clock::duration bound) noexcept
{
    std::lock_guard lk(linger_mu_);
    ++lingering_;
    linger_bound_ = std::max(linger_bound_, bound);
}

void tcp_domain::linger_end() noexcept
{
    std::lock_guard lk(linger_mu_);
    if (--lingering_ == 0)
        linger_cv_.notify_all();
}

void tcp_domain::track(std::weak_ptr<connection_engine> engine)
{
    std::lock_guard lk(engines_mu_);
    if (engines_.size() == engines_.capacity())
        std::erase_if(engines_, [](const auto& w) { return w.expired(); });
    engines_.push_back(std::move(engine));
}

bool tcp_domain::find_remote(std::uint64_t key, std::uint64_t addr, std::uint64_t len, rdmx::access right,
                             seg& out, std::uint64_t via) noexcept
{
    std::lock_guard lk(regions_mu_);
    auto it = keys_.find(key);
    if (it == keys_.end())
        return false;
    if (window_state* w = it->second.window) {
        // A window: its connection, its rights, its range, and its region still registered
        // (a deregistration clears the live tag under this mutex; a reused slot has another).
        if (w->via != via || !any(w->rights & right) || w->region->tag.load() != w->region_tag)
            return false;
        if (addr < w->base || addr - w->base > w->length || len > w->length - (addr - w->base))
            return false;
        region_state* st = w->region;
        out = {st, w->region_tag, st->base + (addr - reinterpret_cast<std::uintptr_t>(st->base)), len};
        return true;
    }
    region_state* st = it->second.region;
    if (!any(st->rights & right))
        return false;
    auto base = reinterpret_cast<std::uintptr_t>(st->base);
    // Overflow-safe containment of [addr, addr + len) in [base, base + size).
    if (addr < base || addr - base > st->size || len > st->size - (addr - base))
        return false;
    out = {st, st->tag.load(), st->base + (addr - base), len};
    return true;
}

std::error_code tcp_domain::bind_window(memory_window& window, const memory_region& region,
                                        std::uint64_t offset, std::uint64_t length, rdmx::access rights,
                                        std::uint64_t via) noexcept
{
    // validate.hpp checked both belong to this domain: they are a tcp_window and a tcp_region.
    auto& w = static_cast<tcp_window&>(window);
    const auto& r = static_cast<const tcp_region&>(region);
    window_state* ws = w.state();
    std::uint64_t key = 0;
    std::lock_guard lk(regions_mu_);
    // A bound window must be invalidated before it is bound again (IBTA o10-37.2.30; verbs
    // refuses it too: rxe would fail the QP). One whose region was destroyed is free.
    if (ws->live())
        return make_error_code(errc::invalid_argument);
    do {
        if (int err = try_random_key(key))
            return {err, std::system_category()};
        key &= ~shared_key_bit; // a window's key is never one that peers may map
    } while (key == 0 || keys_.count(key) != 0);
    if (ws->bound) // its region is gone: the old key leaves the table now
        ws->node = keys_.extract(ws->key);
    ws->region = r.state();
    ws->region_tag = r.tag();
    ws->base = reinterpret_cast<std::uintptr_t>(r.data()) + offset;
    ws->length = length;
    ws->rights = rights;
    ws->key = key;
    ws->via = via;
    ws->node.key() = key;
    ws->node.mapped() = key_entry{nullptr, ws};
    // No allocation: the node is the window's own, and keys_ has buckets for key_slots_.
    keys_.insert(std::move(ws->node));
    ws->bound = true;
    w.set_remote({.addr = ws->base, .length = length, .key = key, .backend = backend_});
    return {};
}

std::error_code tcp_domain::invalidate_window(memory_window& window) noexcept
{
    window_state* ws = static_cast<tcp_window&>(window).state();
    std::lock_guard lk(regions_mu_);
    // Only a bound window can be invalidated, as on verbs (where rxe 6.1 crashes on a free
    // one); a window whose region was destroyed is free.
    const bool live = ws->live();
    if (ws->bound) {
        ws->node = keys_.extract(ws->key);
        ws->bound = false;
    }
    return live ? std::error_code{} : make_error_code(errc::invalid_argument);
}

bool tcp_domain::window_state_allows(const memory_window& window, bool bind) noexcept
{
    const window_state* ws = static_cast<const tcp_window&>(window).state();
    std::lock_guard lk(regions_mu_);
    const bool live = ws->live();
    return live != bind;
}

bool tcp_domain::invalidate_remote(std::uint64_t key, std::uint64_t via) noexcept
{
    std::lock_guard lk(regions_mu_);
    auto it = keys_.find(key);
    if (it == keys_.end() || it->second.window == nullptr || it->second.window->via != via)
        return false;
    window_state* ws = it->second.window;
    ws->node = keys_.extract(it);
    ws->bound = false;
    return true;
}

void tcp_domain::release_windows_of(std::uint64_t via) noexcept
{
    std::lock_guard lk(regions_mu_);
    for (auto it = keys_.begin(); it != keys_.end();) {
        window_state* ws = it->second.window;
        auto here = it++;
        if (ws && ws->via == via) {
            ws->node = keys_.extract(here);
            ws->bound = false;
        }
    }
}

void tcp_domain::free_window(window_state* ws) noexcept
{
    std::lock_guard lk(regions_mu_);
    if (ws->bound) {
        ws->node = keys_.extract(ws->key);
        ws->bound = false;
    }
    // The node stays with the state for the next window allocated from the pool.
    ws->via = 0;
    ws->region = nullptr;
    free_windows_.push_back(ws);
    --key_slots_;
}

std::unique_ptr<listener> tcp_domain::listen(std::string_view address, const listen_options& opts)
{
    return make_listener(shared_from_this(), address, opts.backlog);
}

tcp_domain::client_start tcp_domain::begin_client(const char* verb, std::string_view address,
                                                  const connection_options& opts,
                                                  std::span<const std::byte> private_data,
                                                  std::span<std::byte, handshake::reply_size> buf)
{
    uri u = uri::parse(address);
    std::string what = verb + (" " + std::string(address));
    detail::check_scheme(u, backend_, what);
    tcp_srq::of(opts, *this, what);
    connection_limits lim = detail::clamp_limits(opts, limits_);
    detail::cq_reservation shared(opts, lim, backend_, verb);
    // Rings are offered wherever this client may dial a UNIX socket (shm://, and auto://
    // to a listener on this host); a listener grants them on UNIX sockets only.
    const bool ring = (backend_ == backend::shm || local_peers_) && byte_ring_pair::enabled();
    auto hello = encode_handshake(handshake_type::hello, lim.max_rd_atomic, private_data, buf, what, ring);
    return {std::move(u), std::move(what), lim, std::move(shared), hello};
}

std::unique_ptr<tcp_connection> tcp_domain::dial(const char* verb, std::string_view address,
                                                 const connection_options& opts,
                                                 std::span<const std::byte> private_data,
                                                 std::span<const recv_request> initial_recvs, bool started)
{
    std::byte buf[handshake::reply_size];
    auto [u, what, lim, shared, hello] = begin_client(verb, address, opts, private_data, buf);
    // The name resolves here (a numeric address at once); the engine tries the addresses
    // in turn, its connect() and handshake all non-blocking (tcp_handshake.cpp).
    auto addrs = resolve(u, false, what);
    // auto:// on a domain that auto:// chose: a listener on this host is reached through
    // the UNIX socket it opens beside its TCP one (the one bound to exactly this address,
    // then a wildcard one's), and TCP only where there is none.
    bool local_first = false;
    if (local_peers_ && u.scheme == scheme::automatic) {
        std::vector<socket_address> local;
        for (const socket_address& t : addrs)
            if (detail::is_local_address(t)) {
                local.push_back(detail::auto_local_address(t.addr));
                local.push_back(detail::auto_local_wildcard(t.addr));
            }
        local_first = !local.empty();
        addrs.insert(addrs.begin(), local.begin(), local.end());
    }
    const socket_address& a = addrs.front();
    unique_fd fd(::socket(a.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd)
        throw_errno(errno, "socket");
    set_socket_options(fd.get());
    set_congestion_control(fd.get(), opts.tcp.congestion); // before the peer hears of us
    int err = 0;
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) < 0 && errno != EINPROGRESS)
        err = errno;
    // The peer's read depth comes with its reply (start_client sets it).
    auto conn =
        prepare_connection(*this, std::move(fd), lim, opts, 1, {}, std::move(shared), initial_recvs, started);
    addrs.erase(addrs.begin());
    conn->engine().start_client(hello, clock::now() + opts.timeout, err,
                                {.addrs = std::move(addrs),
                                 .congestion = opts.tcp.congestion,
                                 .local_first = local_first,
                                 .what = local_first ? what : std::string(),
                                 .local_error = 0});
    return conn;
}

std::unique_ptr<connection> tcp_domain::start_connect(std::string_view address,
                                                      const connection_options& opts,
                                                      std::span<const std::byte> private_data,
                                                      std::span<const recv_request> initial_recvs)
{
    return dial("start_connect", address, opts, private_data, initial_recvs, true);
}

std::shared_ptr<shared_receive_queue>
tcp_domain::create_shared_receive_queue(const shared_receive_queue_options& opts)
{
    return std::make_shared<tcp_srq>(shared_from_this(), opts);
}

std::shared_ptr<completion_queue> tcp_domain::create_completion_queue(const completion_queue_options& opts)
{
    return std::make_shared<tcp_completion_queue>(opts.depth, progress_, backend_);
}

std::unique_ptr<connection> tcp_domain::connect(std::string_view address, const connection_options& opts,
                                                std::span<const std::byte> private_data,
                                                std::span<const recv_request> initial_recvs)
{
    // start_connect's flow, waited for: the engine's timer ends the handshake at
    // opts.timeout, the bound here only guards against an io thread that stopped.
    auto conn = dial("connect", address, opts, private_data, initial_recvs, false);
    conn->engine().await_handshake("connect", address, clock::now() + opts.timeout + std::chrono::seconds(1));
    return conn;
}

} // namespace tcp

std::shared_ptr<domain> detail::open_tcp_domain(backend b, bool local_peers)
{
    return std::make_shared<tcp::tcp_domain>(b, local_peers);
}

} // namespace rdmx
