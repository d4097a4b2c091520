# Two threads doing the same pure-Python work, 3:1: heavy_work runs 3 * SCALE rounds,
# light_work SCALE rounds (tests/python.rs checks the energy split and the names).
import sys
import threading


def spin(n):
    total = 0
    for i in range(n):
        total += i * i % 7  # SPIN_LINE
    return total


def heavy_work(rounds):
    for _ in range(rounds):
        spin(20000)


def light_work(rounds):
    for _ in range(rounds):
        spin(20000)


scale = int(sys.argv[1]) if len(sys.argv) > 1 else 100
a = threading.Thread(target=heavy_work, args=(3 * scale,))
b = threading.Thread(target=light_work, args=(scale,))
a.start()
b.start()
a.join()
b.join()
