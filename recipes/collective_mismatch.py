"""Rank 0 issues one extra all_reduce that no other rank joins: the classic collective hang.

Run (gloo on CPU, nccl when CUDA is there):

    torchrun --standalone --nproc_per_node 4 recipes/collective_mismatch.py

Every rank blocks: rank 0 in the extra all_reduce, ranks 1-3 in the barrier after it.
What mldebug should say:

    mldebug hang             -> rank 0 is the only suspect (all_reduce at buggy(), the
                                 'extra' line below); ranks 1-3 wait together in barrier
    mldebug fr trigger + fr analyze (with MLDEBUG_FR=1) -> first divergence at the
                                 extra all_reduce, culprit rank 0

The job waits for --timeout seconds (default 600) before the collective times out.
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist


def buggy(rank: int, t: torch.Tensor) -> None:
    dist.all_reduce(t)  # every rank
    if rank == 0:
        dist.all_reduce(t)  # extra: only rank 0 - the bug


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    if os.environ.get("MLDEBUG_FR"):
        import mldebug.fr

        mldebug.fr.enable()
    rank = dist.get_rank()
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())  # one write: never interleaved
    t = torch.ones(4, device=device)
    buggy(rank, t)
    dist.barrier()
    print(f"rank {rank} finished (the bug did not trigger?)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
