/* A/B workload for `energy-bpf diff`: fixed work per run in two functions. Each of CALLS
 * rounds calls hot() then steady(); hot() does HOT_PCT percent of steady()'s loop, so a
 * build with -DHOT_PCT=125 does 25% more work in hot() and the same in steady().
 *
 * Build: gcc -O0 -g -fno-omit-frame-pointer -fno-inline [-DHOT_PCT=125] -o ab ab.c
 * Run:   ./ab [CALLS]   (default 1000)
 */
#include <stdlib.h>

#ifndef HOT_PCT
#define HOT_PCT 100
#endif

#define STEADY_ITERS 200000UL

static volatile unsigned long sink;

__attribute__((noinline)) void hot(void)
{
	for (unsigned long i = 0; i < STEADY_ITERS * HOT_PCT / 100; i++)
		sink += i;
}

__attribute__((noinline)) void steady(void)
{
	for (unsigned long i = 0; i < STEADY_ITERS; i++)
		sink += i;
}

int main(int argc, char **argv)
{
	long calls = argc > 1 ? atol(argv[1]) : 1000;
	for (long c = 0; c < calls; c++) {
		hot();
		steady();
	}
	return 0;
}
