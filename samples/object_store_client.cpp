// object_store_client: PUTs and GETs objects of 4 KiB .. 1 MiB and checks every byte (the
// protocol is in object_store.hpp; the server in object_store_server.cpp).
//
//   object_store_client tcp://127.0.0.1:7480 --id 3 --objects 8 --rounds 2
//   object_store_client tcp://127.0.0.1:7480 --id 3 --objects 8 --verify-version 1
//   object_store_client tcp://127.0.0.1:7480 --shutdown
//
// Client `id` owns the keys id << 32 | j for j < --objects; each key has its own size, and
// round r PUTs version r of its contents (object_store::fill), so a GET that returns a
// stale, misplaced or partial object fails the check.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
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
        opts.send_queue_depth = 4;
        opts.recv_queue_depth = 4;
        conn_ = dom_->connect(address, opts);
        in_mr_ = dom_->register_memory(inbox_.data(), inbox_.size(), rdmx::access::local_write);
        out_mr_ = dom_->register_memory(outbox_.data(), outbox_.size(), rdmx::access::none);
        // The server reads PUTs out of this buffer and writes GETs into it.
        data_mr_ = dom_->register_memory(data_.data(), data_.size(),
                                         rdmx::access::remote_read | rdmx::access::remote_write);
        waiter_.emplace(*conn_, timeout);
    }

    void put(std::uint64_t key, std::uint64_t version)
    {
        std::size_t size = os::object_size(key);
        os::fill(std::span(data_).first(size), key, version);
        os::reply r = call(
            {.op = os::op::put, .key = key, .size = size, .buffer = data_mr_->remote(0, size).serialize()});
        if (r.status != os::status::ok)
            throw std::runtime_error("PUT " + hex(key) + ": " + os::to_string(r.status));
        bytes_ += size;
    }

    /// GETs key and checks it against version `version`; a missing key returns false.
    bool get(std::uint64_t key, std::uint64_t version)
    {
        std::size_t size = os::object_size(key);
        std::memset(data_.data(), 0xee, data_.size()); // what a partial write would leave
        os::reply r = call({.op = os::op::get, .key = key, .buffer = data_mr_->remote().serialize()});
        if (r.status == os::status::not_found)
            return false;
        if (r.status != os::status::ok)
            throw std::runtime_error("GET " + hex(key) + ": " + os::to_string(r.status));
        if (r.size != size)
            throw std::runtime_error("GET " + hex(key) + ": " + std::to_string(r.size) + " bytes, expected " +
                                     std::to_string(size));
        std::vector<std::byte> expect(size);
        os::fill(expect, key, version);
        for (std::size_t i = 0; i < size; ++i)
            if (data_[i] != expect[i])
                throw std::runtime_error("GET " + hex(key) + " version " + std::to_string(version) +
                                         ": byte " + std::to_string(i) + " of " + std::to_string(size) +
                                         " is wrong");
        if (size < data_.size() && data_[size] != std::byte{0xee})
            throw std::runtime_error("GET " + hex(key) + ": the server wrote past the object");
        bytes_ += size;
        return true;
    }

    os::counters shutdown()
    {
        os::reply r = call({.op = os::op::shutdown});
        if (r.status != os::status::ok)
            throw std::runtime_error(std::string("SHUTDOWN: ") + os::to_string(r.status));
        return r.stats;
    }

    std::uint64_t bytes() const noexcept { return bytes_; }
    void disconnect() { conn_->disconnect(); }

private:
    /// One RPC: post the receive for the reply before sending, so that it is there first.
    os::reply call(const os::request& req)
    {
        rdmx::sge in{in_mr_.get(), 0, os::message_size};
        if (auto ec = conn_->post_recv({&in, 1}, 1))
            throw rdmx::error(ec, "post_recv");
        std::memcpy(outbox_.data(), &req, sizeof req);
        rdmx::sge out{out_mr_.get(), 0, sizeof req};
        if (auto ec = conn_->post_send({&out, 1}, 2))
            throw rdmx::error(ec, "post_send");
        waiter_->wait(2, "send request");
        auto wc = waiter_->wait(1, "receive reply");
        os::reply r;
        std::memcpy(&r, inbox_.data(), sizeof r);
        if (wc.byte_len != sizeof r || r.magic != os::magic)
            throw std::runtime_error("malformed reply");
        return r;
    }

    static std::string hex(std::uint64_t key)
    {
        char buf[24];
        std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(key));
        return buf;
    }

    std::unique_ptr<rdmx::domain> dom_;
    std::vector<std::byte> inbox_, outbox_, data_;
    std::unique_ptr<rdmx::memory_region> in_mr_, out_mr_, data_mr_;
    std::unique_ptr<rdmx::connection> conn_; // after the regions: destroyed before them
    std::optional<sample::completion_waiter> waiter_;
    std::uint64_t bytes_ = 0;
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
    app.add_option("address", address, "server address: rdma://IP:PORT, tcp://IP:PORT or auto://IP:PORT")
        ->required();
    app.add_option("--id", id, "this client's key space (keys id << 32 | 0 .. objects - 1)")
        ->capture_default_str();
    app.add_option("--objects", objects, "objects per round")->capture_default_str();
    app.add_option("--rounds", rounds, "rounds of PUT + GET of every object (0: until killed)")
        ->capture_default_str();
    app.add_option("--verify-version", verify_version,
                   "only GET the objects and check they hold this version (what round N-1 PUT)");
    app.add_flag("--shutdown", shutdown, "ask the server to exit and print its counters");
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
        std::printf("object_store_client %u: done, %llu bytes moved and verified\n", id,
                    static_cast<unsigned long long>(c.bytes()));
        c.disconnect();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "object_store_client %u: %s\n", id, e.what());
        return 1;
    }
    return 0;
}
