# Two threads running the same pure-Python code, 3:1: they take turns, heavy_work spinning
# three times per turn and light_work once, so the two share the whole run (the same
# machine conditions) and never contend for the GIL (tests/python.rs checks the energy
# split and the names).
import sys
import threading


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


def light_work(turns, mine, theirs):
    for _ in range(turns):
        mine.acquire()
        for _ in range(1):
            spin(100000)
        theirs.release()


turns = int(sys.argv[1]) if len(sys.argv) > 1 else 40
heavy_turn = threading.Semaphore(1)
light_turn = threading.Semaphore(0)
a = threading.Thread(target=heavy_work, args=(turns, heavy_turn, light_turn))
b = threading.Thread(target=light_work, args=(turns, light_turn, heavy_turn))
a.start()
b.start()
a.join()
b.join()
