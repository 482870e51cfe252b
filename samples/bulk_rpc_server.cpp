// bulk_rpc_server: a key-value store served over an rdmx endpoint, the Mercury/DAOS way:
// RPCs by tagged messages from any number of clients, bulk data by RDMA read (PUT) and
// write (GET) to the descriptors the RPCs carry, one thread, event-driven, and no
// connection code (the protocol is in bulk_rpc.hpp).
//
//   bulk_rpc_server tcp://127.0.0.1:7490 [--slots 16] [--recvs 64]
//
// A client that dies mid-transfer makes its read or write fail; the server counts it and
// goes on serving the others.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

#include "bulk_rpc.hpp"
#include "object_store.hpp" // object sizes and contents (max_object)

namespace br = bulk_rpc;

namespace
{

// What a completion's context names: a request receive, or a staging slot's bulk transfer
// or reply.
enum class kind : std::uint64_t { request = 1, bulk = 2, reply = 3 };
std::uint64_t ctx(kind k, std::size_t index)
{
    return static_cast<std::uint64_t>(k) << 56 | index;
}

struct call {
    rdmx::peer from{};
    br::procedure proc = br::procedure::get;
    br::request req;
};

class server
{
public:
    server(const std::string& address, std::size_t slots, std::size_t recvs)
        : dom_(rdmx::domain::open(address)), inbox_(recvs * br::message_size),
          outbox_(slots * br::message_size), staging_(slots * object_store::max_object),
          ep_(rdmx::endpoint::open(*dom_, address)), slots_(slots)
    {
        in_mr_ = dom_->register_memory(inbox_.data(), inbox_.size(), rdmx::access::local_write);
        out_mr_ = dom_->register_memory(outbox_.data(), outbox_.size(), rdmx::access::none);
        // RDMA reads land here (local_write); RDMA writes go out from here.
        staging_mr_ = dom_->register_memory(staging_.data(), staging_.size(), rdmx::access::local_write);
        for (std::size_t i = 0; i < recvs; ++i)
            post_request_recv(i);
    }

    const std::string& address() const { return ep_->address(); }

    /// Serves until a SHUTDOWN's reply went out.
    br::counters run()
    {
        rdmx::endpoint_completion wc[32];
        while (!done_) {
            std::size_t n = ep_->wait(wc, std::chrono::seconds(1));
            for (std::size_t i = 0; i < n; ++i)
                handle(wc[i]);
        }
        stats_.peers = ep_->statistics().peers;
        return stats_;
    }

private:
    struct slot {
        bool busy = false;
        call c;
    };

    void post_request_recv(std::size_t i)
    {
        rdmx::sge s{in_mr_.get(), i * br::message_size, br::message_size};
        if (auto ec =
                ep_->recv(rdmx::any_peer, br::rpc_tag, br::procedure_bits, {&s, 1}, ctx(kind::request, i)))
            throw rdmx::error(ec, "endpoint recv (request)");
    }

    void handle(const rdmx::endpoint_completion& wc)
    {
        auto k = static_cast<kind>(wc.context >> 56);
        std::size_t index = wc.context & ((1ull << 56) - 1);
        switch (k) {
        case kind::request: on_request(wc, index); break;
        case kind::bulk: on_bulk(wc, index); break;
        case kind::reply: on_reply(wc, index); break;
        }
    }

    void on_request(const rdmx::endpoint_completion& wc, std::size_t index)
    {
        if (wc.status) {
            std::fprintf(stderr, "bulk_rpc_server: receive failed: %s\n", wc.status.message().c_str());
        } else {
            call c{
                .from = wc.peer, .proc = static_cast<br::procedure>(wc.tag & br::procedure_bits), .req = {}};
            std::memcpy(&c.req, inbox_.data() + index * br::message_size, sizeof c.req);
            if (wc.length < sizeof c.req || c.req.magic != br::magic)
                std::fprintf(stderr, "bulk_rpc_server: malformed request (%llu bytes) dropped\n",
                             static_cast<unsigned long long>(wc.length));
            else
                pending_.push_back(c);
        }
        if (!done_)
            post_request_recv(index); // the request was copied out
        dispatch();
    }

    /// Starts the pending calls that find a free staging slot.
    void dispatch()
    {
        for (std::size_t s = 0; s < slots_.size() && !pending_.empty(); ++s) {
            if (slots_[s].busy)
                continue;
            slots_[s] = {.busy = true, .c = pending_.front()};
            pending_.pop_front();
            start(s);
        }
    }

    std::byte* staging(std::size_t s) { return staging_.data() + s * object_store::max_object; }

