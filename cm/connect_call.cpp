// rdma_connect on a thread of its own (cm/connect_call.hpp).
#include "cm/connect_call.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>

#include <rdmx/error.hpp>

#include "log.hpp"

namespace rdmx::cm
{
namespace
{

std::atomic<unsigned> calls_in_flight{0};

} // namespace

unsigned connect_call::in_flight() noexcept
{
    return calls_in_flight.load(std::memory_order_relaxed);
}

std::shared_ptr<connect_call> connect_call::start(rdma_cm_id* id, const rdma_conn_param& param,
                                                  std::function<void(int)> failed)
{
    std::shared_ptr<connect_call> call(new connect_call);
    call->id_ = id;
    call->param_ = param;
    const std::size_t len = std::min<std::size_t>(param.private_data_len, call->private_.size());
    if (len)
        std::memcpy(call->private_.data(), param.private_data, len);
    call->param_.private_data = len ? call->private_.data() : nullptr;
    call->param_.private_data_len = static_cast<std::uint8_t>(len);
    call->failed_ = std::move(failed);
    if (calls_in_flight.fetch_add(1, std::memory_order_relaxed) >= max_in_flight) {
        calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
        throw error(make_error_code(errc::no_resources),
                    "rdma_connect: " + std::to_string(max_in_flight) +
                        " connects are already waiting for their peers' hosts to answer (iWARP connects in "
                        "the kernel, blocking)");
    }
    try {
        std::thread(run, call).detach(); // its lifetime is the call's: see run()
    } catch (const std::system_error& e) {
        calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
        throw error(e.code(), std::string("rdma_connect: cannot start its thread: ") + e.what());
    }
    return call;
}

void connect_call::run(std::shared_ptr<connect_call> self) noexcept
{
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = rdma_connect(self->id_, &self->param_);
    const int err = rc ? errno : 0;
    const auto took = std::chrono::steady_clock::now() - t0;
    if (took > std::chrono::seconds(1))
        RDMX_LOG(debug,
                 "rdma_connect returned after %lld ms (%s): the peer's host was slow to answer, or never did",
                 static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
                 rc ? std::strerror(err) : "started");
    std::unique_ptr<connection_remains> rest;
    reaper* to = nullptr;
    {
        std::lock_guard lock(self->mutex_);
        self->done_ = true;
        if (rc && self->failed_)
            self->failed_(err);
        self->failed_ = nullptr;
        rest = std::move(self->remains_);
        to = self->reaper_;
    }
    calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
    self->returned_.notify_all();
    // The connection is gone: what it left waits no more for this call (the QP perhaps for
    // the provider's answer still, which the reaper may wait out).
    if (rest)
        to->adopt(std::move(rest));
}

void connect_call::abandon() noexcept
{
    std::lock_guard lock(mutex_);
    failed_ = nullptr;
}

bool connect_call::hand_over(std::unique_ptr<connection_remains>& rest, reaper& to) noexcept
{
    std::lock_guard lock(mutex_);
    if (done_)
        return false;
    remains_ = std::move(rest);
    reaper_ = &to;
    return true;
}

void connect_call::wait() noexcept
{
    std::unique_lock lock(mutex_);
    returned_.wait(lock, [&] { return done_; });
}

} // namespace rdmx::cm
