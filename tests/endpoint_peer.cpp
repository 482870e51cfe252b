// endpoint_peer: the far end of the endpoint races that kill a peer's process (a dead peer,
// a crashed peer restarted at the same address), run as a process of its own. It is
// exec'd, not forked from the test: rdma_cm and verbs state does not survive fork(), and a
// forked child of a multi-threaded process cannot start threads under ThreadSanitizer, so
// the same tests run on TCP, rxe and siw, with every sanitizer.
//
//   endpoint_peer ADDRESS MODE
//   endpoint_peer ADDRESS rpc SERVER ID COUNT
//   endpoint_peer ADDRESS flood SERVER COUNT
//
// Opens an endpoint on ADDRESS (scheme://host:port; the domain on the same host), then, as
// MODE says: `answer` posts one receive (tag 1, 64 bytes, any peer), `idle` posts none,
// `counter` registers an 8-byte counter holding 100 with remote_atomic access. It then
// writes to stdout one byte (answer, idle) or the counter's serialized remote_buffer
// (counter), and serves the endpoint (its completions are dropped) until it is killed.
// Exit status 1 if it could not get there.
//
// `rpc` is a client of the echo service (samples/asio_ep_service.hpp, rdmx_ep_service): COUNT
// requests to SERVER of 1 B .. 300 kB (eager and rendezvous), each resent (with a new tag)
// until its echo arrives with every byte right, as a client of a server that may restart
// does; one '.' on stdout per request done, then 'D', exit 0. `flood` sends COUNT
// messages with tags the service never asks for, as fast as the endpoint takes them,
// ignoring failures, then writes 'D' and serves until killed.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <vector>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>

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

/// The byte at `i` of request `k` of client `id`: what the echo must bring back.
std::byte pattern_byte(int id, int k, std::size_t i)
{
    return static_cast<std::byte>(
        (i * 131 + static_cast<std::size_t>(id) * 7919 + static_cast<std::size_t>(k) * 31 + 5) & 0xff);
}

/// Whether `echo` is request `k` of client `id`; if not, says on stderr where and how it
/// differs (the first and last wrong byte, how many, the first one's value and what it
/// should be), which tells a buffer reused under a read from a torn transfer.
bool echo_right(int id, int k, std::span<const std::byte> echo)
{
    std::size_t first = echo.size(), last = 0, wrong = 0;
    for (std::size_t i = 0; i < echo.size(); ++i)
        if (echo[i] != pattern_byte(id, k, i)) {
            first = std::min(first, i);
            last = i;
            ++wrong;
        }
    if (wrong == 0)
        return true;
    std::fprintf(
        stderr,
        "rpc client %d: request %d: byte %zu of the echo wrong (0x%02x, not 0x%02x); %zu of %zu bytes "
        "wrong, the last at %zu\n",
        id, k, first, static_cast<unsigned>(echo[first]), static_cast<unsigned>(pattern_byte(id, k, first)),
        wrong, echo.size(), last);
    return false;
}

