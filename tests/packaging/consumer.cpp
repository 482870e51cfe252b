// A program as a user of the installed library writes it: found with pkg-config only.
// It connects to itself over TCP and sends one message.
#include <future>
#include <iostream>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

int main()
{
    auto dom = rdmx::domain::open("tcp://127.0.0.1:0");
    auto lst = dom->listen("tcp://127.0.0.1:0");
    auto server =
        std::async(std::launch::async, [&] { return lst->get_request(std::chrono::seconds(10))->accept(); });
    auto client = dom->connect("tcp://127.0.0.1:" + std::to_string(lst->port()));
    auto conn = server.get();
    std::vector<std::byte> in(5),
        out{std::byte{'h'}, std::byte{'e'}, std::byte{'l'}, std::byte{'l'}, std::byte{'o'}};
    auto rm = dom->register_memory(in.data(), in.size(), rdmx::access::local_write);
    auto sm = dom->register_memory(out.data(), out.size(), rdmx::access::none);
    rdmx::sge r{rm.get(), 0, in.size()}, s{sm.get(), 0, out.size()};
    if (conn->post_recv({&r, 1}, 1) || client->post_send({&s, 1}, 2))
        return 1;
    rdmx::completion c[1];
    for (int i = 0; i < 1000000 && conn->poll(c) == 0; ++i)
        ;
    if (c[0].status || in != out)
        return 1;
    std::cout << "rdmx " << RDMX_VERSION << ": received over tcp\n";
}
