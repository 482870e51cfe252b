// bulk_rpc_client: PUTs and GETs objects of 4 KiB .. 1 MiB through bulk_rpc_server and
// checks every byte (the protocol is in bulk_rpc.hpp). `--depth` RPCs are in flight at once,
// each with its own bulk buffer. No connection code: the server is an address in the
// endpoint's address vector.
//
//   bulk_rpc_client tcp://127.0.0.1:7490 --id 3 --objects 8 --rounds 2 [--depth 4]
//   bulk_rpc_client tcp://127.0.0.1:7490 --shutdown
//
// Client `id` owns the keys id << 32 | j for j < --objects; round r PUTs version r of each
// (object_store::fill), then GETs all of them back and compares.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

#include "bulk_rpc.hpp"
#include "object_store.hpp"

namespace br = bulk_rpc;

namespace
{

/// The endpoint's own address: the server's scheme and host, any port.
std::string own_address(const std::string& server)
{
    auto colon = server.rfind(':');
    if (colon == std::string::npos || server.find("://") == std::string::npos)
        throw std::runtime_error("address must be scheme://host:port: " + server);
    return server.substr(0, colon) + ":0";
}

std::string hex(std::uint64_t v)
{
    char b[24];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
    return b;
}

class client
{
public:
    client(const std::string& server, std::size_t depth, std::chrono::milliseconds timeout)
        : dom_(rdmx::domain::open(server)), msgs_(depth * 2 * br::message_size),
          bulk_(depth * object_store::max_object), ep_(rdmx::endpoint::open(*dom_, own_address(server))),
          timeout_(timeout), depth_(depth)
    {
        server_ = ep_->insert(server);
        msg_mr_ = dom_->register_memory(msgs_.data(), msgs_.size(), rdmx::access::local_write);
        // The server reads PUTs out of these buffers and writes GETs into them.
        bulk_mr_ = dom_->register_memory(bulk_.data(), bulk_.size(),
                                         rdmx::access::remote_read | rdmx::access::remote_write);
    }

    std::size_t depth() const { return depth_; }
    const std::string& address() const { return ep_->address(); }

    /// One batch of RPCs, call i using buffer i: PUT (version >= 0) or GET of each key.
    /// Returns the replies in order; throws if any RPC failed to complete in time.
    std::vector<br::reply> batch(br::procedure proc, const std::vector<std::uint64_t>& keys,
                                 std::uint64_t version)
    {
        std::size_t n = keys.size();
        std::vector<int> left(n, 2); // the send's completion and the reply's
        for (std::size_t i = 0; i < n; ++i) {
            std::size_t size = object_store::object_size(keys[i]);
            br::request req{.key = keys[i], .size = size, .reply_tag = ++seq_};
            std::byte* buf = bulk_.data() + i * object_store::max_object;
            if (proc == br::procedure::put) {
                object_store::fill({buf, size}, keys[i], version);
                req.bulk = bulk_mr_->remote(i * object_store::max_object, size).serialize();
            } else {
                std::memset(buf, 0, object_store::max_object);
                req.bulk =
                    bulk_mr_->remote(i * object_store::max_object, object_store::max_object).serialize();
            }
            std::memcpy(request_buf(i), &req, sizeof req);
            // The reply's receive first, directed at the server and this call's tag.
            rdmx::sge in{msg_mr_.get(), reply_offset(i), br::message_size};
            check(ep_->recv(server_, req.reply_tag, 0, {&in, 1}, 2 * i + 1), "recv (reply)");
            rdmx::sge out{msg_mr_.get(), request_offset(i), sizeof req};
            check(ep_->send(server_, br::rpc_tag | static_cast<std::uint64_t>(proc), {&out, 1}, 2 * i),
                  "send (request)");
        }
        std::size_t outstanding = 2 * n;
        auto deadline = std::chrono::steady_clock::now() + timeout_;
        rdmx::endpoint_completion wc[16];
        while (outstanding > 0) {
            if (std::chrono::steady_clock::now() > deadline)
                throw std::runtime_error("no reply within " + std::to_string(timeout_.count()) + " ms");
            std::size_t got = ep_->wait(wc, std::chrono::milliseconds(100));
            for (std::size_t k = 0; k < got; ++k) {
                if (wc[k].status)
                    throw std::runtime_error(std::string(rdmx::to_string(wc[k].op)) +
                                             " failed: " + wc[k].status.message());
                std::size_t i = wc[k].context / 2;
                if (i >= n || left[i] == 0)
                    throw std::runtime_error("completion for an unknown call");
                --left[i];
                --outstanding;
            }
        }
        std::vector<br::reply> out(n);
        for (std::size_t i = 0; i < n; ++i) {
            std::memcpy(&out[i], msgs_.data() + reply_offset(i), sizeof out[i]);
            if (out[i].magic != br::magic || out[i].key != keys[i])
                throw std::runtime_error("reply for key " + hex(keys[i]) + " is malformed");
        }
        return out;
    }

