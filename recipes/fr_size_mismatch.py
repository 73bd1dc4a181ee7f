"""One rank all_reduces a tensor of a different size than the others: a size mismatch.

Run (gloo on CPU, nccl when CUDA is there):

    MLDEBUG_FR=1 torchrun --standalone --nproc_per_node 4 recipes/fr_size_mismatch.py

Rank 2 (the last rank when fewer than 3 run) passes 2 elements, the others 4. The
collective cannot complete; every rank blocks until --timeout. Then:

    mldebug fr trigger --analyze   -> size mismatch at collective #2, culprit rank 2,
                                      call site step() in this file

On gloo the culprit's tensor is the smaller one on purpose: a receiver that gets *more*
bytes than it expects aborts the whole process from gloo's C++ thread (EnforceNotMet ->
std::terminate), which no Python hook survives; the other ranks' dumps then name that rank
as missing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def step(rank: int, culprit: int, device: torch.device) -> None:
    n = 2 if rank == culprit else 4  # the bug: one rank's batch has another shape
    t = torch.ones(n, device=device)
    dist.all_reduce(t)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    if os.environ.get("MLDEBUG_FR"):
        import mldebug.fr

        mldebug.fr.enable()  # before init works too
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    culprit = min(2, world - 1)
    dist.all_reduce(torch.ones(4, device=device))  # collective #1: fine everywhere
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())  # one write: never interleaved
    step(rank, culprit, device)  # collective #2: sizes differ on the culprit
    dist.barrier()
    print(f"rank {rank} finished (gloo/nccl accepted mismatched sizes?)", flush=True)
    time.sleep(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
