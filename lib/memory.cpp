#include <rdmx/error.hpp>
#include <rdmx/memory.hpp>

#include <cstring>

namespace rdmx
{
namespace
{

constexpr std::byte magic[4] = {std::byte{'R'}, std::byte{'D'}, std::byte{'M'}, std::byte{'X'}};
constexpr std::uint8_t version = 1;

void put_le64(std::byte* p, std::uint64_t v) noexcept
{
    for (int i = 0; i < 8; ++i)
        p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get_le64(const std::byte* p) noexcept
{
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
        v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    return v;
}

} // namespace

remote_buffer::bytes remote_buffer::serialize() const noexcept
{
    bytes out{};
    std::memcpy(out.data(), magic, 4);
    out[4] = std::byte{version};
    out[5] = static_cast<std::byte>(backend);
    put_le64(out.data() + 8, addr);
    put_le64(out.data() + 16, length);
    put_le64(out.data() + 24, key);
    return out;
}

std::optional<remote_buffer> remote_buffer::parse(std::span<const std::byte> data) noexcept
{
    if (data.size() != wire_size || std::memcmp(data.data(), magic, 4) != 0 ||
        data[4] != std::byte{version} || data[6] != std::byte{0} || data[7] != std::byte{0})
        return std::nullopt;
    remote_buffer rb;
    auto b = static_cast<std::uint8_t>(data[5]);
    if (b != static_cast<std::uint8_t>(rdmx::backend::verbs) &&
        b != static_cast<std::uint8_t>(rdmx::backend::tcp) &&
        b != static_cast<std::uint8_t>(rdmx::backend::shm))
        return std::nullopt;
    rb.backend = static_cast<rdmx::backend>(b);
    rb.addr = get_le64(data.data() + 8);
    rb.length = get_le64(data.data() + 16);
    rb.key = get_le64(data.data() + 24);
    // A descriptor whose range wraps around the address space is never valid.
    if (rb.addr + rb.length < rb.addr)
        return std::nullopt;
    if (rb.backend == rdmx::backend::verbs && rb.key > 0xffffffffu)
        return std::nullopt;
    return rb;
}

std::optional<remote_buffer> remote_buffer::slice(std::uint64_t offset, std::uint64_t len) const noexcept
{
    if (offset > length || len > length - offset)
        return std::nullopt;
    remote_buffer rb = *this;
    rb.addr += offset;
    rb.length = len;
    return rb;
}

remote_buffer memory_region::remote(std::size_t offset, std::size_t len) const
{
    if (offset > size_)
        throw_error(errc::invalid_argument, "memory_region::remote: offset beyond the region");
    if (len == SIZE_MAX)
        len = size_ - offset;
    if (len > size_ - offset)
        throw_error(errc::invalid_argument, "memory_region::remote: range beyond the region");
    remote_buffer rb;
    rb.addr = reinterpret_cast<std::uintptr_t>(data_) + offset;
    rb.length = len;
    rb.key = rkey_;
    rb.backend = backend_;
    return rb;
}

} // namespace rdmx
