#include "validate.hpp"

#include <rdmx/queues.hpp>

#include <algorithm>
#include <string>

namespace rdmx::detail
{

connection_limits clamp_limits(const connection_options& opts, const device_limits& dev,
                               std::uint32_t max_sge_per_wr) noexcept
{
    const std::uint32_t max_sge = std::min(dev.max_sge, max_sge_per_wr);
    connection_limits l;
    l.send_queue_depth = std::clamp<std::uint32_t>(opts.send_queue_depth, 1, dev.max_qp_wr);
    l.recv_queue_depth = std::clamp<std::uint32_t>(opts.recv_queue_depth, 1, dev.max_qp_wr);
    l.max_send_sge = std::clamp<std::uint32_t>(opts.max_send_sge, 1, max_sge);
    l.max_recv_sge = std::clamp<std::uint32_t>(opts.max_recv_sge, 1, max_sge);
    if (opts.srq) {
        // The connection consumes from the shared queue: its receive side is that queue's.
        l.recv_queue_depth = opts.srq->depth();
        l.max_recv_sge = opts.srq->max_sge();
    }
    l.max_inline = std::min(opts.max_inline, dev.max_inline);
    // One value is both the initiator depth and the responder resources.
    l.max_rd_atomic = std::clamp<std::uint32_t>(opts.max_rd_atomic, 1,
                                                std::min(dev.max_qp_rd_atom, dev.max_qp_init_rd_atom));
    return l;
}

void check_private_data(private_data_use use, std::span<const std::byte> data, std::string_view verb)
{
    std::size_t limit = max_connect_private_data;
    switch (use) {
    case private_data_use::connect: limit = max_connect_private_data; break;
    case private_data_use::accept: limit = max_accept_private_data; break;
    case private_data_use::reject: limit = max_reject_private_data; break;
    }
    if (data.size() > limit)
        throw_error(errc::invalid_argument,
                    std::string(verb) + ": private data over " + std::to_string(limit) + " bytes");
}

std::chrono::microseconds rnr_delay(std::uint8_t code) noexcept
{
    // IBTA 1.4, table 45 "Encoding for RNR NAK timer field", in units of 10 us.
    static constexpr std::uint32_t tens_of_us[32] = {
        65536, 1,   2,   3,   4,    6,    8,    12,   16,   24,   32,   48,    64,    96,    128,   192,
        256,   384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
    return std::chrono::microseconds(10 * tens_of_us[code & 31]);
}

} // namespace rdmx::detail
