/* Test workload: two processes passing a byte back and forth over pipes, so the machine
 * switches context as fast as it can (a recording at its densest).
 * Run: ./pingpong SECONDS [STOPFILE]
 * Runs for SECONDS, or less when STOPFILE appears (checked every 1000 round trips), so a
 * test can run it until what it records is dense enough, with SECONDS as the cap. At exit
 * it prints `pingpong: N round trips in S s` on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 3;
	const char *stop = argc > 2 ? argv[2] : NULL;
	int a[2], b[2];
	char c = 0;
	long rounds = 0;
	double elapsed;
	if (pipe(a) || pipe(b))
		return 1;
	pid_t child = fork();
	if (child == 0) {
		while (read(a[0], &c, 1) == 1)
			if (write(b[1], &c, 1) != 1)
				break;
		return 0;
	}
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		for (int i = 0; i < 1000; i++)
			if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1)
				return 1;
		rounds += 1000;
		clock_gettime(CLOCK_MONOTONIC, &t);
		elapsed = (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
	} while (elapsed < secs && !(stop && access(stop, F_OK) == 0));
	kill(child, SIGKILL);
	fprintf(stderr, "pingpong: %ld round trips in %.3f s\n", rounds, elapsed);
	return 0;
}
