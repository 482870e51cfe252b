// cma_target: the target process of tests/tcp/cma_test.cpp, so that cross-memory attach
// runs between two processes as it does in use (within one process it always may).
//
//   cma_target ADDRESS reach|unreachable|allocated
//
// Listens on ADDRESS (shm://), writes one byte to stdout once it listens, accepts one
// connection with private data = its 1 MiB region's remote_buffer (remote read and write)
// and a receive of the region's first 256 KiB posted, and exits 0 once the peer
// disconnected. `unreachable` first makes this process one that
// may not reach its peer's memory: as root it becomes nobody (another user), otherwise
// the test process makes itself not dumpable; either way the kernel refuses this
// process's process_vm_readv / process_vm_writev of the peer (EPERM). `allocated`: as
// `reach`, the region from domain::allocate_memory (the peer maps it: shared_map_test.cpp).
#include <grp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <rdmx/rdmx.hpp>

int main(int argc, char** argv)
{
    if (argc != 3) {
        std::fprintf(stderr, "usage: cma_target ADDRESS reach|unreachable|allocated\n");
        return 2;
    }
    const std::string mode = argv[2];
    if (mode == "unreachable" && ::geteuid() == 0) {
        // 65534: nobody (Debian). Groups first: they need the privilege this gives up.
        if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) {
            std::fprintf(stderr, "cma_target: dropping to nobody: %s\n", std::strerror(errno));
            return 1;
        }
    }
    try {
        using namespace std::chrono_literals;
        auto d = rdmx::domain::open(argv[1]);
        auto l = d->listen(argv[1]);
        const auto rights =
            rdmx::access::local_write | rdmx::access::remote_write | rdmx::access::remote_read;
        std::vector<std::byte> mem;
        std::unique_ptr<rdmx::memory_region> mr;
        if (mode == "allocated") {
            mr = d->allocate_memory(1 << 20, rights);
        } else {
            mem.resize(1 << 20);
            mr = d->register_memory(mem.data(), mem.size(), rights);
        }
        char one = 1;
        if (::write(1, &one, 1) != 1)
            return 1;
        auto req = l->get_request(10s);
        if (!req)
            return 1;
        const auto rb = mr->remote().serialize();
        const rdmx::sge first{mr.get(), 0, 256 * 1024};
        const rdmx::recv_request r{.wr_id = 1, .local = {&first, 1}};
        auto c = req->accept({}, rb, {&r, 1});
        // The engine serves the peer's writes and reads; nothing to poll here.
        const auto deadline = std::chrono::steady_clock::now() + 60s;
        while (c->state() == rdmx::connection_state::established &&
               std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(5ms);
        return c->state() == rdmx::connection_state::disconnected ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cma_target: %s\n", e.what());
        return 1;
    }
}
