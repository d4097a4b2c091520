/* Run-counter workload: one thread alternating two phases of about 40 ms each, so the
 * per-interval counts must tell them apart within one thread.
 *   fault_pages(): maps fresh anonymous memory and touches every 4 KiB page (page faults);
 *   spin():        integer arithmetic only (no page faults).
 * Usage: faults SECONDS [MIN_CPU_S]
 * Runs at least SECONDS, and on until it has had MIN_CPU_S of CPU time (a slow or loaded
 * machine gives it less CPU per second), for at most 60 s. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) long fault_pages(double until) {
    long pages = 0;
    const size_t len = 8 << 20;
    while (now() < until) {
        volatile char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return pages;
        madvise((void *)p, len, MADV_NOHUGEPAGE);
        for (size_t i = 0; i < len; i += 4096) p[i] = 1;
        munmap((void *)p, len);
        pages += len / 4096;
    }
    return pages;
}

__attribute__((noinline)) uint64_t spin(double until) {
    uint64_t x = 1;
    while (now() < until)
        for (int i = 0; i < 100000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

int main(int argc, char **argv) {
    double start = now();
    double end = start + (argc > 1 ? atof(argv[1]) : 2.0);
    double min_cpu = argc > 2 ? atof(argv[2]) : 0;
    volatile uint64_t sink = 0;
    while ((now() < end || cpu() < min_cpu) && now() < start + 60) {
        sink += fault_pages(now() + 0.04);
        sink += spin(now() + 0.04);
    }
    return (int)(sink & 0);
}