    const std::byte* bulk(std::size_t i) const { return bulk_.data() + i * object_store::max_object; }

    br::counters shutdown()
    {
        auto r = batch(br::procedure::shutdown, {0}, 0);
        return r[0].stats;
    }

private:
    std::size_t request_offset(std::size_t i) const { return 2 * i * br::message_size; }
    std::size_t reply_offset(std::size_t i) const { return (2 * i + 1) * br::message_size; }
    std::byte* request_buf(std::size_t i) { return msgs_.data() + request_offset(i); }
    static void check(std::error_code ec, const char* what)
    {
        if (ec)
            throw rdmx::error(ec, std::string("endpoint ") + what);
    }

    std::unique_ptr<rdmx::domain> dom_;
    std::vector<std::byte> msgs_, bulk_;
    std::unique_ptr<rdmx::memory_region> msg_mr_, bulk_mr_;
    std::unique_ptr<rdmx::endpoint> ep_; // after the memory: destroyed before it
    std::chrono::milliseconds timeout_;
    std::size_t depth_;
    rdmx::peer server_{};
    std::uint64_t seq_ = 0;
};

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"bulk_rpc_client: PUT and GET objects through bulk_rpc_server, every byte checked"};
    std::string address;
    std::uint64_t id = 1;
    std::size_t objects = 8, depth = 4;
    int rounds = 1;
    bool shutdown = false;
    int timeout_ms = 30000;
    app.add_option("address", address, "the server's tcp://HOST:PORT, shm://NAME:PORT or rdma://HOST:PORT")
        ->required();
    app.add_option("--id", id, "client id: owns the keys id << 32 | j");
    app.add_option("--objects", objects, "objects per round")->check(CLI::Range(1, 1 << 16));
    app.add_option("--rounds", rounds, "rounds of PUT all, GET all (0: until killed)");
    app.add_option("--depth", depth, "RPCs in flight at once")->check(CLI::Range(1, 64));
    app.add_option("--timeout-ms", timeout_ms, "bound on each batch of RPCs");
    app.add_flag("--shutdown", shutdown, "ask the server to stop, print its counters");
    CLI11_PARSE(app, argc, argv);
    try {
        client c(address, shutdown ? 1 : depth, std::chrono::milliseconds(timeout_ms));
        // The server knows a client by this address (its listener's): a client that gets
        // the port of one that exited is that peer again, restarted.
        std::printf("bulk_rpc_client %llu: endpoint %s\n", static_cast<unsigned long long>(id),
                    c.address().c_str());
        std::fflush(stdout);
        if (shutdown) {
            br::counters s = c.shutdown();
            std::printf("bulk_rpc_client: server counters: %llu rpcs, %llu puts, %llu gets, %llu failed, "
                        "%llu peers\n",
                        static_cast<unsigned long long>(s.rpcs), static_cast<unsigned long long>(s.puts),
                        static_cast<unsigned long long>(s.gets), static_cast<unsigned long long>(s.failed),
                        static_cast<unsigned long long>(s.peers));
            return 0;
        }
        std::uint64_t bytes = 0;
        for (int r = 0; rounds == 0 || r < rounds; ++r) {
            for (std::size_t first = 0; first < objects; first += c.depth()) {
                std::vector<std::uint64_t> keys;
                for (std::size_t j = first; j < objects && keys.size() < c.depth(); ++j)
                    keys.push_back(id << 32 | j);
                for (auto& rep : c.batch(bulk_rpc::procedure::put, keys, r))
                    if (rep.status != br::status::ok)
                        throw std::runtime_error("PUT " + hex(rep.key) + ": " + br::to_string(rep.status));
                auto got = c.batch(bulk_rpc::procedure::get, keys, 0);
                std::vector<std::byte> want(object_store::max_object);
                for (std::size_t i = 0; i < keys.size(); ++i) {
                    std::size_t size = object_store::object_size(keys[i]);
                    if (got[i].status != br::status::ok || got[i].size != size)
                        throw std::runtime_error("GET " + hex(keys[i]) + ": " + br::to_string(got[i].status) +
                                                 ", " + std::to_string(got[i].size) + " bytes");
                    object_store::fill({want.data(), size}, keys[i], r);
                    if (std::memcmp(c.bulk(i), want.data(), size) != 0)
                        throw std::runtime_error("GET " + hex(keys[i]) + ": data differs from version " +
                                                 std::to_string(r));
                    bytes += 2 * size;
                }
            }
            std::printf("bulk_rpc_client %llu: round %d verified\n", static_cast<unsigned long long>(id), r);
            std::fflush(stdout);
        }
        std::printf("bulk_rpc_client %llu: done, %llu bytes moved and checked\n",
                    static_cast<unsigned long long>(id), static_cast<unsigned long long>(bytes));
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bulk_rpc_client %llu: %s\n", static_cast<unsigned long long>(id), e.what());
        return 1;
    }
}
