// LD_PRELOAD shim for benchmarks only: sets TCP_CONGESTION (from $RDMX_BENCH_CC) on every
// TCP socket the process creates, so that a program without such an option (fabtests,
// ucx_perftest) runs under the same congestion control as rdmx_perf --tcp-congestion.
// Per-socket, so the host's sysctl (net.ipv4.tcp_congestion_control) stays as it is.
// Built by bench/fabtests_tcp.sh: cc -O2 -shared -fPIC -o cc_shim.so tcp_congestion_shim.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int socket(int domain, int type, int protocol)
{
    static int (*real)(int, int, int);
    if (!real)
        real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    int fd = real(domain, type, protocol);
    const char *cc = getenv("RDMX_BENCH_CC");
    if (fd >= 0 && cc && *cc && (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc));
    return fd;
}
