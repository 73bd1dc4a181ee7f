"""One rank takes a branch and enters a different collective than the others.

    torchrun --standalone --nproc_per_node 4 recipes/hang_different_collectives.py

Ranks 0-2 all_reduce their gradients; rank 3 thinks it has none (an empty-shard branch),
skips the all_reduce and goes straight to the broadcast of the next step. What mldebug
should say: rank 3 is the suspect, "in broadcast" at step(), while ranks 0-2 wait in
all_reduce at step().
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def step(rank: int, t: torch.Tensor) -> None:
    has_grads = rank != 3  # the bug: rank 3's shard is empty, so it skips the reduction
    if has_grads:
        dist.all_reduce(t)
    dist.broadcast(t, src=0)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())  # one write: never interleaved
    step(rank, torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
