/* Test workload: two processes passing a byte back and forth over pipes, so the machine
 * switches context as fast as it can (a recording at its densest).
 * Run: ./pingpong SECONDS */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 3;
	int a[2], b[2];
	char c = 0;
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
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
	kill(child, SIGKILL);
	return 0;
}
