"""Most ranks frozen, one healthy: the flight recorder's trigger must point at the frozen ones.

    MLDEBUG_FR=1 torchrun --standalone --nproc_per_node 4 recipes/fr_frozen_ranks.py
    mldebug fr trigger --analyze     # ranks 1-3 alive but did not answer: they are the finding

After one all_reduce every rank but rank 0 freezes in a C call that holds the GIL (a C
extension that never releases it: no Python thread of the process runs, so its recorder
thread cannot dump), while rank 0 waits healthily in the next all_reduce. Its recorder answers
the trigger; the others cannot. The one rank that answered is not a suspect. ``--freeze
SECONDS`` bounds the freeze (default 600); ``--timeout`` is the collective timeout;
MLDEBUG_SIGNAL=1 also installs the dump handler ``mldebug hang --signal`` uses.
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from gil_hold import hold_gil


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--freeze", type=float, default=600.0)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    if os.environ.get("MLDEBUG_FR"):
        import mldebug.fr

        mldebug.fr.enable()
    if os.environ.get("MLDEBUG_SIGNAL"):  # what `mldebug hang --signal` asks (no ptrace)
        import mldebug

        mldebug.install_dump_handler()
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)  # collective #1: every rank
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())
    if rank != 0:
        hold_gil(args.freeze)  # frozen: holds the GIL in C, nothing else in this process runs
    dist.all_reduce(t)  # collective #2: rank 0 waits here for the frozen ranks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
