// disconnect_peer: the client that server_cm's test of clean and unclean ends runs as a
// process of its own (exec'd, so that no RDMA state of the test process is inherited).
//
//   disconnect_peer ADDRESS MODE
//
// Connects to ADDRESS, waits for one byte on stdin (the server accepted), then ends as MODE
// says: `disconnect` (disconnect(), then _exit),
// `destroy` (destroys the connection, then _exit), `exit` (_exit with the connection up:
// the kernel cleans up) or `sigkill` (waits to be killed). It writes one byte to stdout
// once it got there; exit status 1 if it could not connect.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <rdmx/rdmx.hpp>

int main(int argc, char** argv)
{
    if (argc != 3) {
        std::fprintf(stderr, "usage: disconnect_peer ADDRESS disconnect|destroy|exit|sigkill\n");
        return 2;
    }
    const std::string mode = argv[2];
    try {
        auto d = rdmx::domain::open(argv[1]);
        auto c = d->connect(argv[1]);
        char go = 0;
        if (::read(0, &go, 1) != 1)
            _exit(1);
        if (mode == "disconnect")
            c->disconnect();
        else if (mode == "destroy") {
            c.reset();
            // TCP's engine sends the GOODBYE frame on its own thread after the destructor
            // (verbs' goodbye is done when the destructor returns): give it the time.
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        char one = 1;
        [[maybe_unused]] auto n = ::write(1, &one, 1);
        if (mode == "sigkill")
            for (;;)
                ::pause();
        _exit(0); // no destructor runs: the kernel closes what is left
    } catch (const std::exception& e) {
        std::fprintf(stderr, "disconnect_peer: %s\n", e.what());
        _exit(1);
    }
}
