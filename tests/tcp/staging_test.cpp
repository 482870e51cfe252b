// The TCP backend's staging (lib/tcp/tcp_staging.hpp), the path CUDA device memory takes,
// run with host memory: RDMX_TCP_FORCE_STAGING=1 makes a domain stage every region it
// registers. The conformance suite runs whole under the switch too (tests/meson.build,
// conformance-tcp-staged); these tests check what it cannot see: that the bytes really went
// through the chunks, in pieces larger than one chunk and split across SGEs at every
// boundary, and that a domain without the switch stages nothing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <vector>

#include "backends.hpp"
#include "common/test_util.hpp"
#include "tcp/raw_peer.hpp"
#include "tcp/tcp_domain.hpp"
#include "tcp/tcp_engine.hpp"

namespace rdmx::test
{
namespace
{

constexpr std::size_t chunk = tcp::bounce_pool::default_chunk_size;

tcp::bounce_pool& pool_of(domain& d)
{
    return static_cast<tcp::tcp_domain&>(detail::backend_domain(d)).bounce();
}

/// Bytes that differ at every offset and from one buffer to the next (`seed`).
void fill(std::vector<std::byte>& v, unsigned seed)
{
    for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<std::byte>((i * 131u + seed * 7u + (i >> 9)) & 0xff);
}

/// Domains made with the switch set to `mode` ("1": copies at once; "2": copies land
/// only when the engine waits for them, as a GPU's asynchronous ones may) or unset (""); the
/// environment is as it was after.
class tcp_staging : public tcp_loopback, public testing::WithParamInterface<const char*>
{
protected:
    void open(const char* mode)
    {
        const char* before = std::getenv("RDMX_TCP_FORCE_STAGING");
        std::string saved = before ? before : "";
        if (*mode)
            setenv("RDMX_TCP_FORCE_STAGING", mode, 1);
        else
            unsetenv("RDMX_TCP_FORCE_STAGING");
        tcp_loopback::SetUp();
        if (before)
            setenv("RDMX_TCP_FORCE_STAGING", saved.c_str(), 1);
        else
            unsetenv("RDMX_TCP_FORCE_STAGING");
    }
    void SetUp() override {}

    struct pair {
        std::unique_ptr<connection> client, server;
    };
    pair connect_pair()
    {
        auto acc = std::async(std::launch::async, [&] {
            auto req = listener_->get_request(10s);
            if (!req)
                throw std::runtime_error("no request");
            return req->accept({});
        });
        pair p;
        p.client = client_dom_->connect(addr(), {});
        p.server = acc.get();
        return p;
    }
};

TEST_P(tcp_staging, every_operation_moves_staged_memory_through_the_chunks_intact)
{
    open(GetParam());
    const std::size_t size = 3 * chunk + 4096;
    std::vector<std::byte> a(size), b(size);
    fill(a, 1);
    fill(b, 2);
    const access all =
        access::local_write | access::remote_write | access::remote_read | access::remote_atomic;
    auto ma = client_dom_->register_memory(a.data(), a.size(), all);
    auto mb = server_dom_->register_memory(b.data(), b.size(), all);
    EXPECT_EQ(ma->memory_type(), memory_type::host); // staged, and still host memory
    auto p = connect_pair();
    const std::uint64_t out0 = pool_of(*client_dom_).bytes_out(), in0 = pool_of(*server_dom_).bytes_in();

    // A write of more than two chunks from three SGEs whose boundaries fall inside chunks,
    // to an odd offset.
    const sge w[] = {{ma.get(), 3, chunk - 5}, {ma.get(), chunk + 100, 17}, {ma.get(), 2 * chunk, chunk + 9}};
    const std::size_t wlen = w[0].length + w[1].length + w[2].length;
    ASSERT_FALSE(p.client->post_write(w, mb->remote(11, wlen), 1));
    expect_ok(*p.client, 1);
    std::size_t at = 11;
    for (const sge& s : w) {
        ASSERT_EQ(std::memcmp(b.data() + at, a.data() + s.offset, s.length), 0)
            << "write: the piece from offset " << s.offset << " differs";
        at += s.length;
    }
    EXPECT_GE(pool_of(*client_dom_).bytes_out() - out0, wlen);
    EXPECT_GE(pool_of(*server_dom_).bytes_in() - in0, wlen);

    // A read of more than a chunk into two SGEs (the response is staged at the target,
    // the payload at the initiator).
    fill(b, 3);
    const sge r[] = {{ma.get(), 1, chunk / 2 + 3}, {ma.get(), 2 * chunk + 1, chunk}};
    const std::size_t rlen = r[0].length + r[1].length;
    const std::uint64_t sout = pool_of(*server_dom_).bytes_out(), cin = pool_of(*client_dom_).bytes_in();
    ASSERT_FALSE(p.client->post_read(r, mb->remote(7, rlen), 2));
    expect_ok(*p.client, 1);
    ASSERT_EQ(std::memcmp(a.data() + r[0].offset, b.data() + 7, r[0].length), 0);
    ASSERT_EQ(std::memcmp(a.data() + r[1].offset, b.data() + 7 + r[0].length, r[1].length), 0);
    EXPECT_GE(pool_of(*server_dom_).bytes_out() - sout, rlen);
    EXPECT_GE(pool_of(*client_dom_).bytes_in() - cin, rlen);

    // A send into a receive of three SGEs, then an inline send from staged memory.
    fill(a, 4);
    const sge rv[] = {{mb.get(), 0, 1000}, {mb.get(), chunk, chunk}, {mb.get(), 3 * chunk, 4096}};
    ASSERT_FALSE(p.server->post_recv(rv, 10));
    const sge sd[] = {{ma.get(), 5, chunk + 500}};
    ASSERT_FALSE(p.client->post_send(sd, 3));
    expect_ok(*p.client, 1);
    auto got = expect_ok(*p.server, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].byte_len, sd[0].length);
    EXPECT_EQ(std::memcmp(b.data(), a.data() + 5, 1000), 0);
    EXPECT_EQ(std::memcmp(b.data() + chunk, a.data() + 1005, sd[0].length - 1000), 0);
    ASSERT_FALSE(p.server->post_recv({&rv[0], 1}, 11));
    const sge in[] = {{ma.get(), 40, 24}};
    const std::vector<std::byte> expect(a.begin() + 40, a.begin() + 64);
    ASSERT_FALSE(p.client->post_send(in, 4, send_flags::signaled | send_flags::inline_data));
    std::memset(a.data() + 40, 0, 24); // the copy was made at the post
    expect_ok(*p.client, 1);
    expect_ok(*p.server, 1);
    EXPECT_EQ(std::memcmp(b.data(), expect.data(), 24), 0);

