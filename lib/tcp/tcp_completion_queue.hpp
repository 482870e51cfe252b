// A completion queue that many TCP connections report to (rdmx::completion_queue): one
// bounded FIFO of completions, each tagged with the engine it came from, and an eventfd
// for event mode. Engines push into it (the engine thread, or an application thread that
// posts) while they hold their own mutex; the application polls it. Its connections are
// progressed by the engine thread alone (docs/servers.md, "Shared completion queues").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cq_reservation.hpp"
#include "tcp/tcp_completion.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_thread_safety.hpp"

namespace rdmx::tcp
{

class connection_engine;

class tcp_completion_queue final : public detail::completion_queue_base
{
public:
    /// `depth` is clamped to 1 .. max_depth.
    explicit tcp_completion_queue(std::uint32_t depth);
    ~tcp_completion_queue() override;

    static constexpr std::uint32_t max_depth = 1u << 20;

    rdmx::backend backend() const noexcept override { return backend::tcp; }
    std::size_t poll(std::span<completion> out) noexcept override RDMX_EXCLUDES(mu_);
    int fd() const noexcept override { return efd_.get(); }
    std::error_code request_notify(bool solicited_only) noexcept override RDMX_EXCLUDES(mu_);
    std::error_code ack_notify() noexcept override;

    // --- for the engines (any thread, with the engine's own mutex held: lock order engine,
    // then queue) ---
    /// Queues `c` of `owner`'s `side` (`solicited`: a receive the peer marked so); false,
    /// and nothing queued, when the queue is full (the reservations make that impossible).
    bool push(const completion& c, connection_engine& owner, cq_side side, bool solicited) noexcept
        RDMX_EXCLUDES(mu_);
    /// Drops what `owner` still has queued: its connection object is going away.
    void purge(const connection_engine& owner) noexcept RDMX_EXCLUDES(mu_);

private:
    struct entry {
        completion c;
        connection_engine* owner = nullptr;
        cq_side side = cq_side::send;
    };

    engine_mutex mu_;
    std::vector<entry> ring_ RDMX_GUARDED_BY(mu_);
    std::size_t head_ RDMX_GUARDED_BY(mu_) = 0;
    std::size_t count_ RDMX_GUARDED_BY(mu_) = 0;
    notify_arm notify_ RDMX_GUARDED_BY(mu_);
    unique_fd efd_; ///< readable after a notification fired, until ack_notify()
};

} // namespace rdmx::tcp
