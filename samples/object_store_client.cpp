// object_store_client: PUTs and GETs objects of 4 KiB .. 1 MiB and checks every byte (the
// protocol is in object_store.hpp; the server in object_store_server.cpp).
//
//   object_store_client tcp://127.0.0.1:7480 --id 3 --objects 8 --rounds 2
//   object_store_client tcp://127.0.0.1:7480 --id 3 --objects 8 --verify-version 1
//   object_store_client tcp://127.0.0.1:7480 --shutdown
//
//   object_store_client tcp://127.0.0.1:7480 --create-shared
//   object_store_client tcp://127.0.0.1:7480 --id 4 --increment 25
//
// Client `id` owns the keys id << 32 | j for j < --objects; each key has its own size, and
// round r PUTs version r of its contents (object_store::fill), so a GET that returns a
// stale, misplaced or partial object fails the check. --increment races other clients on
// one shared key (key 0): each increment GETs it, claims the next version by
// compare-and-swap of the key's version word at the server, and PUTs it; a lost race
// starts over. With N clients incrementing K times the key ends at version N * K.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <rdmx/rdmx.hpp>

#include "object_store.hpp"
#include "sample_common.hpp"

namespace os = object_store;

namespace
{

class store_client
{
public:
    store_client(const std::string& address, std::chrono::milliseconds timeout)
        : dom_(rdmx::domain::open(address)), inbox_(os::message_size), outbox_(os::message_size),
          data_(os::max_object)
    {
        rdmx::connection_options opts;
        opts.timeout = timeout;
        opts.send_queue_depth = 8;
        opts.recv_queue_depth = 4;
        conn_ = dom_->connect(address, opts);
        in_mr_ = dom_->register_memory(inbox_.data(), inbox_.size(), rdmx::access::local_write);
        out_mr_ = dom_->register_memory(outbox_.data(), outbox_.size(), rdmx::access::none);
        old_mr_ = dom_->register_memory(&old_, sizeof old_, rdmx::access::local_write);
        // The server reads PUTs out of this buffer and writes GETs into it: through a window
        // per request where the device has them, so that it can touch nothing else.
        windows_ = dom_->limits().memory_windows;
        auto rights = rdmx::access::remote_read | rdmx::access::remote_write;
        data_mr_ = dom_->register_memory(data_.data(), data_.size(),
                                         windows_ ? rights | rdmx::access::bind_window : rights);
        if (windows_)
            window_ = dom_->allocate_window();
        waiter_.emplace(*conn_, timeout);
    }

    /// PUTs version `version` of key's object. Version 0 creates the key; a later version
    /// is claimed first by a compare-and-swap of the key's version word from version - 1.
    void put(std::uint64_t key, std::uint64_t version)
    {
        if (version > 0 && !claim(key, version - 1))
            throw std::runtime_error("PUT " + hex(key) + " version " + std::to_string(version) +
                                     ": another writer holds the key");
        store(key, version);
    }

    /// GETs key and checks it against `version` (any version when nullopt); a missing key
    /// returns nullopt, otherwise the version it holds.
    std::optional<std::uint64_t> get(std::uint64_t key, std::optional<std::uint64_t> version)
    {
        std::size_t size = os::object_size(key);
        std::memset(data_.data(), 0xee, data_.size()); // what a partial write would leave
        os::reply r = call({.op = os::op::get, .key = key}, 0, data_.size(), rdmx::access::remote_write);
        if (r.status == os::status::not_found)
            return std::nullopt;
        if (r.status != os::status::ok)
            throw std::runtime_error("GET " + hex(key) + ": " + os::to_string(r.status));
        if (r.size != size)
            throw std::runtime_error("GET " + hex(key) + ": " + std::to_string(r.size) + " bytes, expected " +
                                     std::to_string(size));
        if (version && r.version != *version)
            throw std::runtime_error("GET " + hex(key) + ": version " + std::to_string(r.version) +
                                     ", expected " + std::to_string(*version));
        std::vector<std::byte> expect(size);
        os::fill(expect, key, r.version);
        for (std::size_t i = 0; i < size; ++i)
            if (data_[i] != expect[i])
                throw std::runtime_error("GET " + hex(key) + " version " + std::to_string(r.version) +
                                         ": byte " + std::to_string(i) + " of " + std::to_string(size) +
                                         " is wrong");
        if (size < data_.size() && data_[size] != std::byte{0xee})
            throw std::runtime_error("GET " + hex(key) + ": the server wrote past the object");
        bytes_ += size;
        return r.version;
    }

