"""A batch job (no terminal on any rank) whose rank 2 computes a wrong loss: debug it live.

Run it as a scheduler would, stdin /dev/null and no controlling terminal:

    setsid torchrun --standalone --nproc_per_node 4 recipes/pdb_batch_rank.py </dev/null >job.log 2>&1 &

Rank 2 stops at mldebug.breakpoint(rank=2) and prints the command to reach it; ranks 0, 1
and 3 wait for it. What mldebug should show:

    mldebug pdb list        -> rank 2 stopped in step() at the 'loss =' line
    mldebug pdb connect 2   -> pdb in rank 2's frame: 'p scale' shows the odd value, 'c'
                               lets every rank go on and the job finishes
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

import mldebug


def step(rank: int, x: torch.Tensor) -> torch.Tensor:
    scale = 1.0 if rank != 2 else 1e-8  # the bug: one rank scales its loss away
    mldebug.breakpoint(rank=2)
    loss = (x * scale).sum()
    dist.all_reduce(loss)
    return loss


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    loss = step(rank, torch.ones(4) * (rank + 1))
    print(f"rank {rank}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
