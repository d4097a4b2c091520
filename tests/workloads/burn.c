/* Test workload: two named hot functions of different cost, for symbolization and
 * flamegraph tests. hot_heavy does 3x the work of hot_light per call, so it should get
 * about 3/4 of the CPU time and energy of the loop.
 *
 * Build: gcc -O0 -g -fno-omit-frame-pointer -fno-inline -o burn burn.c
 * (-O0: at -O1 gcc 12 gives the leaf functions no frame even with -fno-omit-frame-pointer,
 * so a frame-pointer walk from hot_heavy skips main and lands in main's caller)
 * Run:   ./burn SECONDS   (default 5)
 */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) void hot_light(void)
{
	for (unsigned long i = 0; i < 100000; i++)
		sink += i;
}

__attribute__((noinline)) void hot_heavy(void)
{
	for (unsigned long i = 0; i < 300000; i++)
		sink += i;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 5.0;
	double end = now() + secs;
	while (now() < end) {
		hot_heavy();
		hot_light();
	}
	return 0;
}
