#include "tcp/tcp_staging.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include <rdmx/error.hpp>

#include "cuda_driver.hpp"
#include "log.hpp"
#include "tcp/tcp_log.hpp"

namespace rdmx::tcp
{

namespace
{

/// bounce_pool::copy_now without the injected failures: staged memory at `src` to the
/// host at `dst` (`out`), or host bytes at `src` to staged memory at `dst`.
bool copy_sync(bool out, staging s, int device, std::byte* dst, const std::byte* src, std::size_t n) noexcept
{
    if (s != staging::cuda) {
        std::memcpy(dst, src, n);
        return true;
    }
    std::string why;
    if (detail::copy_device(out, device, dst, src, n, why))
        return true;
    log_limited("staging device memory: %s", why.c_str());
    return false;
}

} // namespace

bounce_pool::bounce_pool()
{
    if (const char* v = std::getenv("RDMX_TCP_STAGING_CHUNK")) {
        char* end = nullptr;
        const unsigned long long n = std::strtoull(v, &end, 10);
        if (end != v && *end == '\0' && n >= 4096 && n <= (16u << 20))
            chunk_size_ = static_cast<std::size_t>(n);
        else
            RDMX_LOG(warn, "RDMX_TCP_STAGING_CHUNK=%s: not a size from 4096 to 16777216 bytes; %zu used", v,
                     chunk_size_);
    }
    if (const char* v = std::getenv("RDMX_TCP_STAGING_FAIL"))
        fail_every_ = std::strtoull(v, nullptr, 10);
}

bool bounce_pool::injected_failure(staging s) noexcept
{
    if (s != staging::host || fail_every_ == 0 ||
        (copies_.fetch_add(1, std::memory_order_relaxed) + 1) % fail_every_ != 0)
        return false;
    log_limited("staging: a copy failed as RDMX_TCP_STAGING_FAIL asks (a test)");
    return true;
}

bool bounce_pool::copy_now(bool out, staging s, int device, std::byte* dst, const std::byte* src,
                           std::size_t n) noexcept
{
    if (injected_failure(s))
        return false;
    return copy_sync(out, s, device, dst, src, n);
}

bounce_pool::~bounce_pool()
{
    if (const detail::cuda_driver* d = pin_ ? detail::cuda() : nullptr; d && d->stream_destroy)
        for (int dev = 0; dev < 32; ++dev)
            if (streams_[dev]) {
                try {
                    detail::device_scope scope(*d, dev);
                    d->stream_destroy(static_cast<detail::cu_stream>(streams_[dev]));
                } catch (...) {
                }
            }
    for (chunk& c : all_) {
        if (!c.pinned) {
            ::operator delete (c.p, std::align_val_t{64});
            continue;
        }
        try { // a pinned chunk implies the driver, with both entry points
            const detail::cuda_driver* d = detail::cuda();
            detail::device_scope scope(*d, pin_device_);
            d->mem_free_host(c.p);
        } catch (...) { // the process keeps the pages: nothing else can be done
        }
    }
}

bounce_pool::chunk bounce_pool::make() noexcept
{
    if (pin_) {
        const detail::cuda_driver* d = detail::cuda();
        if (d && d->mem_host_alloc && d->mem_free_host) {
            try {
                detail::device_scope scope(*d, pin_device_);
                void* p = nullptr;
                if (d->mem_host_alloc(&p, chunk_size_, detail::cu_memhostalloc_portable) ==
                        detail::cu_success &&
                    p)
                    return {static_cast<std::byte*>(p), true};
            } catch (...) {
            }
        }
        // Pageable memory still works with cuMemcpy, more slowly.
    }
    return {static_cast<std::byte*>(::operator new (chunk_size_, std::align_val_t{64}, std::nothrow)), false};
}

void bounce_pool::prepare(staging s, int device)
{
    std::lock_guard lk(mu_);
    if (s == staging::cuda && !pin_) {
        pin_ = true;
        pin_device_ = device;
    }
    if (s == staging::cuda && device >= 0 && device < 32 && !streams_[device]) {
        // Without a stream of its own (a driver that lacks the entry points, or refuses),
        // the device's copies are synchronous: slower, never wrong.
        const detail::cuda_driver* d = detail::cuda();
        if (d && d->stream_create && d->stream_synchronize && d->memcpy_dtoh_async && d->memcpy_htod_async) {
            detail::device_scope scope(*d, device);
            detail::cu_stream st = nullptr;
            if (detail::cu_result rc = d->stream_create(&st, detail::cu_stream_non_blocking);
                rc == detail::cu_success)
                streams_[device] = st;
            else
                RDMX_LOG(info, "tcp staging: %s: copies of device %d memory are synchronous",
                         d->describe("cuStreamCreate", rc).c_str(), device);
        }
    }
    all_.reserve(all_.size() + initial_chunks);
    free_.reserve(all_.capacity());
    while (all_.size() < initial_chunks) {
        chunk c = make();
        if (!c.p)
            throw_errno(ENOMEM, "register_memory (the TCP backend's staging buffers)");
        all_.push_back(c);
        free_.push_back(c.p);
    }
}

std::byte* bounce_pool::take() noexcept
{
    std::lock_guard lk(mu_);
    if (!free_.empty()) {
        std::byte* p = free_.back();
        free_.pop_back();
        return p;
    }
    try {
        all_.reserve(all_.size() + 1);
        free_.reserve(all_.size() + 1); // give() never allocates
    } catch (...) {
        return nullptr;
    }
    chunk c = make();
    if (!c.p)
        return nullptr;
    all_.push_back(c);
    grown_.fetch_add(1, std::memory_order_relaxed);
    return c.p;
}

void bounce_pool::give(std::byte* chunk) noexcept
{
    std::lock_guard lk(mu_);
    free_.push_back(chunk); // room kept by take()
}

bool bounce_pool::start(copy_batch& b, bool out, staging s, int device, std::byte* dst, const std::byte* src,
                        std::size_t n) noexcept
{
    if (injected_failure(s))
        return false;
    if (s == staging::host) {
        if (defer_ && b.n_ < copy_batch::max_copies) {
            b.copies_[b.n_++] = {dst, src, n};
            return true;
        }
        std::memcpy(dst, src, n);
        return true;
    }
    if (s != staging::cuda)
        return false;
    void* stream = device >= 0 && device < 32 ? streams_[device] : nullptr;
    if (!stream) // no stream for this device: a synchronous copy
        return copy_sync(out, s, device, dst, src, n);
    const detail::cuda_driver* d = detail::cuda();
    try {
        detail::device_scope scope(*d, device);
        const auto st = static_cast<detail::cu_stream>(stream);
        const detail::cu_result rc =
            out ? d->memcpy_dtoh_async(dst, reinterpret_cast<detail::cu_deviceptr>(src), n, st)
                : d->memcpy_htod_async(reinterpret_cast<detail::cu_deviceptr>(dst), src, n, st);
        if (rc == detail::cu_success) {
            b.devices_ |= 1u << device;
            return true;
        }
        log_limited("staging device memory: %s",
                    d->describe(out ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync", rc).c_str());
    } catch (const std::exception& e) {
        log_limited("staging device memory: %s", e.what());
    }
    return false;
}

bool bounce_pool::finish(copy_batch& b) noexcept
{
    for (int i = 0; i < b.n_; ++i)
        std::memcpy(b.copies_[i].dst, b.copies_[i].src, b.copies_[i].n);
    b.n_ = 0;
    bool ok = true;
    for (int dev = 0; b.devices_ != 0; ++dev) {
        if ((b.devices_ & (1u << dev)) == 0)
            continue;
        b.devices_ &= ~(1u << dev);
        // The stream is shared by the domain's connections: this waits for their copies
        // too, which were started earlier and are as short.
        const detail::cuda_driver* d = detail::cuda();
        try {
            detail::device_scope scope(*d, dev);
            if (detail::cu_result rc = d->stream_synchronize(static_cast<detail::cu_stream>(streams_[dev]));
                rc != detail::cu_success) {
                log_limited("staging device memory: %s", d->describe("cuStreamSynchronize", rc).c_str());
                ok = false;
            }
        } catch (const std::exception& e) {
            log_limited("staging device memory: %s", e.what());
            ok = false;
        }
    }
    return ok;
}

} // namespace rdmx::tcp
