// A helper program run as a process of its own (posix_spawn: exec'd at once, so it shares
// no RDMA state with the test and works under ThreadSanitizer), with its stdin and stdout
// on pipes; killed and reaped when the handle goes. For the tests whose peer must die.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace rdmx::test
{

/// tests/NAME, built next to the running test binary.
inline std::string sibling_program(const std::string& name)
{
    char self[4096];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return name;
    std::string p(self, static_cast<std::size_t>(n));
    return p.substr(0, p.rfind('/') + 1) + name;
}

class child_process
{
public:
    /// Starts `program` with `args` (argv[1..]); throws std::runtime_error naming the call
    /// and errno when it cannot.
    child_process(const std::string& program, const std::vector<std::string>& args)
    {
        int in[2], out[2];
        if (::pipe2(in, O_CLOEXEC) != 0)
            throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
        if (::pipe2(out, O_CLOEXEC) != 0) {
            ::close(in[0]);
            ::close(in[1]);
            throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
        }
        posix_spawn_file_actions_t fa;
        ::posix_spawn_file_actions_init(&fa);
        ::posix_spawn_file_actions_adddup2(&fa, in[0], 0);
        ::posix_spawn_file_actions_adddup2(&fa, out[1], 1);
        std::vector<char*> argv;
        argv.push_back(const_cast<char*>(program.c_str()));
        for (const auto& a : args)
            argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        int rc = ::posix_spawn(&pid_, program.c_str(), &fa, nullptr, argv.data(), environ);
        ::posix_spawn_file_actions_destroy(&fa);
        ::close(in[0]);
        ::close(out[1]);
        in_ = in[1];
        out_ = out[0];
        if (rc != 0) {
            pid_ = -1;
            close_pipes();
            throw std::runtime_error("posix_spawn " + program + ": " + std::strerror(rc));
        }
    }
    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;
    ~child_process()
    {
        kill();
        close_pipes();
    }

    /// Reads exactly `len` bytes of the child's stdout within `timeout`; false if the child
    /// closed it first (it failed: its stderr says why) or the time ran out.
    bool read_exact(void* data, std::size_t len, std::chrono::milliseconds timeout)
    {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        auto* p = static_cast<char*>(data);
        while (len > 0) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0)
                return false;
            pollfd pfd{out_, POLLIN, 0};
            int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return false;
            ssize_t n = ::read(out_, p, len);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return false;
            p += n;
            len -= static_cast<std::size_t>(n);
        }
        return true;
    }

    /// What the child has written to stdout so far and not yet read, without waiting
    /// (empty when nothing is there, or it closed stdout).
    std::string read_available()
    {
        std::string got;
        char buf[256];
        for (;;) {
            pollfd pfd{out_, POLLIN, 0};
            if (::poll(&pfd, 1, 0) != 1)
                return got;
            ssize_t n = ::read(out_, buf, sizeof buf);
            if (n <= 0)
                return got;
            got.append(buf, static_cast<std::size_t>(n));
        }
    }

    /// Writes to the child's stdin; false if it is gone.
    bool write(const void* data, std::size_t len)
    {
        return ::write(in_, data, len) == static_cast<ssize_t>(len);
    }

    /// Sends `sig` (SIGSTOP, SIGCONT: a peer that hangs without dying); false if it is
    /// reaped already or kill() fails.
    bool signal(int sig) { return pid_ > 0 && ::kill(pid_, sig) == 0; }

    /// SIGKILL, then reaps it (nothing if it was reaped already).
    void kill()
    {
        if (pid_ > 0)
            ::kill(pid_, SIGKILL);
        wait();
    }

    /// Waits for it to end and reaps it; its wait status (-1 if it was reaped already).
    int wait()
    {
        if (pid_ <= 0)
            return -1;
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        pid_ = -1;
        return status;
    }

private:
    void close_pipes()
    {
        if (in_ >= 0)
            ::close(in_);
        if (out_ >= 0)
            ::close(out_);
        in_ = out_ = -1;
    }

    pid_t pid_ = -1;
    int in_ = -1, out_ = -1;
};

} // namespace rdmx::test
