"""One rank is stuck outside any collective (a data-loading stall) while the others wait.

    torchrun --standalone --nproc_per_node 4 recipes/hang_outside_collective.py

Rank 2 blocks in load_batch() - here on a lock that is never released, as a stuck data
loader or a deadlocked queue would - while ranks 0, 1 and 3 wait in the gradient all_reduce.
What mldebug should say: `mldebug hang` names rank 2 as the only suspect, "not in any
collective", at load_batch (the lock line below); the others form one group in all_reduce.
"""

from __future__ import annotations

import datetime
import os
import threading

import torch
import torch.distributed as dist

_never_released = threading.Lock()
_never_released.acquire()


def load_batch(rank: int) -> torch.Tensor:
    if rank == 2:
        _never_released.acquire()  # stuck: nobody releases this lock
    return torch.ones(4)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())  # one write: never interleaved
    for _step in range(3):
        batch = load_batch(rank)
        dist.all_reduce(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
