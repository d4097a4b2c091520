/* Test workload: spins 0.5 s (its tables load meanwhile), then dlopen()s LIB and calls its
 * lib_outer -> lib_inner for SECONDS. Built -O2 -fomit-frame-pointer by the test.
 * Run: ./dlopen_main LIB SECONDS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
  double secs = atof(argv[2]);
  double t0 = now();
  while (now() - t0 < 0.5) sink++;   /* tables load for what is mapped so far */
  void *h = dlopen(argv[1], RTLD_NOW);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  unsigned long (*outer)(unsigned long) = (unsigned long (*)(unsigned long))dlsym(h, "lib_outer");
  t0 = now();
  while (now() - t0 < secs) sink += outer(100000);
  return 0;
}
