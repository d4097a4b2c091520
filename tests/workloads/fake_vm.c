// A process that looks like a VM to the host: run it under a hypervisor's program name
// (`qemu-system-x86_64`, `firecracker`) with the hypervisor's flags, e.g.
//   qemu-system-x86_64 -name guest=vm1,debug-threads=on -smp 2
//   firecracker --id vm2 --vcpus 2
// It starts one thread per vCPU (`-smp N` / `--vcpus N`, default 1), named as the
// hypervisor names them (`CPU n/KVM`, `fc_vcpu n`; `debug-threads=off` or no `-name`
// leaves qemu's threads unnamed, as qemu does), plus one I/O thread (`IO iothread1`,
// `fc_api`). vCPU threads burn FAKE_VM_VCPU_PCT percent of a CPU (default 100), the I/O
// thread and the main loop FAKE_VM_IO_PCT (default 5), in 10 ms periods. Runs until killed.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

struct job {
    char name[16];
    int pct;
};

static void *burn(void *arg) {
    struct job *j = arg;
    if (j->name[0])
        pthread_setname_np(pthread_self(), j->name);
    const long period = 10000000L;
    volatile unsigned long x = 0;
    for (;;) {
        long start = now_ns();
        long busy = period * j->pct / 100;
        while (now_ns() - start < busy)
            x++;
        long left = period - (now_ns() - start);
        if (left > 0) {
            struct timespec ts = {0, left};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static int env_pct(const char *name, int dflt) {
    const char *v = getenv(name);
    return v ? atoi(v) : dflt;
}

int main(int argc, char **argv) {
    int firecracker = strstr(argv[0], "firecracker") != NULL;
    int vcpus = 1, named = firecracker;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "-smp") || !strcmp(argv[i], "--vcpus"))
            vcpus = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-name") && strstr(argv[i + 1], "debug-threads=on"))
            named = 1;
    }
    if (vcpus < 1)
        vcpus = 1;
    int vcpu_pct = env_pct("FAKE_VM_VCPU_PCT", 100), io_pct = env_pct("FAKE_VM_IO_PCT", 5);
    struct job *jobs = calloc(vcpus + 2, sizeof *jobs);
    for (int i = 0; i < vcpus; i++) {
        if (named)
            snprintf(jobs[i].name, sizeof jobs[i].name, firecracker ? "fc_vcpu %d" : "CPU %d/KVM", i);
        jobs[i].pct = vcpu_pct;
    }
    if (named)
        snprintf(jobs[vcpus].name, sizeof jobs[vcpus].name, firecracker ? "fc_api" : "IO iothread1");
    jobs[vcpus].pct = io_pct;
    for (int i = 0; i <= vcpus; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, burn, &jobs[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    // The main loop: emulator work, unnamed like qemu's main thread.
    jobs[vcpus + 1].pct = io_pct;
    burn(&jobs[vcpus + 1]);
    return 0;
}
