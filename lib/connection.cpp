#include <rdmx/connection.hpp>

#include "event_wait.hpp"

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
    case opcode::fetch_add: return "fetch_add";
    case opcode::compare_swap: return "compare_swap";
    case opcode::bind_window: return "bind_window";
    case opcode::invalidate_window: return "invalidate_window";
    case opcode::send_with_invalidate: return "send_with_invalidate";
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
    return detail::wait_for_completions(*this, completion_fd(), out, timeout);
}

} // namespace rdmx
