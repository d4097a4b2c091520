/* A/B workload for `energy-bpf diff`: fixed work per run in two functions. Each of CALLS
 * rounds calls hot() then steady(); hot() does HOT_PCT percent of steady()'s loop, so a
 * run with HOT_PCT 125 does 25% more work in hot() and the same in steady(). One binary
 * serves both sides, so code layout (which alone moves a loop's speed by 10% at -O0) is
 * the same for A and B.
 *
 * At exit it prints the thread CPU time spent in each ("cpu_s HOT STEADY"): the work is
 * fixed, but its cost in CPU time is the machine's, which can change between runs.
 *
 * Build: gcc -O0 -g -fno-omit-frame-pointer -fno-inline -o ab ab.c
 * Run:   ./ab [CALLS [HOT_PCT]]   (defaults 1000 and 100)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define STEADY_ITERS 200000UL

static volatile unsigned long sink;
static unsigned long hot_iters = STEADY_ITERS;

__attribute__((noinline)) void hot(void)
{
	for (unsigned long i = 0; i < hot_iters; i++)
		sink += i;
}

__attribute__((noinline)) void steady(void)
{
	for (unsigned long i = 0; i < STEADY_ITERS; i++)
		sink += i;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	double hot_s = 0, steady_s = 0;
	long calls = argc > 1 ? atol(argv[1]) : 1000;
	if (argc > 2)
		hot_iters = STEADY_ITERS * strtoul(argv[2], NULL, 10) / 100;
	for (long c = 0; c < calls; c++) {
		double t0 = now_s();
		hot();
		double t1 = now_s();
		steady();
		steady_s += now_s() - t1;
		hot_s += t1 - t0;
	}
	printf("cpu_s %.6f %.6f\n", hot_s, steady_s);
	return 0;
}
