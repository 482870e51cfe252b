// Which thread may call what, in the code: clang's thread-safety capabilities, checked at
// compile time by the clang build (-Wthread-safety), and the engine-thread assertion that
// every build with assertions checks at run time. Under other compilers the annotations
// are empty; the assertions remain.
//
// Two capabilities guard a connection_engine: its mutex (engine_mutex), held by whichever
// thread works on the connection, and the engine thread's role (thread_role), which only
// the domain's io thread has: a handler that asio runs there claims it with
// assert_on_engine(). A function marked REQUIRES(mu_) runs on any thread under the lock;
// REQUIRES(mu_, engine_thread_) only on the engine thread; EXCLUDES(mu_) is an
// application's call that takes the lock itself.
#pragma once

#include <mutex>

#if defined(__clang__)
#define RDMX_TSA(x) __attribute__((x))
#else
#define RDMX_TSA(x)
#endif

#define RDMX_CAPABILITY(x) RDMX_TSA(capability(x))
#define RDMX_SCOPED_CAPABILITY RDMX_TSA(scoped_lockable)
#define RDMX_GUARDED_BY(x) RDMX_TSA(guarded_by(x))
#define RDMX_PT_GUARDED_BY(x) RDMX_TSA(pt_guarded_by(x))
#define RDMX_REQUIRES(...) RDMX_TSA(requires_capability(__VA_ARGS__))
#define RDMX_EXCLUDES(...) RDMX_TSA(locks_excluded(__VA_ARGS__))
#define RDMX_ACQUIRE(...) RDMX_TSA(acquire_capability(__VA_ARGS__))
#define RDMX_RELEASE(...) RDMX_TSA(release_capability(__VA_ARGS__))
#define RDMX_ASSERT_CAPABILITY(x) RDMX_TSA(assert_capability(x))

namespace rdmx::tcp
{

/// std::mutex as a capability the analysis knows.
class RDMX_CAPABILITY("mutex") engine_mutex
{
public:
    void lock() RDMX_ACQUIRE() { m_.lock(); }
    void unlock() RDMX_RELEASE() { m_.unlock(); }
    /// Locks; true if another thread held the mutex at the time (it had to wait).
    bool lock_was_contended() RDMX_ACQUIRE()
    {
        if (m_.try_lock())
            return false;
        m_.lock();
        return true;
    }

private:
    std::mutex m_;
};

/// Holds an engine_mutex for a scope.
class RDMX_SCOPED_CAPABILITY engine_lock
{
public:
    explicit engine_lock(engine_mutex& m) RDMX_ACQUIRE(m) : m_(m) { m_.lock(); }
    /// Also says whether the mutex was held by another thread when this one came for it.
    engine_lock(engine_mutex& m, bool& was_contended) RDMX_ACQUIRE(m) : m_(m)
    {
        was_contended = m_.lock_was_contended();
    }
    ~engine_lock() RDMX_RELEASE() { m_.unlock(); }
    engine_lock(const engine_lock&) = delete;
    engine_lock& operator=(const engine_lock&) = delete;

private:
    engine_mutex& m_;
};

/// A role that one thread has (here: the domain's engine thread). Never locked: code that
/// runs in that thread asserts it (connection_engine::assert_on_engine).
class RDMX_CAPABILITY("role") thread_role
{
};

} // namespace rdmx::tcp
