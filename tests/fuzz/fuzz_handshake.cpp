// The TCP backend's HELLO / ACCEPT / REJECT decoder (lib/tcp/tcp_wire.hpp): the first bytes
// any client, or a hostile listener, sends. The first input byte picks which side decodes
// (listener: expects HELLO; client: expects a reply). A decoded message re-encodes to the
// same bytes, which decode to the same message, and its private data stays within the limit.
#include <cstring>
#include <vector>

#include "fuzz_util.hpp"
#include "tcp/tcp_wire.hpp"

using rdmx::tcp::handshake;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    if (size < 1)
        return 0;
    bool expect_hello = (data[0] & 1) != 0;
    // An exact-size heap copy, so that ASan sees any read past the end.
    std::vector<std::byte> in(reinterpret_cast<const std::byte*>(data + 1),
                              reinterpret_cast<const std::byte*>(data + size));
    auto h = handshake::decode(in, expect_hello);
    if (!h)
        return 0;
    FUZZ_CHECK(in.size() == h->wire_size());
    FUZZ_CHECK(h->private_data_len <= handshake::max_private_data(h->type));
    FUZZ_CHECK(expect_hello == (h->type == rdmx::tcp::handshake_type::hello));
    std::vector<std::byte> out(h->wire_size());
    h->encode(out.data());
    // Decode accepts only what encode writes: padding and reserved bytes are zero.
    FUZZ_CHECK(std::memcmp(out.data(), in.data(), out.size()) == 0);
    FUZZ_CHECK((h->type == rdmx::tcp::handshake_type::reject) == (h->max_rd_atomic == 0));
    auto again = handshake::decode(out, expect_hello);
    FUZZ_CHECK(again);
    FUZZ_CHECK(again->type == h->type && again->max_rd_atomic == h->max_rd_atomic);
    FUZZ_CHECK(again->data().size() == h->data().size());
    FUZZ_CHECK(std::memcmp(again->data().data(), h->data().data(), h->data().size()) == 0);
    return 0;
}
