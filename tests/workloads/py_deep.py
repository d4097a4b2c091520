# Recursion 200 Python frames deep, then a busy loop for argv[1] seconds: deeper than the
# walker's 64-frame limit, so every sample of it stops at the depth limit (tests/python.rs
# checks the probe diagnostic `--debug-probes` logs for it).
import sys
sys.setrecursionlimit(10000)
import time
def down(n, stop):
    if n == 0:
        while time.monotonic() < stop:
            pass
        return 0
    return down(n - 1, stop) + 1
down(200, time.monotonic() + float(sys.argv[1]))
