// Preallocated memory for the engine's completion handlers, so that the data path never
// reaches the heap. Asio allocates an operation object for every async_wait and post; its
// default recycling allocator keeps ONE block per thread, which is not enough once a read
// wait, a write wait and a timer are outstanding together, and a thread that does not run
// the io_context (the application thread handing a send over to the engine) has no cache
// at all. Each connection therefore owns a few fixed slots, handed to asio through the
// handler's associated allocator (Boost 1.74 has no bind_allocator, hence with_memory).
#pragma once

#include <atomic>
#include <cstddef>
#include <new>
#include <utility>

namespace rdmx::tcp
{

class handler_memory
{
public:
    // Outstanding operations per connection: read wait, write wait, a hand-over post from
    // the application thread, a receive resume, the RNR timer, the liveness timer, the
    // stand-down and transmit checks, the receive hand-back and continue posts
    // (tcp_connection.hpp), the close post, the linger timer.
    static constexpr std::size_t slots = 13;
    static constexpr std::size_t slot_size = 256; ///< asio 1.74's ops measure ~120-200 B

    handler_memory() = default;
    handler_memory(const handler_memory&) = delete;
    handler_memory& operator=(const handler_memory&) = delete;

    void* allocate(std::size_t size)
    {
        if (size <= slot_size)
            for (std::size_t i = 0; i < slots; ++i)
                if (!used_[i].exchange(true, std::memory_order_acquire))
                    return storage_[i].bytes;
        return ::operator new(size); // more in flight than foreseen: correct, just slower
    }

    void deallocate(void* p) noexcept
    {
        for (std::size_t i = 0; i < slots; ++i)
            if (p == storage_[i].bytes) {
                used_[i].store(false, std::memory_order_release);
                return;
            }
        ::operator delete(p);
    }

private:
    struct alignas(std::max_align_t) slot {
        std::byte bytes[slot_size];
    };
    slot storage_[slots];
    std::atomic<bool> used_[slots] = {};
};

/// The allocator asio finds through a handler's allocator_type / get_allocator().
template <class T> class handler_allocator
{
public:
    using value_type = T;
    explicit handler_allocator(handler_memory& m) noexcept : mem_(&m) {}
    template <class U> handler_allocator(const handler_allocator<U>& o) noexcept : mem_(o.mem_) {}
    T* allocate(std::size_t n) { return static_cast<T*>(mem_->allocate(sizeof(T) * n)); }
    void deallocate(T* p, std::size_t) noexcept { mem_->deallocate(p); }
    template <class U> bool operator==(const handler_allocator<U>& o) const noexcept
    {
        return mem_ == o.mem_;
    }

private:
    template <class> friend class handler_allocator;
    handler_memory* mem_;
};

/// Wraps a handler so that asio allocates its operation from `m`. The handler must keep
/// the owner of `m` alive (it holds a shared_ptr to the connection state): asio frees the
/// operation after moving the handler out, before the handler is destroyed.
template <class Handler> class with_memory
{
public:
    using allocator_type = handler_allocator<void>;
    with_memory(handler_memory& m, Handler h) : mem_(&m), h_(std::move(h)) {}
    allocator_type get_allocator() const noexcept { return allocator_type(*mem_); }
    template <class... Args> void operator()(Args&&... args) { h_(std::forward<Args>(args)...); }

private:
    handler_memory* mem_;
    Handler h_;
};

} // namespace rdmx::tcp
