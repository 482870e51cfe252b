// Backend-independent pieces: URIs, the remote-buffer descriptor, error codes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <rdmx/rdmx.hpp>

namespace rdmx
{
namespace
{

/// uri::parse refuses `text` with invalid_argument, saying "bad address".
void expect_bad_address(const char* text)
{
    try {
        uri::parse(text);
        ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const error& e) {
        EXPECT_EQ(e.code(), errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("bad address"), std::string::npos) << e.what();
    }
}

TEST(uri, parses_schemes_hosts_and_ports)
{
    auto u = uri::parse("rdma://192.168.77.1:7471");
    EXPECT_EQ(u.scheme, scheme::rdma);
    EXPECT_EQ(u.host, "192.168.77.1");
    EXPECT_EQ(u.port, 7471);
    u = uri::parse("tcp://[::1]:80");
    EXPECT_EQ(u.scheme, scheme::tcp);
    EXPECT_EQ(u.host, "::1");
    EXPECT_EQ(u.port, 80);
    EXPECT_EQ(u.to_string(), "tcp://[::1]:80");
    u = uri::parse("example.org");
    EXPECT_EQ(u.scheme, scheme::automatic);
    EXPECT_EQ(u.port, uri::default_port);
    EXPECT_EQ(uri::parse("auto://h:0").port, 0);
    u = uri::parse("shm://svc-1.a_B:9");
    EXPECT_EQ(u.scheme, scheme::shm);
    EXPECT_EQ(u.host, "svc-1.a_B");
    EXPECT_EQ(u.port, 9);
    EXPECT_EQ(u.to_string(), "shm://svc-1.a_B:9");
    EXPECT_EQ(uri::parse("shm://0123456789abcdef").host.size(), uri::max_shm_name);
}

TEST(uri, shm_names_are_short_and_plain)
{
    // 17 bytes, and characters an endpoint's identity would not carry back.
    for (const char* bad :
         {"shm://0123456789abcdefg:1", "shm://a+b:1", "shm://a%b", "shm://[::1]:1", "shm://:1"})
        expect_bad_address(bad);
}

TEST(uri, rejects_malformed_addresses)
{
    for (const char* bad : {"", "udp://h:1", "rdma://:1", "tcp://h:", "tcp://h:65536", "tcp://h:12x",
                            "tcp://::1:80", "tcp://[::1", "tcp://[::1]x", "tcp://a b:1", "tcp://h:-1"})
        expect_bad_address(bad);
}

TEST(remote_buffer, round_trips_through_its_fixed_size_encoding)
{
    remote_buffer rb{.addr = 0x7f0012345678, .length = 1 << 20, .key = 0x1234abcd, .backend = backend::verbs};
    auto bytes = rb.serialize();
    static_assert(sizeof(bytes) == remote_buffer::wire_size);
    auto back = remote_buffer::parse(bytes);
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, rb);
    rb.backend = backend::tcp;
    rb.key = 0xfedcba9876543210;
    EXPECT_EQ(*remote_buffer::parse(rb.serialize()), rb);
    rb.backend = backend::shm;
    EXPECT_EQ(*remote_buffer::parse(rb.serialize()), rb);
}

TEST(remote_buffer, parse_rejects_anything_else)
{
    remote_buffer rb{.addr = 4096, .length = 4096, .key = 7, .backend = backend::tcp};
    auto good = rb.serialize();
    EXPECT_FALSE(remote_buffer::parse(std::span(good).first(31)));
    for (std::size_t i : {0u, 4u, 5u, 6u, 7u}) {
        auto b = good;
        b[i] ^= std::byte{0x40};
        EXPECT_FALSE(remote_buffer::parse(b)) << "byte " << i;
    }
    remote_buffer wrap{.addr = ~0ull - 10, .length = 100, .key = 1, .backend = backend::tcp};
    EXPECT_FALSE(remote_buffer::parse(wrap.serialize())) << "range wraps around";
    remote_buffer wide{.addr = 0, .length = 1, .key = 1ull << 40, .backend = backend::verbs};
    EXPECT_FALSE(remote_buffer::parse(wide.serialize())) << "verbs rkeys are 32 bits";
}

TEST(remote_buffer, parse_rules_at_the_edges)
{
    // docs/wire-format.md section 9. The byte layout, written out.
    remote_buffer rb{.addr = 0x0102030405060708,
                     .length = 0x1112131415161718,
                     .key = 0x2122232425262728,
                     .backend = backend::tcp};
    auto b = rb.serialize();
    const unsigned char expect[32] = {'R',  'D',  'M',  'X',  1,    2,    0,    0,    0x08, 0x07, 0x06,
                                      0x05, 0x04, 0x03, 0x02, 0x01, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13,
                                      0x12, 0x11, 0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21};
    EXPECT_EQ(0, std::memcmp(b.data(), expect, 32));
    // The end of the range, addr + length, must be representable: it may be 2^64 - 1,
    // not 2^64.
    std::uint64_t top = ~std::uint64_t{0};
    EXPECT_TRUE(remote_buffer::parse(remote_buffer{.addr = top - 16, .length = 16, .key = 1}.serialize()));
    EXPECT_FALSE(remote_buffer::parse(remote_buffer{.addr = top - 15, .length = 16, .key = 1}.serialize()));
    EXPECT_TRUE(remote_buffer::parse(remote_buffer{.addr = 0, .length = top, .key = 1}.serialize()));
    // Zero length, and any key: a descriptor names a range, the target checks the key.
    EXPECT_TRUE(remote_buffer::parse(remote_buffer{.addr = 0, .length = 0, .key = 0}.serialize()));
    EXPECT_TRUE(remote_buffer::parse(
        remote_buffer{.addr = 0, .length = 1, .key = top, .backend = backend::tcp}.serialize()));
    EXPECT_TRUE(remote_buffer::parse(
        remote_buffer{.addr = 0, .length = 1, .key = 0xffffffffu, .backend = backend::verbs}.serialize()));
    EXPECT_FALSE(remote_buffer::parse(
        remote_buffer{.addr = 0, .length = 1, .key = 0x100000000u, .backend = backend::verbs}.serialize()));
    // Backend codes 1, 2 and 3 only; exactly 32 bytes.
    for (int code : {0, 4, 255}) {
        auto x = rb.serialize();
        x[5] = static_cast<std::byte>(code);
        EXPECT_FALSE(remote_buffer::parse(x)) << "backend " << code;
    }
    std::vector<std::byte> longer(b.begin(), b.end());
    longer.push_back(std::byte{0});
    EXPECT_FALSE(remote_buffer::parse(longer));
}

TEST(remote_buffer, slice_stays_inside)
{
    remote_buffer rb{.addr = 1000, .length = 100, .key = 1, .backend = backend::tcp};
    auto s = rb.slice(10, 90);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->addr, 1010u);
    EXPECT_EQ(s->length, 90u);
    EXPECT_FALSE(rb.slice(10, 91));
    EXPECT_FALSE(rb.slice(101, 0));
    EXPECT_FALSE(rb.slice(50, ~0ull));
}

