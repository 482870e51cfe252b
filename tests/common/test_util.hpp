// Helpers shared by the test suites: which backends to run, address selection, bounded
// completion polling, and setting up a connected pair.
#pragma once

#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <rdmx/rdmx.hpp>

namespace rdmx::test
{

using namespace std::chrono_literals;

/// Backends named in RDMX_TEST_BACKENDS ("tcp", "shm", "verbs", "tcp,shm,verbs"); default
/// "tcp". The verbs run needs an RDMA device and RDMX_TEST_RDMA_ADDR (an IP on it).
inline std::vector<backend> selected_backends()
{
    const char* env = std::getenv("RDMX_TEST_BACKENDS");
    std::string s = env ? env : "tcp";
    std::vector<backend> out;
    if (s.find("tcp") != std::string::npos)
        out.push_back(backend::tcp);
    if (s.find("shm") != std::string::npos)
        out.push_back(backend::shm);
    if (s.find("verbs") != std::string::npos)
        out.push_back(backend::verbs);
    return out;
}

/// The backends whose connections the TCP engine runs (tcp, and shm over UNIX sockets):
/// what a test says of "TCP" holds for both.
inline bool tcp_engine(backend b)
{
    return b == backend::tcp || b == backend::shm;
}

/// Runs `cmd` with /bin/sh; its exit status (nonzero also when it did not exit).
inline int sh(const std::string& cmd)
{
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

inline std::string host_for(backend b)
{
    if (b == backend::shm)
        return "rdmx-test"; // shm://rdmx-test:PORT, this host's abstract namespace
    if (b == backend::tcp) {
        const char* h = std::getenv("RDMX_TEST_TCP_ADDR");
        return h ? h : "127.0.0.1";
    }
    const char* h = std::getenv("RDMX_TEST_RDMA_ADDR");
    return h ? h : "";
}

inline std::string address(backend b, const std::string& host, std::uint16_t port)
{
    const char* scheme = b == backend::tcp ? "tcp://" : b == backend::shm ? "shm://" : "rdma://";
    return scheme + host + ":" + std::to_string(port);
}

/// The address of this run's host for backend `b` (see host_for).
inline std::string address(backend b, std::uint16_t port)
{
    return address(b, host_for(b), port);
}

inline std::string param_name(const testing::TestParamInfo<backend>& info)
{
    return to_string(info.param);
}

/// Polls a connection or a completion queue until `n` completions arrived or `timeout`
/// passed.
template <class Polled>
std::vector<completion> poll_until(Polled& q, std::size_t n, std::chrono::milliseconds timeout)
{
    std::vector<completion> out;
    completion buf[16];
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
        std::size_t got = q.poll({buf, std::min<std::size_t>(16, n - out.size())});
        out.insert(out.end(), buf, buf + got);
        if (got == 0)
            std::this_thread::yield();
    }
    return out;
}
inline std::vector<completion> poll_n(connection& c, std::size_t n, std::chrono::milliseconds timeout = 10s)
{
    return poll_until(c, n, timeout);
}
/// A shared queue gathers many connections' completions: a longer default.
inline std::vector<completion> poll_n(completion_queue& q, std::size_t n,
                                      std::chrono::milliseconds timeout = 20s)
{
    return poll_until(q, n, timeout);
}

/// Polls for `n` completions and expects each to be successful.
inline std::vector<completion> expect_ok(connection& c, std::size_t n,
                                         std::chrono::milliseconds timeout = 10s)
{
    auto cs = poll_n(c, n, timeout);
    EXPECT_EQ(cs.size(), n) << "completions missing after " << timeout.count() << " ms";
    for (auto& x : cs)
        EXPECT_FALSE(x.status) << "wr_id " << x.wr_id << ": " << x.status.message();
    return cs;
}

/// Waits (1 ms steps, at most `timeout`) while a started connection (domain::start_connect)
/// is still connecting; its state at the end.
inline connection_state wait_established(connection& c, std::chrono::milliseconds timeout = 10s)
{
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (c.state() == connection_state::connecting && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    return c.state();
}

inline std::span<const std::byte> as_bytes(const std::string& s)
{
    return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
inline std::string as_string(std::span<const std::byte> b)
{
    return {reinterpret_cast<const char*>(b.data()), b.size()};
}
/// Private data as sent: verbs (IB CM) pads it with zeros to the message's size.
inline std::string unpadded(std::span<const std::byte> b)
{
    std::string s = as_string(b);
    while (!s.empty() && s.back() == '\0')
        s.pop_back();
    return s;
}

/// The number in environment variable `name`, or `fallback` where it is unset (a test's
/// size, which a developer may raise or lower by hand).
inline std::size_t env_or(const char* name, std::size_t fallback)
{
    const char* v = std::getenv(name);
    return v ? std::strtoul(v, nullptr, 10) : fallback;
}

/// The entries of directory `path`, `.` and `..` included (0 if it cannot be read).
inline std::size_t dir_entries(const char* path)
{
    std::size_t n = 0;
    if (DIR* d = ::opendir(path)) {
        while (::readdir(d) != nullptr)
            ++n;
        ::closedir(d);
    }
    return n;
}

/// This process's open file descriptors, of every kind (leak checks); three above the true
/// count (`.`, `..` and the descriptor that reads them), as it always was.
inline std::size_t open_fds()
{
    return dir_entries("/proc/self/fd");
}

/// This process's threads (/proc/self/task), for tests that see a domain's end in its
/// thread's; two above the true count (`.` and `..`), a count to compare.
inline std::size_t live_threads()
{
    return dir_entries("/proc/self/task");
}

/// Server and client domains, a listener, and helpers to make connected pairs.
class pair_fixture : public testing::TestWithParam<backend>
{
protected:
    void SetUp() override
    {
        b_ = GetParam();
        if (b_ == backend::verbs && host_for(b_).empty())
            GTEST_SKIP() << "verbs run needs RDMX_TEST_RDMA_ADDR (an IP on an RDMA device)";
        server_dom_ = domain::open(address(b_, 0));
        client_dom_ = domain::open(address(b_, 0));
        ASSERT_EQ(server_dom_->backend(), b_);
        listener_ = server_dom_->listen(address(b_, 0));
        port_ = listener_->port();
        ASSERT_NE(port_, 0);
    }

    std::string server_address() const { return address(b_, port_); }

    struct pair {
        std::unique_ptr<connection> client, server;
    };

    /// Connects a client to the listener and accepts on a helper thread.
    pair connect_pair(const connection_options& opts = {}, const std::string& client_pdata = {},
                      const std::string& server_pdata = {})
    {
        auto accepted = std::async(std::launch::async, [&] {
            auto req = listener_->get_request(10s);
            if (!req)
                throw std::runtime_error("no connection request within 10 s");
            return req->accept(opts, as_bytes(server_pdata));
        });
        pair p;
        p.client = client_dom_->connect(server_address(), opts, as_bytes(client_pdata));
        p.server = accepted.get();
        return p;
    }

    backend b_{};
    std::unique_ptr<domain> server_dom_, client_dom_;
    std::unique_ptr<listener> listener_;
    std::uint16_t port_ = 0;
};

} // namespace rdmx::test
