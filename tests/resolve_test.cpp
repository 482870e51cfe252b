// Name resolution shared by both backends (lib/resolve.hpp).
#include <gtest/gtest.h>

#include <netinet/in.h>

#include <string>

#include <rdmx/error.hpp>

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

} // namespace
} // namespace rdmx::test
