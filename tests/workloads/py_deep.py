# Recursion 200 Python frames deep, then a busy loop for argv[1] seconds, and on until the
# process has had argv[2] s of CPU (default: argv[1]; at most 60 s in all): deeper than the
# walker's 64-frame limit, so every sample of it stops at the depth limit (tests/python.rs
# checks the probe diagnostic `--debug-probes` logs for it).
import sys
sys.setrecursionlimit(10000)
import time
def down(n, stop, cpu, cap):
    if n == 0:
        while (time.monotonic() < stop or time.process_time() < cpu) and time.monotonic() < cap:
            pass
        return 0
    return down(n - 1, stop, cpu, cap) + 1
secs = float(sys.argv[1])
cpu = float(sys.argv[2]) if len(sys.argv) > 2 else secs
t = time.monotonic()
down(200, t + secs, cpu, t + 60)
