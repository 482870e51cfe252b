// The reaper thread of a verbs domain (cm/reaper.hpp).
#include "cm/reaper.hpp"

#include <system_error>

#include "log.hpp"

namespace rdmx::cm
{

reaper::~reaper()
{
    if (!thread_.joinable())
        return;
    {
        std::lock_guard lock(st_->mutex);
        st_->stop = true;
    }
    st_->wake.notify_all();
    if (thread_.get_id() == std::this_thread::get_id())
        thread_.detach(); // destroyed by its own last job: run() sees `stop` once it returns
    else
        thread_.join();
}

void reaper::adopt(std::unique_ptr<connection_remains> job) noexcept
{
    try {
        std::lock_guard lock(st_->mutex);
        if (!thread_.joinable())
            thread_ = std::thread(run, st_); // waits for the lock, then for the job
        st_->jobs.push_back(std::move(job)); // `job` stays ours if this throws
    } catch (const std::exception& e) {
        RDMX_LOG(warn,
                 "connection tear-down: cannot hand it to the reaper (%s): destroying its QP here, which may "
                 "wait for the provider",
                 e.what());
        job.reset();
        return;
    }
    st_->wake.notify_one();
}

void reaper::run(std::shared_ptr<state> st) noexcept
{
    std::unique_lock lock(st->mutex);
    for (;;) {
        st->wake.wait(lock, [&] { return st->stop || !st->jobs.empty(); });
        if (st->jobs.empty())
            return; // stop, nothing left
        auto job = std::move(st->jobs.front());
        st->jobs.pop_front();
        st->busy = true;
        lock.unlock();
        job.reset(); // may wait for the provider; may destroy the domain, and so the reaper
        lock.lock();
        st->busy = false;
        st->idle.notify_all();
    }
}

void reaper::wait_idle() noexcept
{
    std::unique_lock lock(st_->mutex);
    st_->idle.wait(lock, [&] { return st_->jobs.empty() && !st_->busy; });
}

} // namespace rdmx::cm