    /// Adds one version to a key that other clients update too: GET it (any version v),
    /// claim v + 1 by compare-and-swap, PUT it; a lost race starts over. Returns the races
    /// lost before this one succeeded.
    std::uint64_t increment(std::uint64_t key)
    {
        for (std::uint64_t lost = 0;; ++lost) {
            auto v = get(key, std::nullopt);
            if (!v)
                throw std::runtime_error("increment " + hex(key) + ": not found");
            if (!claim(key, *v))
                continue;
            store(key, *v + 1);
            return lost;
        }
    }

    os::counters shutdown()
    {
        os::reply r = call({.op = os::op::shutdown}, 0, 0, rdmx::access::none);
        if (r.status != os::status::ok)
            throw std::runtime_error(std::string("SHUTDOWN: ") + os::to_string(r.status));
        return r.stats;
    }

    std::uint64_t bytes() const noexcept { return bytes_; }
    bool windows() const noexcept { return windows_; }
    void disconnect() { conn_->disconnect(); }

private:
    void store(std::uint64_t key, std::uint64_t version)
    {
        std::size_t size = os::object_size(key);
        os::fill(std::span(data_).first(size), key, version);
        os::reply r = call({.op = os::op::put, .key = key, .size = size, .version = version}, 0, size,
                           rdmx::access::remote_read);
        if (r.status != os::status::ok)
            throw std::runtime_error("PUT " + hex(key) + " version " + std::to_string(version) + ": " +
                                     os::to_string(r.status));
        bytes_ += size;
    }

    /// Compare-and-swap of key's version word (at the server) from `from` to from + 1:
    /// true if this client got the update. The word's descriptor came with the last reply
    /// about the key.
    bool claim(std::uint64_t key, std::uint64_t from)
    {
        auto it = words_.find(key);
        if (it == words_.end())
            throw std::runtime_error("PUT " + hex(key) + ": no version word known (GET or PUT it first)");
        rdmx::sge s{old_mr_.get(), 0, sizeof old_};
        if (auto ec = conn_->post_compare_swap(s, it->second, from, from + 1, wr_cas))
            throw rdmx::error(ec, "post_compare_swap");
        waiter_->wait(wr_cas, "compare-and-swap of the version word");
        return old_ == from;
    }

    /// One RPC: the receive for the reply goes up before the request is sent, so that it is
    /// there first. The server may touch [offset, offset + len) of the data buffer with
    /// `rights`: through a window bound for this request alone, which the reply revokes.
    os::reply call(os::request req, std::size_t offset, std::size_t len, rdmx::access rights)
    {
        rdmx::sge in{in_mr_.get(), 0, os::message_size};
        if (auto ec = conn_->post_recv({&in, 1}, wr_reply))
            throw rdmx::error(ec, "post_recv");
        if (len && windows_) {
            // Unsignalled: posts on one connection are ordered, so the window is bound
            // before the request arrives (an error still completes and fails the wait).
            if (auto ec = conn_->post_bind_window(*window_, *data_mr_, offset, len, rights, wr_bind,
                                                  rdmx::send_flags::none))
                throw rdmx::error(ec, "post_bind_window");
            req.buffer = window_->remote().serialize();
            req.flags |= os::buffer_is_window;
        } else if (len)
            req.buffer = data_mr_->remote(offset, len).serialize();
        std::memcpy(outbox_.data(), &req, sizeof req);
        rdmx::sge out{out_mr_.get(), 0, sizeof req};
        if (auto ec = conn_->post_send({&out, 1}, wr_request))
            throw rdmx::error(ec, "post_send");
        waiter_->wait(wr_request, "send request");
        auto wc = waiter_->wait(wr_reply, "receive reply");
        os::reply r;
        std::memcpy(&r, inbox_.data(), sizeof r);
        if (wc.byte_len != sizeof r || r.magic != os::magic)
            throw std::runtime_error("malformed reply");
        if (req.flags & os::buffer_is_window) {
            // The server revoked the window with its reply; had it not, the client must.
            if (!wc.with_invalidate || wc.invalidated_key != window_->remote().key)
                throw std::runtime_error("the reply did not revoke the request's window");
            ++revoked_;
        }
        if (auto w = rdmx::remote_buffer::parse(r.version_word); w && r.status == os::status::ok)
            words_[req.key] = *w;
        return r;
    }

    static std::string hex(std::uint64_t key)
    {
        char buf[24];
        std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(key));
        return buf;
    }

    enum : std::uint64_t { wr_reply = 1, wr_request = 2, wr_bind = 3, wr_cas = 4 };

