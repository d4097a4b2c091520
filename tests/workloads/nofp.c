/* Test workload for table-driven unwinding: main -> outer -> inner, built by the test with
 * Debian's default optimisation and no frame pointers (-O2 -fomit-frame-pointer), so a
 * frame-pointer walk cannot get from the hot leaf to main.
 * Run: ./nofp SECONDS
 */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) unsigned long inner(unsigned long n)
{
	unsigned long a = 0;
	for (unsigned long i = 0; i < n; i++)
		a += i * i ^ sink;
	return a;
}

__attribute__((noinline)) unsigned long outer(unsigned long n)
{
	unsigned long s = 0;
	for (int k = 0; k < 4; k++)
		s += inner(n + k);
	sink = s;
	return s + 1;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 3;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		sink += outer(100000);
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
	return 0;
}