int rpc_client(const std::string& addr, const std::string& server, int id, int count)
{
    using namespace std::chrono;
    constexpr std::array<std::size_t, 7> sizes = {1, 64, 1000, 8192, 8193, 65536, 300000};
    constexpr std::size_t max_size = 300000;
    try {
        auto d = rdmx::domain::open(domain_address(addr));
        // The memory before the endpoint, so that it goes after the connections that may
        // still read it (samples/asio_ep_service.hpp says why).
        std::vector<std::byte> mem(2 * max_size);
        auto mr =
            d->register_memory(mem.data(), mem.size(), rdmx::access::local_write | rdmx::access::remote_read);
        auto o = rdmx::test::small_endpoint_options();
        auto e = rdmx::endpoint::open(*d, addr, o);
        const rdmx::peer srv = e->insert(server);
        const auto start = steady_clock::now();
        const auto give_up = start + seconds(150);
        // Each attempt that brought no echo, on stderr: what a failed run shows of its path,
        // and where its one peer's connection stands (a dial under way or none).
        auto retry_note = [&](int k, std::uint64_t attempt, const char* what, const std::error_code& ec) {
            const auto st = e->statistics();
            std::fprintf(
                stderr,
                "rpc client %d: request %d attempt %llu at %.1f s: %s%s%s (%zu connected, %zu connecting)\n",
                id, k, static_cast<unsigned long long>(attempt),
                duration<double>(steady_clock::now() - start).count(), what, ec ? ": " : "",
                ec ? ec.message().c_str() : "", st.connected, st.connecting);
        };
        rdmx::endpoint_completion out[16];
        for (int k = 0; k < count; ++k) {
            const std::size_t len = sizes[static_cast<std::size_t>(id + k) % sizes.size()];
            for (std::size_t i = 0; i < len; ++i)
                mem[i] = pattern_byte(id, k, i);
            bool done = false;
            for (std::uint64_t attempt = 0; !done; ++attempt) {
                if (steady_clock::now() > give_up) {
                    std::fprintf(stderr, "rpc client %d: request %d: no echo within 150 s\n", id, k);
                    return 1;
                }
                // A tag per attempt: an echo of an earlier attempt never matches this one.
                const std::uint64_t tag = (1ull << 63) | (static_cast<std::uint64_t>(id) << 40) |
                                          (static_cast<std::uint64_t>(k) << 8) | (attempt & 0xff);
                const std::uint64_t rctx = (static_cast<std::uint64_t>(k) << 20) | (attempt << 1);
                std::fill(mem.begin() + static_cast<std::ptrdiff_t>(max_size),
                          mem.begin() + static_cast<std::ptrdiff_t>(max_size + len), std::byte{0});
                rdmx::sge r{mr.get(), max_size, len}, s{mr.get(), 0, len};
                std::error_code posted = e->recv(srv, tag, 0, {&r, 1}, rctx);
                if (!posted)
                    posted = e->send(srv, tag, {&s, 1}, rctx | 1);
                if (posted) {
                    if (posted != rdmx::errc::would_block)
                        retry_note(k, attempt, "not posted", posted);
                    e->cancel_recv(rctx);
                    std::this_thread::sleep_for(milliseconds(20));
                    continue;
                }
                bool sent = false, got = false, failed = false;
                std::error_code send_status, recv_status;
                const auto attempt_end = steady_clock::now() + seconds(10);
                while (!(sent && (got || failed)) && steady_clock::now() < attempt_end) {
                    std::size_t n = e->wait(out, milliseconds(50));
                    for (std::size_t j = 0; j < n; ++j) {
                        if (out[j].context == (rctx | 1)) {
                            sent = true;
                            send_status = out[j].status;
                            failed |= static_cast<bool>(out[j].status);
                        } else if (out[j].context == rctx) {
                            if (out[j].status) {
                                recv_status = out[j].status;
                                failed = true;
                                continue;
                            }
                            if (out[j].length != len) {
                                std::fprintf(stderr,
                                             "rpc client %d: request %d: echo of %llu bytes, sent %zu\n", id,
                                             k, static_cast<unsigned long long>(out[j].length), len);
                                return 1;
                            }
                            if (!echo_right(id, k, {mem.data() + max_size, len}))
                                return 1;
                            got = true;
                        }
                    }
                    if (failed && !got)
                        e->cancel_recv(rctx); // the send failed: its echo will not come
                }
                done = got;
                if (!got) {
                    if (send_status)
                        retry_note(k, attempt, "the send failed", send_status);
                    else if (recv_status)
                        retry_note(k, attempt, "the receive failed", recv_status);
                    else
                        retry_note(k, attempt, sent ? "sent, no echo within 10 s" : "not sent within 10 s",
                                   {});
                    e->cancel_recv(rctx);
                    // The send must be over before its buffer is written again.
                    while (!sent && steady_clock::now() < give_up) {
                        std::size_t n = e->wait(out, milliseconds(50));
                        for (std::size_t j = 0; j < n; ++j)
                            sent |= out[j].context == (rctx | 1);
                    }
                }
            }
            if (!write_all(".", 1))
                return 1;
        }
        return write_all("D", 1) ? 0 : 1;
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "rpc client %d: %s\n", id, ex.what());
        return 1;
    }
}

int flooder(const std::string& addr, const std::string& server, int count)
{
    try {
        auto d = rdmx::domain::open(domain_address(addr));
        auto e = rdmx::endpoint::open(*d, addr, rdmx::test::small_endpoint_options());
        static std::byte mem[1000];
        auto mr = d->register_memory(mem, sizeof mem, rdmx::access::local_write);
        const rdmx::peer srv = e->insert(server);
        rdmx::endpoint_completion out[64];
        int sent = 0, outstanding = 0;
        while (sent < count) {
            rdmx::sge s{mr.get(), 0, sizeof mem};
            // Bit 63 clear: a tag the service asks for with nothing but its sink.
            if (outstanding < 32 && !e->send(srv, static_cast<std::uint64_t>(sent), {&s, 1}, 0)) {
                ++sent;
                ++outstanding;
            }
            outstanding -=
                static_cast<int>(e->wait(out, std::chrono::milliseconds(outstanding < 32 ? 0 : 20)));
        }
        if (!write_all("D", 1))
            return 1;
        for (;;)
            e->wait(out, std::chrono::milliseconds(100));
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "flooder: %s\n", ex.what());
        return 1;
    }
}

} // namespace

int main(int argc, char** argv)
{
    if (argc >= 3 && std::strcmp(argv[2], "rpc") == 0 && argc == 6)
        return rpc_client(argv[1], argv[3], std::atoi(argv[4]), std::atoi(argv[5]));
    if (argc >= 3 && std::strcmp(argv[2], "flood") == 0 && argc == 5)
        return flooder(argv[1], argv[3], std::atoi(argv[4]));
    if (argc != 3) {
        std::fprintf(stderr, "usage: endpoint_peer ADDRESS answer|idle|counter\n"
                             "       endpoint_peer ADDRESS rpc SERVER ID COUNT\n"
                             "       endpoint_peer ADDRESS flood SERVER COUNT\n");
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