    std::unique_ptr<rdmx::domain> dom_;
    std::vector<std::byte> inbox_, outbox_, data_;
    alignas(8) std::uint64_t old_ = 0; ///< a compare-and-swap's old value
    bool windows_ = false;
    std::unique_ptr<rdmx::memory_region> in_mr_, out_mr_, old_mr_, data_mr_;
    std::unique_ptr<rdmx::memory_window> window_;
    std::unique_ptr<rdmx::connection> conn_; // after the regions: destroyed before them
    std::optional<sample::completion_waiter> waiter_;
    std::unordered_map<std::uint64_t, rdmx::remote_buffer> words_; ///< key -> its version word
    std::uint64_t bytes_ = 0;
    std::uint64_t revoked_ = 0;
};

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"rdmx object store client: PUT and GET objects, verify every byte"};
    std::string address;
    std::uint32_t id = 1;
    std::uint32_t objects = 8;
    std::uint32_t rounds = 2;
    long long verify_version = -1;
    bool shutdown = false;
    int timeout_ms = 20000;
    app.add_option("address", address,
                   "server address: rdma://IP:PORT, tcp://IP:PORT, shm://NAME:PORT or auto://IP:PORT")
        ->required();
    app.add_option("--id", id, "this client's key space (keys id << 32 | 0 .. objects - 1)")
        ->capture_default_str();
    app.add_option("--objects", objects, "objects per round")->capture_default_str();
    app.add_option("--rounds", rounds, "rounds of PUT + GET of every object (0: until killed)")
        ->capture_default_str();
    app.add_option("--verify-version", verify_version,
                   "only GET the objects and check they hold this version (what round N-1 PUT)");
    app.add_flag("--shutdown", shutdown, "ask the server to exit and print its counters");
    std::uint32_t increments = 0;
    bool create_shared = false;
    app.add_flag("--create-shared", create_shared, "PUT version 0 of the shared key (id 0, object 0)");
    app.add_option("--increment", increments,
                   "add this many versions to the shared key, racing other clients (compare-and-swap)");
    app.add_option("-t,--timeout-ms", timeout_ms, "bound on connecting and on every wait")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    const std::uint64_t base = std::uint64_t{id} << 32;
    try {
        store_client c(address, std::chrono::milliseconds(timeout_ms));
        if (shutdown) {
            auto st = c.shutdown();
            std::printf(
                "object_store_client: server counters: accepted %llu, closed %llu, lost %llu, puts %llu, "
                "gets %llu, failed operations %llu\n",
                static_cast<unsigned long long>(st.accepted), static_cast<unsigned long long>(st.closed),
                static_cast<unsigned long long>(st.lost), static_cast<unsigned long long>(st.puts),
                static_cast<unsigned long long>(st.gets), static_cast<unsigned long long>(st.failed));
            c.disconnect();
            return 0;
        }
        if (create_shared) {
            c.put(0, 0);
            std::printf("object_store_client %u: shared key created\n", id);
            c.disconnect();
            return 0;
        }
        if (increments > 0) {
            std::uint64_t lost = 0;
            for (std::uint32_t i = 0; i < increments; ++i)
                lost += c.increment(0);
            std::printf("object_store_client %u: incremented the shared key %u times, %llu races lost\n", id,
                        increments, static_cast<unsigned long long>(lost));
            c.disconnect();
            return 0;
        }
        if (verify_version >= 0) {
            for (std::uint32_t j = 0; j < objects; ++j)
                if (!c.get(base | j, static_cast<std::uint64_t>(verify_version)))
                    throw std::runtime_error("GET " + std::to_string(j) + ": not found");
            std::printf("object_store_client %u: verified %u objects of version %lld, %llu bytes\n", id,
                        objects, verify_version, static_cast<unsigned long long>(c.bytes()));
            c.disconnect();
            return 0;
        }
        if (c.get(base | 0xffffffffu, 0))
            throw std::runtime_error("GET of a key never PUT succeeded");
        for (std::uint32_t r = 0; rounds == 0 || r < rounds; ++r) {
            for (std::uint32_t j = 0; j < objects; ++j) {
                c.put(base | j, r);
                if (!c.get(base | j, r))
                    throw std::runtime_error("GET right after PUT: not found");
            }
            // Once more, all of them: no PUT disturbed another key's object.
            for (std::uint32_t j = 0; j < objects; ++j)
                if (!c.get(base | j, r))
                    throw std::runtime_error("GET: not found");
            std::printf("object_store_client %u: round %u: %u objects PUT and verified\n", id, r, objects);
            std::fflush(stdout);
        }
        std::printf("object_store_client %u: done, %llu bytes moved and verified (%s)\n", id,
                    static_cast<unsigned long long>(c.bytes()),
                    c.windows() ? "a window per request, revoked by the reply"
                                : "no memory windows: region keys");
        c.disconnect();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "object_store_client %u: %s\n", id, e.what());
        return 1;
    }
    return 0;
}