    // An atomic whose old value lands in staged memory.
    std::uint64_t v = 40;
    std::memcpy(b.data() + 64, &v, 8);
    ASSERT_FALSE(p.client->post_fetch_add({ma.get(), 8, 8}, mb->remote(64, 8), 2, 5));
    expect_ok(*p.client, 1);
    std::uint64_t old = 0, now = 0;
    std::memcpy(&old, a.data() + 8, 8);
    std::memcpy(&now, b.data() + 64, 8);
    EXPECT_EQ(old, 40u);
    EXPECT_EQ(now, 42u);
    EXPECT_EQ(pool_of(*client_dom_).grown(), 0u) << "one thread at a time needs no chunk beyond the pool";
}

INSTANTIATE_TEST_SUITE_P(modes, tcp_staging, testing::Values("1", "2"),
                         [](const testing::TestParamInfo<const char*>& i) {
                             return std::string(i.param[0] == '1' ? "copies_at_once" : "copies_deferred");
                         });

class tcp_staging_off : public tcp_staging
{
};

TEST_F(tcp_staging_off, a_domain_without_the_switch_stages_nothing)
{
    open("");
    std::vector<std::byte> a(2 * chunk), b(2 * chunk);
    fill(a, 5);
    auto ma = client_dom_->register_memory(a.data(), a.size(), access::local_write);
    auto mb = server_dom_->register_memory(b.data(), b.size(), access::local_write | access::remote_write);
    auto p = connect_pair();
    const sge w{ma.get(), 0, a.size()};
    ASSERT_FALSE(p.client->post_write({&w, 1}, mb->remote(), 1));
    expect_ok(*p.client, 1);
    EXPECT_EQ(a, b);
    EXPECT_EQ(pool_of(*client_dom_).bytes_out(), 0u);
    EXPECT_EQ(pool_of(*server_dom_).bytes_in(), 0u);
}

/// Both domains stage (RDMX_TCP_FORCE_STAGING=1), and every copy of one of them fails
/// (RDMX_TCP_STAGING_FAIL=1), as a driver's copy can: the failure paths without a GPU.
class tcp_staging_faults : public testing::Test
{
protected:
    void open(bool client_fails)
    {
        auto with = [](const char* name, const char* value, auto make) {
            const char* before = std::getenv(name);
            std::string saved = before ? before : "";
            if (value)
                setenv(name, value, 1);
            else
                unsetenv(name);
            auto d = make();
            if (before)
                setenv(name, saved.c_str(), 1);
            else
                unsetenv(name);
            return d;
        };
        auto staged = [&](bool fails) {
            return with("RDMX_TCP_FORCE_STAGING", "1", [&] {
                return with("RDMX_TCP_STAGING_FAIL", fails ? "1" : nullptr,
                            [] { return domain::open("tcp://127.0.0.1:0"); });
            });
        };
        client_dom_ = staged(client_fails);
        server_dom_ = staged(!client_fails);
        listener_ = server_dom_->listen("tcp://127.0.0.1:0");
    }
    struct pair {
        std::unique_ptr<connection> client, server;
    };
    pair connect_pair()
    {
        auto acc = std::async(std::launch::async, [&] { return listener_->get_request(10s)->accept({}); });
        pair p;
        p.client = client_dom_->connect("tcp://127.0.0.1:" + std::to_string(listener_->port()), {});
        p.server = acc.get();
        return p;
    }
    /// The one completion of `c` within 10 s; its status.
    static std::error_code status_of(connection& c)
    {
        auto cs = poll_n(c, 1, 10s);
        EXPECT_EQ(cs.size(), 1u) << "no completion within 10 s";
        return cs.empty() ? std::error_code{} : cs[0].status;
    }
    std::unique_ptr<domain> client_dom_, server_dom_;
    std::unique_ptr<listener> listener_;
};

TEST_F(tcp_staging_faults, a_copy_that_fails_at_the_initiator_fails_its_request_with_local_protection)
{
    open(true);
    std::vector<std::byte> a(1 << 20), b(1 << 20);
    auto ma = client_dom_->register_memory(a.data(), a.size(), access::local_write);
    auto mb = server_dom_->register_memory(b.data(), b.size(), access::local_write | access::remote_write);
    for (std::size_t size : {std::size_t{64}, a.size()}) {
        SCOPED_TRACE(size);
        auto p = connect_pair();
        const sge w{ma.get(), 0, size};
        ASSERT_FALSE(p.client->post_write({&w, 1}, mb->remote(0, size), 1));
        EXPECT_EQ(status_of(*p.client), errc::local_protection);
    }
    // An inline send copies at the post: the post itself says so, and nothing is posted.
    auto p = connect_pair();
    const sge in{ma.get(), 0, 16};
    std::size_t posted = 9;
    const work_request wr{.opcode = opcode::send,
                          .wr_id = 1,
                          .local = {&in, 1},
                          .flags = send_flags::signaled | send_flags::inline_data};
    EXPECT_EQ(p.client->post({&wr, 1}, &posted), errc::local_protection);
    EXPECT_EQ(posted, 0u);
}

TEST_F(tcp_staging_faults, a_copy_that_fails_at_the_target_fails_the_request_as_an_access_error)
{
    open(false);
    std::vector<std::byte> a(1 << 20), b(1 << 20);
    auto ma = client_dom_->register_memory(a.data(), a.size(), access::local_write);
    const access rw = access::local_write | access::remote_write | access::remote_read;
    auto mb = server_dom_->register_memory(b.data(), b.size(), rw);
    // Writes: a small payload comes with its header (copied from the stage), a large one
    // straight into the chunks.
    for (std::size_t size : {std::size_t{64}, a.size()}) {
        SCOPED_TRACE(size);
        auto p = connect_pair();
        const sge w{ma.get(), 0, size};
        ASSERT_FALSE(p.client->post_write({&w, 1}, mb->remote(0, size), 1));
        EXPECT_EQ(status_of(*p.client), errc::remote_access);
    }
    {
        auto p = connect_pair(); // the target cannot copy out its response
        const sge r{ma.get(), 0, 4096};
        ASSERT_FALSE(p.client->post_read({&r, 1}, mb->remote(0, 4096), 2));
        EXPECT_EQ(status_of(*p.client), errc::remote_access);
    }
    // A send whose receive cannot be filled: the receive fails, and the sender learns of it.
    auto p = connect_pair();
    const sge rv{mb.get(), 0, 4096}, sd{ma.get(), 0, 2048};
    ASSERT_FALSE(p.server->post_recv({&rv, 1}, 3));
    ASSERT_FALSE(p.client->post_send({&sd, 1}, 4));
    EXPECT_EQ(status_of(*p.server), errc::local_protection);
    EXPECT_EQ(status_of(*p.client), errc::remote_operation);
}

TEST(shm_staging, a_staged_target_region_is_served_by_cma_through_the_chunks)
{
    // shm://: the initiator's host memory goes by CMA (lib/tcp/tcp_cma.cpp), and a target
    // region that is staged (device memory; here host memory under the switch) takes it
    // through one host chunk at a time, pieces crossing chunk and SGE boundaries.
    const char* before = std::getenv("RDMX_TCP_FORCE_STAGING");
    const std::string saved = before ? before : "";
    setenv("RDMX_TCP_FORCE_STAGING", "1", 1);
    auto sd = domain::open("shm://rdmx-stg:0");
    auto l = sd->listen("shm://rdmx-stg:0");
    if (before)
        setenv("RDMX_TCP_FORCE_STAGING", saved.c_str(), 1);
    else
        unsetenv("RDMX_TCP_FORCE_STAGING");
    auto cd = domain::open("shm://rdmx-stg:0");
    const std::string at = "shm://rdmx-stg:" + std::to_string(l->port());
    auto acc = std::async(std::launch::async, [&] {
        auto req = l->get_request(10s);
        if (!req)
            throw std::runtime_error("no request");
        return req->accept({});
    });
    auto c = cd->connect(at, {});
    auto srv = acc.get();

    const std::size_t size = 3 * chunk + 4096;
    std::vector<std::byte> a(size), back(size), b(size);
    fill(a, 5);
    fill(b, 6);
    auto ma = cd->register_memory(a.data(), a.size(), access::local_write);
    auto mback = cd->register_memory(back.data(), back.size(), access::local_write);
    auto mb = sd->register_memory(b.data(), b.size(),
                                  access::local_write | access::remote_write | access::remote_read);
    const std::uint64_t in0 = pool_of(*sd).bytes_in(), out0 = pool_of(*sd).bytes_out();
    const std::uint64_t cma0 = tcp::cma_requests_completed();
    const sge w[] = {{ma.get(), 3, chunk - 5}, {ma.get(), chunk + 100, 17}, {ma.get(), 2 * chunk, chunk + 9}};
    const std::size_t wlen = w[0].length + w[1].length + w[2].length;
    ASSERT_FALSE(c->post_write(w, mb->remote(11, wlen), 1));
    expect_ok(*c, 1);
    std::size_t off = 11;
    for (const sge& s : w) {
        ASSERT_EQ(std::memcmp(b.data() + off, a.data() + s.offset, s.length), 0)
            << "write: the piece from offset " << s.offset << " differs";
        off += s.length;
    }
    EXPECT_GE(pool_of(*sd).bytes_in() - in0, wlen) << "the staged target took no chunk";

    const sge r[] = {{mback.get(), 1, chunk / 2 + 3}, {mback.get(), 2 * chunk + 1, chunk}};
    const std::size_t rlen = r[0].length + r[1].length;
    ASSERT_FALSE(c->post_read(r, mb->remote(7, rlen), 2));
    expect_ok(*c, 1);
    ASSERT_EQ(std::memcmp(back.data() + r[0].offset, b.data() + 7, r[0].length), 0);
    ASSERT_EQ(std::memcmp(back.data() + r[1].offset, b.data() + 7 + r[0].length, r[1].length), 0);
    EXPECT_GE(pool_of(*sd).bytes_out() - out0, rlen);
    EXPECT_EQ(tcp::cma_requests_completed() - cma0, 2u) << "not both by CMA";

    // A send into a receive of three staged SGEs whose boundaries fall inside chunks.
    fill(a, 7);
    const std::uint64_t in1 = pool_of(*sd).bytes_in();
    const sge rv[] = {{mb.get(), 0, 1000}, {mb.get(), chunk, chunk}, {mb.get(), 3 * chunk, 4096}};
    ASSERT_FALSE(srv->post_recv(rv, 10));
    const sge sd2[] = {{ma.get(), 5, chunk + 500}, {ma.get(), 2 * chunk, 3596}};
    const std::size_t slen = sd2[0].length + sd2[1].length;
    ASSERT_FALSE(c->post_send(sd2, 3));
    expect_ok(*c, 1);
    auto rc = expect_ok(*srv, 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].byte_len, slen);
    std::vector<std::byte> sent(a.begin() + 5, a.begin() + 5 + static_cast<std::ptrdiff_t>(chunk + 500));
    sent.insert(sent.end(), a.begin() + 2 * chunk, a.begin() + 2 * chunk + 3596);
    std::vector<std::byte> got(b.begin(), b.begin() + 1000);
    got.insert(got.end(), b.begin() + chunk, b.begin() + 2 * chunk);
    got.insert(got.end(), b.begin() + 3 * chunk,
               b.begin() + 3 * chunk + static_cast<std::ptrdiff_t>(slen - 1000 - chunk));
    EXPECT_EQ(got, sent) << "the send's bytes are not where the receive's pieces are";
    EXPECT_GE(pool_of(*sd).bytes_in() - in1, slen);
    EXPECT_EQ(tcp::cma_requests_completed() - cma0, 3u) << "the send did not go by CMA";
}

} // namespace
} // namespace rdmx::test
