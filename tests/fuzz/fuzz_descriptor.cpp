// rdmx::remote_buffer::parse: anything a peer sends as a descriptor. Properties: parse
// never reads past the input, accepts only exactly 32 bytes, never yields a range that
// wraps, and a parsed descriptor serialises back to the same bytes.
#include <cstring>

#include <rdmx/memory.hpp>

#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    std::span<const std::byte> in{reinterpret_cast<const std::byte*>(data), size};
    auto rb = rdmx::remote_buffer::parse(in);
    if (!rb)
        return 0;
    FUZZ_CHECK(size == rdmx::remote_buffer::wire_size);
    FUZZ_CHECK(rb->addr + rb->length >= rb->addr);
    FUZZ_CHECK(rb->backend == rdmx::backend::tcp || rb->backend == rdmx::backend::verbs ||
               rb->backend == rdmx::backend::shm);
    auto out = rb->serialize();
    FUZZ_CHECK(std::memcmp(out.data(), data, size) == 0);
    auto again = rdmx::remote_buffer::parse(out);
    FUZZ_CHECK(again && *again == *rb);
    // slice() of a valid descriptor stays inside it.
    // (length + 1 wraps to 0 for a descriptor of the whole address space: found by this fuzzer.)
    std::uint64_t off = rb->length == UINT64_MAX ? rb->addr : rb->addr % (rb->length + 1);
    if (auto s = rb->slice(off, rb->length - off)) {
        FUZZ_CHECK(s->addr >= rb->addr && s->addr + s->length <= rb->addr + rb->length);
        FUZZ_CHECK(s->key == rb->key && s->backend == rb->backend);
    }
    return 0;
}
