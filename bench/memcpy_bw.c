/* One core's memcpy bandwidth between two buffers of SIZE, reused as a benchmark's
 * buffers are (issue 29's ">= 0.5x memcpy" rows): bench/shm_vs_tcp.sh runs it beside the
 * transports in the same round.  Usage: memcpy_bw SIZE_BYTES ITERATIONS
 * Prints: size iterations MB/s */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: memcpy_bw SIZE_BYTES ITERATIONS\n");
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 0);
    long iters = strtol(argv[2], NULL, 0);
    char* src = aligned_alloc(4096, size);
    char* dst = aligned_alloc(4096, size);
    if (!src || !dst || iters <= 0)
        return 1;
    memset(src, 1, size);
    memset(dst, 2, size); /* both touched: no first-fault in the timed loop */
    for (long i = 0; i < iters / 10 + 1; ++i)
        memcpy(dst, src, size);
    double t0 = now();
    for (long i = 0; i < iters; ++i) {
        memcpy(dst, src, size);
        __asm__ volatile("" : : "r"(dst) : "memory"); /* keep every copy */
    }
    double t = now() - t0;
    printf("%zu %ld %.0f\n", size, iters, (double)size * (double)iters / t / 1e6);
    free(src);
    free(dst);
    return 0;
}
