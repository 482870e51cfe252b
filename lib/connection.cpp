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
    case connection_state::idle: return "idle";
    case connection_state::addr_resolved: return "addr_resolved";
    case connection_state::route_resolved: return "route_resolved";
    case connection_state::connecting: return "connecting";
    case connection_state::established: return "established";
    case connection_state::disconnected: return "disconnected";
    case connection_state::error: return "error";
    }
    return "?";
}

std::error_code connection::post_send(std::span<const sge> local, std::uint64_t wr_id,
                                      send_flags flags) noexcept
{
    work_request wr{.opcode = opcode::send, .wr_id = wr_id, .local = local, .flags = flags};
    return post({&wr, 1});
}

std::error_code connection::post_write(std::span<const sge> local, const remote_buffer& remote,
                                       std::uint64_t wr_id, send_flags flags) noexcept
{
    work_request wr{
        .opcode = opcode::write, .wr_id = wr_id, .local = local, .remote = remote, .flags = flags};
    return post({&wr, 1});
}

std::error_code connection::post_write_imm(std::span<const sge> local, const remote_buffer& remote,
                                           std::uint32_t imm, std::uint64_t wr_id, send_flags flags) noexcept
{
    work_request wr{.opcode = opcode::write_with_imm,
                    .wr_id = wr_id,
                    .local = local,
                    .remote = remote,
                    .flags = flags,
                    .imm = imm};
    return post({&wr, 1});
}

std::error_code connection::post_read(std::span<const sge> local, const remote_buffer& remote,
                                      std::uint64_t wr_id, send_flags flags) noexcept
{
    work_request wr{.opcode = opcode::read, .wr_id = wr_id, .local = local, .remote = remote, .flags = flags};
    return post({&wr, 1});
}

std::error_code connection::post_recv(std::span<const sge> local, std::uint64_t wr_id) noexcept
{
    recv_request wr{.wr_id = wr_id, .local = local};
    return post_recv({&wr, 1});
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