TEST(errors, have_readable_messages_in_one_category)
{
    std::error_code ec = errc::remote_access;
    EXPECT_STREQ(ec.category().name(), "rdmx");
    EXPECT_NE(ec.message().find("remote access"), std::string::npos);
    EXPECT_NE(std::error_code(errc::flushed).message().find("flushed"), std::string::npos);
    EXPECT_NE(std::error_code(errc::rnr_retry_exceeded).message().find("RNR"), std::string::npos);
    for (int i = 1; i <= static_cast<int>(errc::canceled); ++i)
        EXPECT_EQ(std::error_code(i, category()).message().find("unknown"), std::string::npos) << i;
    try {
        throw_errno(ENOMEM, "ibv_reg_mr");
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("ibv_reg_mr"), std::string::npos);
        EXPECT_EQ(e.code(), std::errc::not_enough_memory);
    }
    // A provider that fails without errno (libsiw's ibv_create_cq) is never "Success"; a
    // negative errno (libsiw's posts) reads as its positive.
    try {
        throw_errno(0, "ibv_create_cq");
        ADD_FAILURE() << "throw_errno returned";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("ibv_create_cq: provider failed without an errno"),
                  std::string::npos)
            << e.what();
        EXPECT_TRUE(e.code());
        EXPECT_EQ(std::string(e.what()).find("Success"), std::string::npos) << e.what();
    }
    try {
        throw_errno(-EINVAL, "ibv_modify_qp");
        ADD_FAILURE() << "throw_errno returned";
    } catch (const error& e) {
        EXPECT_EQ(e.code(), std::errc::invalid_argument) << e.what();
    }
}

