"""One rank blocked in one of the everyday ways a rank hangs outside NCCL.

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 python recipes/hang_waits.py MODE

MODE is one of: sleep, queue, lock, event, subprocess, fifo-read, thread-deadlock, dataloader.
Each blocks forever in that call - a polling loop, a queue whose producer died, a lock never
released, an Event never set, a child that never exits, a read from a file that never
answers (as a hung network file system does), two threads that each hold the lock the other
wants, a DataLoader whose worker is stuck. What mldebug should say: `mldebug hang --native`
(and --all-threads for thread-deadlock) names the wait and gives its fix as a hint.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time


def do_sleep() -> None:
    while True:
        time.sleep(3600)  # polls for a file that never appears


def do_queue() -> None:
    queue.Queue().get()  # the producer is gone


def do_lock() -> None:
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never released


def do_event() -> None:
    threading.Event().wait()  # nobody sets it


def do_subprocess() -> None:
    subprocess.Popen(["sleep", "3600"]).wait()  # a child that never ends


def do_fifo_read() -> None:
    path = os.path.join(tempfile.mkdtemp(), "never-written")
    os.mkfifo(path)
    with open(path, "rb") as f:  # open() blocks until a writer comes: none will
        f.read()


def do_thread_deadlock() -> None:
    a, b = threading.Lock(), threading.Lock()
    both = threading.Barrier(2)

    def first() -> None:
        with a:
            both.wait()
            with b:  # held by second()
                pass

    def second() -> None:
        with b:
            both.wait()
            with a:  # held by first()
                pass

    threads = [threading.Thread(target=first, name="first"),
               threading.Thread(target=second, name="second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class _StuckDataset:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        time.sleep(3600)  # a worker stuck on its storage
        return i


def do_dataloader() -> None:
    from torch.utils.data import DataLoader

    for _ in DataLoader(_StuckDataset(), num_workers=1):  # type: ignore[arg-type]
        pass


MODES = {"sleep": do_sleep, "queue": do_queue, "lock": do_lock, "event": do_event,
         "subprocess": do_subprocess, "fifo-read": do_fifo_read,
         "thread-deadlock": do_thread_deadlock, "dataloader": do_dataloader}


def main() -> None:
    mode = sys.argv[1]
    if mode == "dataloader":
        import torch.utils.data  # noqa: F401 - imported before 'ready': seconds on a busy CPU
    print(f"rank {os.environ.get('RANK', 0)} pid {os.getpid()} ready", flush=True)
    MODES[mode]()


if __name__ == "__main__":
    main()
