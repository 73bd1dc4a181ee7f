"""A job that is slow, not stuck: rank 2 takes longer per step, the others wait for it.

    torchrun --standalone --nproc_per_node 3 recipes/hang_slow_progress.py

Every step, rank 2 sleeps 0.6 s before the all_reduce (a slow data source); ranks 0 and 1 go
straight to the all_reduce and wait there for it. One snapshot shows rank 2 elsewhere; over a
few seconds every rank moves: the collectives complete and carry data.
What mldebug should say: `mldebug hang --watch 3` names the class "Slow, not stuck" and no
suspect (rank 2 is the slowest, said as such); without --watch a single snapshot cannot tell.
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist


def slow_source(rank: int) -> torch.Tensor:
    if rank == 2:
        time.sleep(0.6)  # slow, but it comes
    return torch.ones(1024)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    step = 0
    while True:
        dist.all_reduce(slow_source(rank))
        step += 1
        if step == 2:
            os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())


if __name__ == "__main__":
    main()
