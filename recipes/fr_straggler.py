"""One rank is late at every collective (a straggler): the job is slow, not hung.

Run (gloo on CPU):

    MLDEBUG_FR_DIR=/tmp/strag torchrun --standalone --nproc_per_node 4 \\
        recipes/fr_straggler.py --sleeper 2 --sleep-ms 30 --steps 200
    mldebug fr analyze /tmp/strag

Every rank all_reduces a small tensor ``--steps`` times; rank ``--sleeper`` first sleeps
``--sleep-ms`` (a throttled GPU, a slow data loader on that host). Every rank then writes its
flight recorder (``mldebug.fr.dump``) and exits. ``mldebug fr analyze`` names the sleeper in
its straggler section; with ``--sleeper -1`` nobody sleeps and nobody is named. ``--linger S``
keeps the job alive S seconds after the loop (for ``mldebug fr watch``).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleeper", type=int, default=2, help="the late rank (-1: none)")
    parser.add_argument("--sleep-ms", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()
    import mldebug.fr

    mldebug.fr.enable(on_failure=False)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(16)
    print(f"rank {rank} ready", flush=True)
    for _ in range(args.steps):
        if rank == args.sleeper:
            time.sleep(args.sleep_ms / 1000)  # the straggler's extra work
        dist.all_reduce(t)
    mldebug.fr.dump("end of the loop")
    time.sleep(args.linger)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
