// rdma_connect on a pool thread (cm/connect_call.hpp).
#include "cm/connect_call.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
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
std::atomic<unsigned> max_calls{connect_call::default_max_in_flight};

// The threads that make the calls, and the calls none has taken yet. Never destroyed: an
// idle thread may still wait on it when the process exits.
struct call_pool {
    std::mutex mutex;
    std::condition_variable work;
    std::deque<std::shared_ptr<connect_call>> queue;
    unsigned idle = 0;    ///< threads waiting for a call that none has claimed
    unsigned threads = 0; ///< started and not ended
};

std::atomic<call_pool*> the_pool{nullptr};
std::once_flag pool_once;

call_pool& pool()
{
    std::call_once(pool_once, [] {
        the_pool.store(new call_pool, std::memory_order_release);
        // The child of a fork has none of the parent's threads: a pool of its own (the
        // parent's, whose lock a parent thread may have held, is left as it is).
        ::pthread_atfork(nullptr, nullptr, [] { the_pool.store(new call_pool, std::memory_order_release); });
    });
    return *the_pool.load(std::memory_order_acquire);
}

} // namespace

unsigned connect_call::in_flight() noexcept
{
    return calls_in_flight.load(std::memory_order_relaxed);
}

unsigned connect_call::threads() noexcept
{
    call_pool& p = pool();
    std::lock_guard lock(p.mutex);
    return p.threads;
}

void connect_call::set_max_in_flight(unsigned n) noexcept
{
    max_calls.store(n, std::memory_order_relaxed);
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
    const unsigned most = max_calls.load(std::memory_order_relaxed);
    if (calls_in_flight.fetch_add(1, std::memory_order_relaxed) >= most) {
        calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
        throw error(make_error_code(errc::no_resources),
                    "rdma_connect: " + std::to_string(most) +
                        " connects are already waiting for their peers' hosts to answer (iWARP connects in "
                        "the kernel, blocking)");
    }
    call_pool& p = pool();
    std::unique_lock lock(p.mutex);
    try {
        p.queue.push_back(call);
        if (p.queue.size() <= p.idle) {
            lock.unlock();
            p.work.notify_one();
            return call;
        }
        std::thread(serve).detach(); // ends on its own after idle_timeout without a call
        ++p.threads;
    } catch (const std::exception& e) {
        if (!p.queue.empty() && p.queue.back() == call)
            p.queue.pop_back();
        lock.unlock();
        calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
        if (auto* se = dynamic_cast<const std::system_error*>(&e))
            throw error(se->code(), std::string("rdma_connect: cannot start a thread for it: ") + e.what());
        throw error(make_error_code(errc::no_resources), std::string("rdma_connect: ") + e.what());
    }
    return call;
}

void connect_call::serve() noexcept
{
    call_pool& p = pool();
    std::unique_lock lock(p.mutex);
    for (;;) {
        if (p.queue.empty()) {
            ++p.idle;
            const bool called = p.work.wait_for(lock, idle_timeout, [&] { return !p.queue.empty(); });
            --p.idle;
            if (!called) {
                --p.threads;
                return;
            }
        }
        std::shared_ptr<connect_call> call = std::move(p.queue.front());
        p.queue.pop_front();
        lock.unlock();
        call->run();
        call.reset();
        lock.lock();
    }
}

void connect_call::run() noexcept
{
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = rdma_connect(id_, &param_);
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
        std::lock_guard lock(mutex_);
        done_ = true;
        if (rc && failed_)
            failed_(err);
        failed_ = nullptr;
        rest = std::move(remains_);
        to = reaper_;
    }
    calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
    returned_.notify_all();
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