TEST(domain, tcp_scheme_always_opens_the_fallback)
{
    auto d = domain::open("tcp://127.0.0.1:0");
    EXPECT_EQ(d->backend(), backend::tcp);
    EXPECT_EQ(d->limits().device_name, "tcp");
}

TEST(domain, shm_scheme_opens_the_same_host_backend)
{
    auto d = domain::open("shm://unit:0");
    EXPECT_EQ(d->backend(), backend::shm);
    EXPECT_EQ(d->limits().device_name, "shm");
    std::vector<std::byte> buf(64);
    EXPECT_EQ(d->register_memory(buf.data(), buf.size(), access::remote_read)->remote().backend,
              backend::shm);
    EXPECT_EQ(d->create_completion_queue({})->backend(), backend::shm);
}

TEST(domain, shm_listeners_pick_a_free_port_and_hold_their_name)
{
    auto d = domain::open("shm://unit:0");
    auto l = d->listen("shm://unit-ports:0");
    EXPECT_EQ(l->backend(), backend::shm);
    EXPECT_GE(l->port(), 49152);
    auto again = d->listen("shm://unit-ports:0");
    EXPECT_NE(again->port(), l->port());
    try {
        d->listen("shm://unit-ports:" + std::to_string(l->port()));
        ADD_FAILURE() << "two listeners on one shm:// name";
    } catch (const error& e) {
        EXPECT_EQ(e.code(), std::error_code(EADDRINUSE, std::system_category())) << e.what();
        EXPECT_NE(std::string(e.what()).find("bind"), std::string::npos) << e.what();
    }
    // Nobody listens on this name: refused at once, as a closed TCP port.
    try {
        connection_options o;
        o.timeout = std::chrono::seconds(5);
        d->connect("shm://unit-nobody:1", o);
        ADD_FAILURE() << "connected to a name nobody listens on";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
    }
}

TEST(domain, each_domain_takes_the_addresses_of_its_backend_only)
{
    auto shm = domain::open("shm://unit:0");
    auto tcp = domain::open("tcp://127.0.0.1:0");
    const std::pair<domain*, const char*> wrong[] = {
        {shm.get(), "tcp://127.0.0.1:1"}, {shm.get(), "rdma://127.0.0.1:1"}, {tcp.get(), "shm://unit:1"}};
    for (auto [d, address] : wrong) {
        for (int listen = 0; listen < 2; ++listen) {
            try {
                if (listen)
                    d->listen(address);
                else
                    d->connect(address);
                ADD_FAILURE() << to_string(d->backend()) << " took " << address;
            } catch (const error& e) {
                EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
                EXPECT_NE(std::string(e.what()).find(std::string("address on a ") + to_string(d->backend())),
                          std::string::npos)
                    << e.what();
            }
        }
    }
}

TEST(domain, automatic_choice_on_loopback_is_tcp)
{
    // Loopback never maps to an RDMA device usable for RC, so auto:// must pick TCP.
    auto d = domain::open("auto://127.0.0.1:0");
    EXPECT_EQ(d->backend(), backend::tcp);
}

TEST(domain, region_descriptor_matches_the_registration)
{
    auto d = domain::open("tcp://127.0.0.1:0");
    std::vector<std::byte> buf(4096);
    auto mr = d->register_memory(buf.data(), buf.size(), access::remote_read);
    auto rb = mr->remote(100, 200);
    EXPECT_EQ(rb.addr, reinterpret_cast<std::uintptr_t>(buf.data()) + 100);
    EXPECT_EQ(rb.length, 200u);
    EXPECT_EQ(rb.backend, backend::tcp);
    EXPECT_THROW(mr->remote(4000, 200), error);
    auto mr2 = d->register_memory(buf.data(), buf.size(), access::remote_read);
    EXPECT_NE(mr2->remote().key, rb.key) << "keys are per registration";
}

} // namespace
} // namespace rdmx
