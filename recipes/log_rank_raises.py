"""A 4-rank job in which one rank raises after a few steps while the others wait in all_reduce.

Run:  torchrun --nproc-per-node 4 recipes/log_rank_raises.py [--culprit 2] [--step 3] [--how raise|kill|sleep]
Then: mldebug log <the launcher's log>   -> names the culprit rank and what it failed with.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def load_batch(step: int, rank: int, culprit: int, bad_step: int, how: str) -> torch.Tensor:
    if rank == culprit and step == bad_step:
        if how == "raise":
            raise ValueError(f"corrupt sample in shard {rank} at step {step}")
        if how == "kill":
            os.kill(os.getpid(), 9)  # what the kernel OOM killer does
        if how == "sleep":
            time.sleep(3600)  # stuck outside any collective
    return torch.ones(4) * rank


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--culprit", type=int, default=2)
    ap.add_argument("--step", type=int, default=3)
    ap.add_argument("--how", choices=["raise", "kill", "sleep"], default="raise")
    ap.add_argument("--timeout", type=float, default=10.0)
    a = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank = dist.get_rank()
    for step in range(a.step + 2):
        x = load_batch(step, rank, a.culprit, a.step, a.how)
        dist.all_reduce(x)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
