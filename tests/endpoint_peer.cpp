// endpoint_peer: the far end of the endpoint races that kill a peer's process (a dead peer,
// a crashed peer restarted at the same address), run as a process of its own. It is
// exec'd, not forked from the test: rdma_cm and verbs state does not survive fork(), and a
// forked child of a multi-threaded process cannot start threads under ThreadSanitizer, so
// the same tests run on TCP, rxe and siw, with every sanitizer.
//
//   endpoint_peer ADDRESS MODE
//
// Opens an endpoint on ADDRESS (scheme://host:port; the domain on the same host), then, as
// MODE says: `answer` posts one receive (tag 1, 64 bytes, any peer), `idle` posts none,
// `counter` registers an 8-byte counter holding 100 with remote_atomic access. It then
// writes to stdout one byte (answer, idle) or the counter's serialized remote_buffer
// (counter), and serves the endpoint (its completions are dropped) until it is killed.
// Exit status 1 if it could not get there.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <rdmx/rdmx.hpp>

#include "common/endpoint_options.hpp"

namespace
{

/// The host part of ADDRESS with port 0: the domain's address.
std::string domain_address(const std::string& addr)
{
    return addr.substr(0, addr.rfind(':')) + ":0";
}

bool write_all(const void* data, std::size_t len)
{
    const char* p = static_cast<const char*>(data);
    while (len > 0) {
        ssize_t n = ::write(1, p, len);
        if (n <= 0)
            return false;
        p += n;
        len -= static_cast<std::size_t>(n);
    }
    return true;
}

} // namespace

int main(int argc, char** argv)
{
    if (argc != 3) {
        std::fprintf(stderr, "usage: endpoint_peer ADDRESS answer|idle|counter\n");
        return 2;
    }
    const std::string addr = argv[1], mode = argv[2];
    if (mode != "answer" && mode != "idle" && mode != "counter") {
        std::fprintf(stderr, "endpoint_peer: unknown mode %s\n", mode.c_str());
        return 2;
    }
    try {
        auto d = rdmx::domain::open(domain_address(addr));
        auto e = rdmx::endpoint::open(*d, addr, rdmx::test::small_endpoint_options());
        alignas(8) static std::byte mem[4096];
        std::unique_ptr<rdmx::memory_region> mr;
        if (mode == "counter") {
            const std::uint64_t hundred = 100;
            std::memcpy(mem, &hundred, sizeof hundred);
            mr = d->register_memory(mem, 8, rdmx::access::remote_atomic);
            auto bytes = mr->remote(0, 8).serialize();
            if (!write_all(bytes.data(), bytes.size()))
                return 1;
        } else {
            mr = d->register_memory(mem, sizeof mem, rdmx::access::local_write);
            if (mode == "answer") {
                rdmx::sge r{mr.get(), 0, 64};
                if (auto ec = e->recv(rdmx::any_peer, 1, 0, {&r, 1}, 1)) {
                    std::fprintf(stderr, "endpoint_peer: recv: %s\n", ec.message().c_str());
                    return 1;
                }
            }
            const char one = 1;
            if (!write_all(&one, 1))
                return 1;
        }
        rdmx::endpoint_completion out[16];
        for (;;)
            e->wait(out, std::chrono::milliseconds(100));
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "endpoint_peer: %s\n", ex.what());
        return 1;
    }
}
