# Two threads with different leaf functions, 3:1: train_step spins three times per turn,
# evaluate once, taking turns so neither waits on the GIL (tests/python.rs checks that
# `top` names each thread's function and train_step for the process). Prints the two
# threads' native ids, then runs for argv[1] seconds.
import sys
import threading
import time


def train_step(n):
    total = 0
    for i in range(n):
        total += i * i % 7  # TRAIN_LINE
    return total


def evaluate(n):
    total = 0
    for i in range(n):
        total += i * i % 5  # EVAL_LINE
    return total


def worker(fn, reps, name, mine, theirs, ids, stop):
    ids[name] = threading.get_native_id()
    while True:
        mine.acquire()
        if time.monotonic() > stop:
            theirs.release()
            return
        for _ in range(reps):
            fn(20000)
        theirs.release()


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10
stop = time.monotonic() + seconds
ids = {}
train_turn = threading.Semaphore(1)
eval_turn = threading.Semaphore(0)
a = threading.Thread(target=worker, args=(train_step, 3, "train", train_turn, eval_turn, ids, stop))
b = threading.Thread(target=worker, args=(evaluate, 1, "eval", eval_turn, train_turn, ids, stop))
a.start()
b.start()
while len(ids) < 2:
    time.sleep(0.01)
print(ids["train"], ids["eval"], flush=True)
a.join()
b.join()
