// The data path's socket calls, without glibc's wrappers. In a process of more than one
// thread, recv() and sendmsg() are cancellation points: glibc switches the caller to
// asynchronous cancellation around the system call and back (two atomic read-modify-writes
// of the thread's cancellation state). rdmx cancels no thread, and these calls never block
// (MSG_DONTWAIT), so that is pure cost on a busy poller (docs/performance.md). Same results
// and errno as the libc calls. Sanitizer builds keep the libc calls: ASan and TSan check
// the buffers a system call reads and writes only through their interceptors of those.
#pragma once

#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>

namespace rdmx::tcp::sys
{

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized = true;
#elif defined(__has_feature)
inline constexpr bool sanitized = __has_feature(address_sanitizer) || __has_feature(thread_sanitizer);
#else
inline constexpr bool sanitized = false;
#endif

inline ssize_t recv(int fd, void* buf, std::size_t len, int flags) noexcept
{
    if constexpr (sanitized)
        return ::recv(fd, buf, len, flags);
    return ::syscall(SYS_recvfrom, fd, buf, len, flags, nullptr, nullptr);
}

inline ssize_t recvmsg(int fd, msghdr* mh, int flags) noexcept
{
    if constexpr (sanitized)
        return ::recvmsg(fd, mh, flags);
    return ::syscall(SYS_recvmsg, fd, mh, flags);
}

inline ssize_t sendmsg(int fd, const msghdr* mh, int flags) noexcept
{
    if constexpr (sanitized)
        return ::sendmsg(fd, mh, flags);
    return ::syscall(SYS_sendmsg, fd, mh, flags);
}

} // namespace rdmx::tcp::sys
