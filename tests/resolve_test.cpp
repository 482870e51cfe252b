// Name resolution shared by both backends (lib/resolve.hpp).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/un.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include <rdmx/error.hpp>

#include "endpoint/ep_address.hpp"
#include "endpoint/ep_wire.hpp"
#include "resolve.hpp"

namespace rdmx::test
{
namespace
{

TEST(resolve, numeric_addresses_of_both_families_keep_their_port_and_length)
{
    auto v4 = detail::resolve(uri::parse("tcp://127.0.0.1:7471"), false, "connect");
    ASSERT_EQ(v4.size(), 1u);
    ASSERT_EQ(v4[0].addr.ss_family, AF_INET);
    EXPECT_EQ(v4[0].len, sizeof(sockaddr_in));
    EXPECT_EQ(ntohs(reinterpret_cast<const sockaddr_in&>(v4[0].addr).sin_port), 7471);

    auto v6 = detail::resolve(uri::parse("tcp://[::1]:9"), false, "connect");
    ASSERT_EQ(v6.size(), 1u);
    ASSERT_EQ(v6[0].addr.ss_family, AF_INET6);
    EXPECT_EQ(v6[0].len, sizeof(sockaddr_in6));
    EXPECT_EQ(ntohs(reinterpret_cast<const sockaddr_in6&>(v6[0].addr).sin6_port), 9);
}

TEST(resolve, a_name_that_does_not_resolve_is_unreachable_naming_the_step_and_host)
{
    try {
        // .invalid never resolves (RFC 6761), and fails without asking a server.
        detail::resolve(uri::parse("tcp://no-such-host.invalid:1"), false, "rdma_resolve_addr");
        FAIL() << "resolved a .invalid name";
    } catch (const error& e) {
        EXPECT_EQ(e.code(), make_error_code(errc::unreachable));
        const std::string what = e.what();
        EXPECT_NE(what.find("rdma_resolve_addr"), std::string::npos) << what;
        EXPECT_NE(what.find("no-such-host.invalid"), std::string::npos) << what;
    }
}

TEST(resolve, an_shm_address_is_one_abstract_unix_socket_per_name_and_port)
{
    auto a = detail::resolve(uri::parse("shm://svc:7"), false, "connect");
    ASSERT_EQ(a.size(), 1u);
    const auto& un = reinterpret_cast<const sockaddr_un&>(a[0].addr);
    EXPECT_EQ(un.sun_family, AF_UNIX);
    EXPECT_EQ(un.sun_path[0], '\0') << "the abstract namespace: no file to clean up";
    const std::string name(un.sun_path + 1, a[0].len - offsetof(sockaddr_un, sun_path) - 1);
    EXPECT_EQ(name, "rdmx-shm/svc:7");
    EXPECT_TRUE(detail::scheme_fits(scheme::shm, backend::shm));
    // auto:// reaches peers on this host through a TCP domain (docs/shm.md, "auto://").
    EXPECT_FALSE(detail::scheme_fits(scheme::automatic, backend::shm));
    EXPECT_TRUE(detail::scheme_fits(scheme::automatic, backend::tcp));
    EXPECT_FALSE(detail::scheme_fits(scheme::tcp, backend::shm));
    EXPECT_FALSE(detail::scheme_fits(scheme::shm, backend::tcp));
    EXPECT_FALSE(detail::scheme_fits(scheme::shm, backend::verbs));
}

/// The abstract name of a UNIX socket address.
std::string abstract_name(const detail::socket_address& a)
{
    const auto& un = reinterpret_cast<const sockaddr_un&>(a.addr);
    EXPECT_EQ(un.sun_family, AF_UNIX);
    EXPECT_EQ(un.sun_path[0], '\0');
    return std::string(un.sun_path + 1, a.len - offsetof(sockaddr_un, sun_path) - 1);
}

TEST(resolve, an_auto_listener_is_found_on_this_host_by_the_tcp_address_it_bound)
{
    // An auto:// listener's UNIX socket is named after its TCP address: exactly the one a
    // client dials, or the wildcard of its family with the same port.
    auto v4 = detail::resolve(uri::parse("auto://127.0.0.1:7000"), false, "connect");
    EXPECT_EQ(abstract_name(detail::auto_local_address(v4[0].addr)), "rdmx-auto/127.0.0.1:7000");
    EXPECT_EQ(abstract_name(detail::auto_local_wildcard(v4[0].addr)), "rdmx-auto/0.0.0.0:7000");
    auto v6 = detail::resolve(uri::parse("auto://[::1]:7001"), false, "connect");
    EXPECT_EQ(abstract_name(detail::auto_local_address(v6[0].addr)), "rdmx-auto/[::1]:7001");
    EXPECT_EQ(abstract_name(detail::auto_local_wildcard(v6[0].addr)), "rdmx-auto/[::]:7001");
    // Loopback is local; so is an address of this network namespace (the wildcard binds);
    // a documentation address (RFC 5737) is on no interface here.
    EXPECT_TRUE(detail::is_local_address(v4[0]));
    EXPECT_TRUE(detail::is_local_address(v6[0]));
    EXPECT_TRUE(detail::is_local_address(detail::resolve(uri::parse("tcp://0.0.0.0:1"), false, "c")[0]));
    EXPECT_FALSE(detail::is_local_address(detail::resolve(uri::parse("tcp://192.0.2.1:1"), false, "c")[0]));
}

// An endpoint on shm carries its listener's name in its identity (40 bytes of connect
// private data): what the peer sends back there is checked like any other field.
TEST(resolve, an_endpoint_identity_carries_an_shm_name_and_refuses_a_bad_one)
{
    auto r = ep::resolve_address("shm://node-a:4000", backend::shm);
    EXPECT_EQ(r.text, "shm://node-a:4000");
    EXPECT_EQ(r.key.family, ep::shm_family);
    ep::identity id{.incarnation = 42, .listener = r.key};
    ep::identity back;
    ASSERT_EQ(ep::decode(ep::encode(id), back), ep::identity_status::ok);
    EXPECT_EQ(back.listener, r.key);
    EXPECT_EQ(ep::to_text(back.listener, backend::shm), "shm://node-a:4000");
    EXPECT_THROW(ep::resolve_address("tcp://127.0.0.1:1", backend::shm), error);
    EXPECT_THROW(ep::resolve_address("auto://node-a:1", backend::shm), error);
    EXPECT_THROW(ep::resolve_address("shm://node-a:1", backend::tcp), error);
    // A hostile peer's names: empty, a byte uri::parse refuses, bytes after the end.
    for (auto bad : {std::array<std::uint8_t, 16>{}, std::array<std::uint8_t, 16>{'a', '/', 'b'},
                     std::array<std::uint8_t, 16>{'a', 0, 'b'}}) {
        ep::identity hostile = id;
        hostile.listener.ip = bad;
        EXPECT_EQ(ep::decode(ep::encode(hostile), back), ep::identity_status::malformed);
    }
}

} // namespace
} // namespace rdmx::test
