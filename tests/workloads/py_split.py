# Two threads running the same pure-Python code, 3:1: they take turns, heavy_work spinning
# three times per turn and light_work once, so the two share the whole run (the same
# machine conditions) and never contend for the GIL (tests/python.rs checks the energy
# split and the names). At exit it prints each thread's own CPU time, the truth the split
# is checked against: the same work does not always take the same CPU time (on a VM one
# thread's turns can run slower than the other's by a quarter).
import sys
import threading
import time

cpu_s = {}


def spin(n):
    total = 0
    for i in range(n):
        total += i * i % 7  # SPIN_LINE
    return total


def heavy_work(turns, mine, theirs):
    for _ in range(turns):
        mine.acquire()
        for _ in range(3):
            spin(100000)
        theirs.release()
    cpu_s["heavy"] = time.thread_time()


def light_work(turns, mine, theirs):
    for _ in range(turns):
        mine.acquire()
        for _ in range(1):
            spin(100000)
        theirs.release()
    cpu_s["light"] = time.thread_time()


turns = int(sys.argv[1]) if len(sys.argv) > 1 else 40
heavy_turn = threading.Semaphore(1)
light_turn = threading.Semaphore(0)
a = threading.Thread(target=heavy_work, args=(turns, heavy_turn, light_turn))
b = threading.Thread(target=light_work, args=(turns, light_turn, heavy_turn))
a.start()
b.start()
a.join()
b.join()
print("thread cpu_s", cpu_s["heavy"], cpu_s["light"], flush=True)
