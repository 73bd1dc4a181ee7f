"""One rank skips a collective the others enter: they wait for it until the timeout.

Run (gloo on CPU, nccl when CUDA is there):

    MLDEBUG_FR=1 torchrun --standalone --nproc_per_node 4 recipes/fr_skipped_collective.py

The last rank skips the all_reduce in sync_metrics() (an early return on that rank) and goes
on with other work, so ranks 0..N-2 block in all_reduce #2 until --timeout. While it hangs:

    mldebug fr trigger --analyze   -> rank N-1 never enqueued collective #2; culprit rank N-1

When the timeout fires, every waiting rank dumps on the way out (uncaught RuntimeError), and
the skipping rank dumps on the SIGTERM torchrun sends it: the same analysis on those dumps
names the same rank.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def sync_metrics(rank: int, world: int, t: torch.Tensor) -> None:
    if rank == world - 1 and t.numel() > 0:
        return  # the bug: this rank thinks it has nothing to report
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
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    if os.environ.get("MLDEBUG_FR"):
        import mldebug.fr

        mldebug.fr.enable()
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(4, device=device)
    dist.all_reduce(t)  # collective #1: every rank
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())  # one write: never interleaved
    sync_metrics(rank, world, t)  # collective #2: all but the last rank
    if rank == world - 1:
        time.sleep(args.timeout * 3)  # "other work": no further collective
    dist.barrier()
    print(f"rank {rank} finished (the bug did not trigger?)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
