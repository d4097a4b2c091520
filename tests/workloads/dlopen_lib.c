/* Test workload: a library loaded with dlopen after the process's unwind tables were
 * loaded (see dlopen_main.c). Built -O2 -fomit-frame-pointer -shared -fPIC by the test. */
volatile unsigned long lib_sink;
__attribute__((noinline)) unsigned long lib_inner(unsigned long n) { unsigned long a = 0; for (unsigned long i = 0; i < n; i++) a += i * i ^ lib_sink; return a; }
unsigned long lib_outer(unsigned long n) { unsigned long s = 0; for (int k = 0; k < 4; k++) s += lib_inner(n + k); lib_sink = s; return s + 1; }
