#include "validate.hpp"

namespace rdmx::detail
{

std::chrono::microseconds rnr_delay(std::uint8_t code) noexcept
{
    // IBTA 1.4, table 45 "Encoding for RNR NAK timer field", in units of 10 us.
    static constexpr std::uint32_t tens_of_us[32] = {
        65536, 1,   2,   3,   4,    6,    8,    12,   16,   24,   32,   48,    64,    96,    128,   192,
        256,   384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
    return std::chrono::microseconds(10 * tens_of_us[code & 31]);
}

} // namespace rdmx::detail
