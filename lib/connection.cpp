#include <rdmx/connection.hpp>

#include <poll.h>

#include <cerrno>

namespace rdmx
{

const char* to_string(opcode op) noexcept
{
    switch (op) {
    case opcode::send: return "send";
    case opcode::write: return "write";
    case opcode::write_with_imm: return "write_with_imm";
    case opcode::read: return "read";
    case opcode::recv: return "recv";
    case opcode::recv_with_imm: return "recv_with_imm";
    case opcode::unknown: return "unknown";
    }
    return "?";
}

const char* to_string(connection_state s) noexcept
{
    switch (s) {
    case connection_state::connecting: return "connecting";
    case connection_state::established: return "established";
    case connection_state::disconnected: return "disconnected";
    case connection_state::error: return "error";
    }
    return "?";
}

std::size_t connection::wait(std::span<completion> out, std::chrono::milliseconds timeout) noexcept
{
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        if (auto n = poll(out))
            return n;
        if (request_notify())
            return 0;
        // A completion that arrived before arming raises no event: poll once more.
        if (auto n = poll(out))
            return n;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                          std::chrono::steady_clock::now());
        if (left.count() <= 0)
            return 0;
        pollfd pfd{completion_fd(), POLLIN, 0};
        int rc = ::poll(&pfd, 1, static_cast<int>(left.count()));
        if (rc < 0 && errno != EINTR)
            return 0;
        if (rc > 0)
            ack_notify();
    }
}

} // namespace rdmx
