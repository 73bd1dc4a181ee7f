"""Ranks at the same call site in different loop iterations: the book's "code loops" case.

    torchrun --standalone --nproc_per_node 4 recipes/hang_loop_iterations.py

Rank 0 resumes from step 1 while the others start at step 0 (a classic resume bug), so in
the broadcast loop rank 0 expects rank 1 to be the source while the others expect rank 0:
everyone waits in the same broadcast line. The stacks are identical line for line; only the
loop counter differs. What mldebug should say: plain `mldebug hang` finds no odd one out in
the stacks (all ranks in broadcast at the same line); `mldebug hang --locals` splits the
ranks by their loop counter and names rank 0 (step=1 vs step=0).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def sync_params(t: torch.Tensor, start: int, world: int) -> None:
    for step in range(start, 8):
        dist.broadcast(t, src=step % world)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())  # one write: never interleaved
    start = 1 if rank == 0 else 0  # the bug: rank 0 resumed one step ahead
    sync_params(torch.ones(4), start, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
