/* Test workload for the stack sampler's rate: a loop whose period is exactly PERIOD_NS of
 * wall time, spending the first 3/4 of each period in phase_heavy() and the rest in
 * phase_light(), both spinning on the vDSO's monotonic clock (no system call). Given 2/F
 * (2,002,002 ns for 999 Hz), a sampler ticking at a fixed F meets it at almost the same
 * phase every other tick for seconds on end, and whichever function sits at that phase
 * gets most of the samples.
 *
 * It runs until phase_light has had MIN_LIGHT_S of CPU time, for at most CAP_S of wall
 * time, and prints "time_s HEAVY LIGHT": the thread CPU time measured in each (read at
 * the phases' edges only, so it also counts what preemption took from neither).
 *
 * Build: gcc -O0 -g -fno-omit-frame-pointer -fno-inline -o phase phase.c
 * Run:   ./phase PERIOD_NS MIN_LIGHT_S CAP_S
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

static long long ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Spin until the monotonic clock reaches `until`. */
__attribute__((noinline)) void phase_heavy(long long until)
{
	while (ns(CLOCK_MONOTONIC) < until)
		sink++;
}

__attribute__((noinline)) void phase_light(long long until)
{
	while (ns(CLOCK_MONOTONIC) < until)
		sink++;
}

int main(int argc, char **argv)
{
	long long period = argc > 1 ? atoll(argv[1]) : 2002002;
	double min_light_s = argc > 2 ? atof(argv[2]) : 1.0;
	double cap_s = argc > 3 ? atof(argv[3]) : 60.0;
	long long start = ns(CLOCK_MONOTONIC);
	long long cap = start + (long long)(cap_s * 1e9);
	long long heavy = 0, light = 0;
	long long t = ns(CLOCK_THREAD_CPUTIME_ID);
	while (light < (long long)(min_light_s * 1e9) && start < cap) {
		phase_heavy(start + period * 3 / 4);
		long long mid = ns(CLOCK_THREAD_CPUTIME_ID);
		heavy += mid - t;
		phase_light(start + period);
		t = ns(CLOCK_THREAD_CPUTIME_ID);
		light += t - mid;
		start += period;
	}
	printf("time_s %.9f %.9f\n", heavy / 1e9, light / 1e9);
	return 0;
}
