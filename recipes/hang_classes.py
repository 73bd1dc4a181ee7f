"""Three ranks off the collective path in three different ways, with the trace ring on.

    torchrun --standalone --nproc_per_node 4 recipes/hang_classes.py

Rank 0 waits in the gradient all_reduce. Rank 1 spins: a Python loop polling a flag nobody
sets (CPU busy, state R). Rank 2 is blocked on a lock never released (asleep, state S). Rank 3
waits for a DataLoader batch whose worker process is stuck in the dataset's __getitem__. Every
rank records its execution ring (mldebug.trace.enable, line events), so the spinning rank is
often caught inside the ring's own tracer.
What mldebug should say: `mldebug hang` names ranks 1, 2 and 3 outside any collective, the
class "Spinning outside any collective" first, rank 1 "spinning" and rank 2 "blocked" from
their CPU time and state, never a frame of mldebug/trace as anyone's location, and the
worker's stuck line (the `time.sleep` in __getitem__) under rank 3 in the text report.
"""

from __future__ import annotations

import datetime
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import mldebug.trace

_never_released = threading.Lock()
_never_released.acquire()
_flag = {"go": False}


class StuckDataset(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(3600)  # worker stuck: storage that never answers
        return torch.ones(4)


def spin() -> int:
    n = 0
    while not _flag["go"]:  # nobody ever sets the flag
        n += 1
    return n


def load_batch(rank: int, loader: DataLoader) -> torch.Tensor:  # type: ignore[type-arg]
    if rank == 1:
        spin()
    elif rank == 2:
        _never_released.acquire()  # blocked: nobody releases this lock
    elif rank == 3:
        return next(iter(loader))[0]
    return torch.ones(4)


def main() -> None:
    mldebug.trace.enable(events="lines", ring=1024)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    loader = DataLoader(StuckDataset(), num_workers=1 if rank == 3 else 0, batch_size=None)
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())
    batch = load_batch(rank, loader)
    dist.all_reduce(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
