/* Test workload: main -> outer -> inner, where inner spends its time in read() of /dev/zero,
 * so most samples are taken in kernel mode. Built -O2 -fomit-frame-pointer by the test.
 * Run: ./syscalls SECONDS */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
volatile unsigned long sink;
__attribute__((noinline)) void inner(int fd) { char buf[65536]; for (int i = 0; i < 64; i++) sink += read(fd, buf, sizeof buf); }
__attribute__((noinline)) void outer(int fd) { for (int k = 0; k < 4; k++) inner(fd); sink++; }
int main(int argc, char **argv) {
  double secs = atof(argv[1]); int fd = open("/dev/zero", O_RDONLY);
  struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
  do { outer(fd); clock_gettime(CLOCK_MONOTONIC, &t); } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
  return 0;
}
