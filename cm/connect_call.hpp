// rdma_connect on iWARP, on a thread of a pool. siw makes the TCP connection inside the
// call, blocking (siw_cm.c: kernel_connect without O_NONBLOCK): to a host that never
// answers the SYN, the call returns only when the kernel gives up (net.ipv4.tcp_syn_retries,
// about 127 s by default). On the domain's event loop that would stall every other
// connection's set-up and tear-down of the domain for as long, past
// connection_options::timeout. RoCE and InfiniBand send a CM request and return: they call
// it on the loop as before.
//
// The connection's deadline fails it meanwhile as any unanswered connect; what the call
// uses (the cm_id, the QP the kernel holds) stays until it returns: a connection destroyed
// before then hands its remains to the call, whose thread gives them to the domain's reaper
// when the kernel lets go.
//
// The threads are a process-wide pool: started when a call finds none idle, ended after
// `idle_timeout` without a call, so that a burst of connects does not start and end a thread
// each (siw's connection rate measured at parity with a thread per call, and with calls on
// the loop: docs/performance.md). A forked child starts with an empty pool.
#pragma once

#include <rdma/rdma_cma.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

#include "cm/private_data.hpp"
#include "cm/reaper.hpp"

namespace rdmx::cm
{

class connect_call
{
public:
    /// At most this many calls wait in the kernel at once, process-wide (a thread each), by
    /// default: beyond it, start() refuses with errc::no_resources.
    static constexpr unsigned default_max_in_flight = 256;
    /// How long a pool thread waits for the next call before it ends.
    static constexpr std::chrono::seconds idle_timeout{5};

    /// Calls rdma_connect(id, param) on a pool thread; `param`'s private data is copied first.
    /// `failed` runs on that thread (the call's lock held) when the call fails, with its
    /// errno, unless abandon() came first. Throws rdmx::error (no_resources, or a thread's
    /// creation failing).
    static std::shared_ptr<connect_call> start(rdma_cm_id* id, const rdma_conn_param& param,
                                               std::function<void(int err)> failed);

    connect_call(const connect_call&) = delete;
    connect_call& operator=(const connect_call&) = delete;

    /// The owner is going: `failed` does not run after this returns.
    void abandon() noexcept;
    /// If the call has not returned, takes `rest` (true): its thread hands it to `to` once
    /// the call returns (`rest` keeps the domain, and so `to`, alive). false: the call has
    /// returned, `rest` stays the caller's.
    bool hand_over(std::unique_ptr<connection_remains>& rest, reaper& to) noexcept;
    /// Waits until the call has returned.
    void wait() noexcept;

    /// Calls started and not returned, process-wide (for tests and logs).
    static unsigned in_flight() noexcept;
    /// The pool's threads now, busy or idle (for tests).
    static unsigned threads() noexcept;
    /// Sets the bound on in_flight() (tests; default_max_in_flight otherwise).
    static void set_max_in_flight(unsigned n) noexcept;

private:
    connect_call() = default;
    void run() noexcept;
    static void serve() noexcept; ///< a pool thread's life

    rdma_cm_id* id_ = nullptr;
    rdma_conn_param param_{};
    std::array<std::byte, connect_wire_size> private_{};
    std::mutex mutex_;
    std::condition_variable returned_;
    std::function<void(int)> failed_;             ///< emptied by abandon()
    bool done_ = false;                           ///< rdma_connect returned
    std::unique_ptr<connection_remains> remains_; ///< handed over before it returned
    reaper* reaper_ = nullptr;                    ///< where remains_ go
};

} // namespace rdmx::cm
