#include "validate.hpp"

namespace rdmx::detail {

std::error_code check_local(std::span<const sge> list, const void* owner, std::uint32_t max_sge,
                            bool needs_local_write, std::uint64_t& total) noexcept
{
    if (list.size() > max_sge)
        return errc::invalid_argument;
    std::uint64_t sum = 0;
    for (const sge& s : list) {
        if (s.region == nullptr || s.region->owner() != owner)
            return errc::invalid_argument;
        if (s.offset > s.region->size() || s.length > s.region->size() - s.offset)
            return errc::invalid_argument;
        if (needs_local_write && s.length > 0 && !any(s.region->access() & access::local_write))
            return errc::local_protection;
        sum += s.length;
    }
    if (sum > max_message_size)
        return errc::invalid_argument;
    total = sum;
    return {};
}

std::error_code check_send(const work_request& wr, const void* owner, rdmx::backend b,
                           const connection_limits& lim, std::uint64_t& total) noexcept
{
    const bool is_read = wr.opcode == opcode::read;
    switch (wr.opcode) {
    case opcode::send:
    case opcode::write:
    case opcode::write_with_imm:
    case opcode::read: break;
    default: return errc::invalid_argument;
    }
    if (auto ec = check_local(wr.local, owner, lim.max_send_sge, is_read, total))
        return ec;
    if (has(wr.flags, send_flags::inline_data) && (is_read || total > lim.max_inline))
        return errc::invalid_argument;
    if (wr.opcode != opcode::send) {
        // The descriptor came from the peer: it must be for this backend and the transfer
        // must fit in the range it names. The target checks again (keys can be forged).
        if (wr.remote.backend != b || total > wr.remote.length)
            return errc::invalid_argument;
    }
    return {};
}

std::chrono::microseconds rnr_delay(std::uint8_t code) noexcept
{
    // IBTA 1.4, table 45 "Encoding for RNR NAK timer field", in units of 10 us.
    static constexpr std::uint32_t tens_of_us[32] = {
        65536, 1,   2,   3,   4,    6,    8,    12,   16,   24,   32,   48,   64,   96,   128,  192,
        256,   384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
    return std::chrono::microseconds(10 * tens_of_us[code & 31]);
}

} // namespace rdmx::detail