    void start(std::size_t s)
    {
        call& c = slots_[s].c;
        ++stats_.rpcs;
        if (c.proc == br::procedure::shutdown)
            return reply(s, br::status::ok, 0);
        auto bulk = rdmx::remote_buffer::parse(c.req.bulk);
        if (!bulk)
            return reply(s, br::status::bad_request, 0);
        if (c.proc == br::procedure::put) {
            if (c.req.size == 0 || c.req.size > object_store::max_object || c.req.size > bulk->length)
                return reply(s, br::status::bad_request, 0);
            rdmx::sge local{staging_mr_.get(), s * object_store::max_object, c.req.size};
            if (auto ec = ep_->read(c.from, {&local, 1}, *bulk, ctx(kind::bulk, s)))
                return fail(s, "read", ec);
            return;
        }
        if (c.proc != br::procedure::get)
            return reply(s, br::status::bad_request, 0);
        auto it = store_.find(c.req.key);
        if (it == store_.end())
            return reply(s, br::status::not_found, 0);
        if (bulk->length < it->second.size())
            return reply(s, br::status::too_small, it->second.size());
        c.req.size = it->second.size(); // what this GET sends, whatever later PUTs store
        std::memcpy(staging(s), it->second.data(), it->second.size());
        rdmx::sge local{staging_mr_.get(), s * object_store::max_object, it->second.size()};
        if (auto ec = ep_->write(c.from, {&local, 1}, *bulk, ctx(kind::bulk, s)))
            fail(s, "write", ec);
    }

    void on_bulk(const rdmx::endpoint_completion& wc, std::size_t s)
    {
        call& c = slots_[s].c;
        if (wc.status)
            return fail(s, c.proc == br::procedure::put ? "read" : "write", wc.status);
        if (c.proc == br::procedure::put) {
            store_[c.req.key].assign(staging(s), staging(s) + c.req.size);
            ++stats_.puts;
            return reply(s, br::status::ok, c.req.size);
        }
        ++stats_.gets;
        reply(s, br::status::ok, c.req.size);
    }

    void reply(std::size_t s, br::status st, std::uint64_t size)
    {
        call& c = slots_[s].c;
        br::reply r{.status = st, .key = c.req.key, .size = size};
        if (c.proc == br::procedure::shutdown) {
            r.stats = stats_;
            r.stats.peers = ep_->statistics().peers;
        }
        std::memcpy(outbox_.data() + s * br::message_size, &r, sizeof r);
        rdmx::sge local{out_mr_.get(), s * br::message_size, sizeof r};
        if (auto ec = ep_->send(c.from, c.req.reply_tag, {&local, 1}, ctx(kind::reply, s)))
            fail(s, "send (reply)", ec);
    }

    void on_reply(const rdmx::endpoint_completion& wc, std::size_t s)
    {
        if (wc.status)
            return fail(s, "send (reply)", wc.status);
        if (slots_[s].c.proc == br::procedure::shutdown)
            done_ = true;
        release(s);
    }

    /// A bulk transfer or reply failed: most likely its client died. Count it and go on.
    void fail(std::size_t s, const char* what, std::error_code ec)
    {
        ++stats_.failed;
        std::fprintf(stderr, "bulk_rpc_server: %s for key %llx failed: %s\n", what,
                     static_cast<unsigned long long>(slots_[s].c.req.key), ec.message().c_str());
        release(s);
    }

    void release(std::size_t s)
    {
        slots_[s].busy = false;
        dispatch();
    }

    std::unique_ptr<rdmx::domain> dom_;
    std::vector<std::byte> inbox_, outbox_, staging_;
    std::unique_ptr<rdmx::memory_region> in_mr_, out_mr_, staging_mr_;
    std::unique_ptr<rdmx::endpoint> ep_; // after the memory: destroyed before it
    std::vector<slot> slots_;
    std::deque<call> pending_;
    std::map<std::uint64_t, std::vector<std::byte>> store_;
    br::counters stats_;
    bool done_ = false;
};

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"bulk_rpc_server: RPCs by tagged messages, bulk data by RDMA, over an rdmx endpoint"};
    std::string address;
    std::size_t slots = 16, recvs = 64;
    app.add_option("address", address, "tcp://HOST:PORT, shm://NAME:PORT or rdma://HOST:PORT (port 0: any)")
        ->required();
    app.add_option("--slots", slots, "bulk transfers in flight at once (1 MiB of staging each)")
        ->check(CLI::Range(1, 256));
    app.add_option("--recvs", recvs, "request receives kept posted")->check(CLI::Range(1, 4096));
    CLI11_PARSE(app, argc, argv);
    try {
        server s(address, slots, recvs);
        std::printf("bulk_rpc_server: listening on %s\n", s.address().c_str());
        std::fflush(stdout);
        br::counters c = s.run();
        std::printf("bulk_rpc_server: done: %llu rpcs, %llu puts, %llu gets, %llu failed, %llu peers\n",
                    static_cast<unsigned long long>(c.rpcs), static_cast<unsigned long long>(c.puts),
                    static_cast<unsigned long long>(c.gets), static_cast<unsigned long long>(c.failed),
                    static_cast<unsigned long long>(c.peers));
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bulk_rpc_server: %s\n", e.what());
        return 1;
    }
}
