// The TCP frame-header decoder (lib/tcp/tcp_wire.hpp) and the check the engine applies to
// a decoded write or read request before touching memory (tcp_domain::find_remote).
//
// Input: a 40-byte header, optionally followed by one byte that, when present, swaps the
// header's key for the key of one of the test regions and its address for an offset from
// that region's base (random 64-bit keys are otherwise out of the fuzzer's reach).
// Properties: decode accepts only what re-encodes to the same bytes, and find_remote only
// grants ranges inside a live region that has the right needed.
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_util.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_wire.hpp"

using namespace rdmx;
using tcp::frame_header;
using tcp::frame_op;

namespace
{

struct fixture {
    // Shared, as domain::open makes it: its regions hold it.
    std::shared_ptr<tcp::tcp_domain> dom = std::make_shared<tcp::tcp_domain>();
    std::vector<std::byte> mem = std::vector<std::byte>(3 * 4096);
    std::unique_ptr<memory_region> rw, ro, gone;
    std::uint64_t gone_key = 0;

    fixture()
    {
        rw = dom->register_memory(mem.data() + 64, 4096 - 128, access::remote_write | access::remote_read);
        ro = dom->register_memory(mem.data() + 4096, 4096, access::remote_read);
        gone = dom->register_memory(mem.data() + 8192, 4096, access::remote_write | access::remote_read);
        gone_key = gone->remote().key;
        gone.reset(); // deregistered: its key must never work again
    }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    static fixture fx;
    if (size < frame_header::wire_size)
        return 0;
    // An exact-size heap copy of the header, so that ASan sees any read past it.
    auto in = std::make_unique<std::byte[]>(frame_header::wire_size);
    std::memcpy(in.get(), data, frame_header::wire_size);
    frame_header h;
    const char* why = nullptr;
    if (frame_header::decode(in.get(), h, &why)) {
        FUZZ_CHECK(why != nullptr);
        return 0;
    }
    frame_header::bytes out;
    h.encode(out.data());
    FUZZ_CHECK(std::memcmp(out.data(), in.get(), frame_header::wire_size) == 0);
    FUZZ_CHECK(h.length <= tcp::max_frame_payload);
    FUZZ_CHECK(h.payload_length() <= h.length);

    if (h.op != frame_op::write && h.op != frame_op::write_imm && h.op != frame_op::read_req)
        return 0;
    if (size > frame_header::wire_size) {
        const memory_region* regions[] = {fx.rw.get(), fx.ro.get()};
        std::uint8_t pick = data[frame_header::wire_size];
        if (pick % 3 == 2) {
            h.key = fx.gone_key;
            h.addr += reinterpret_cast<std::uintptr_t>(fx.mem.data() + 8192);
        } else {
            h.key = regions[pick % 3]->remote().key;
            h.addr += reinterpret_cast<std::uintptr_t>(regions[pick % 3]->data());
        }
    }
    rdmx::access right = h.op == frame_op::read_req ? access::remote_read : access::remote_write;
    tcp::seg s;
    // Regions serve every connection: any engine id will do (no windows here).
    if (!fx.dom->find_remote(h.key, h.addr, h.length, right, s, 1))
        return 0;
    FUZZ_CHECK(h.key != fx.gone_key);
    const memory_region* r = h.key == fx.rw->remote().key ? fx.rw.get() : fx.ro.get();
    FUZZ_CHECK(h.key == r->remote().key);
    FUZZ_CHECK(any(r->access() & right));
    FUZZ_CHECK(s.len == h.length);
    FUZZ_CHECK(s.ptr >= r->data() && s.ptr - r->data() <= static_cast<std::ptrdiff_t>(r->size()));
    FUZZ_CHECK(s.len <= r->size() - static_cast<std::size_t>(s.ptr - r->data()));
    return 0;
}
