"""One rank all_gathers a bigger tensor than the others (uneven all_gather), gloo on CPU.

Run:

    torchrun --standalone --nproc_per_node 3 recipes/fr_uneven_all_gather.py --out DIR

Each rank all_reduces twice, then calls ``all_gather_into_tensor`` where rank 1's input has
3 elements and the others' 2. gloo records the call, then refuses it on every rank
("invalid tensor size"). Every rank then writes its flight recorder twice into ``DIR``:
mldebug's pickle (``DIR/fr_rank<R>``) and torch's own JSON dump (``DIR/json/fr_rank<R>.json``,
from ``_dump_fr_trace_json``), whose ``pg_status`` numbers are strings. gloo refuses the
uneven input on rank 1 before recording it, so ``mldebug fr analyze DIR`` names rank 1 as the
rank that never enqueued collective #3 (ranks 0 and 2 wait in it). tests/fixtures/fr/uneven_all_gather/
holds the dumps of one run (torch 2.13.0, CPU).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist


def gather(rank: int) -> None:
    n = 3 if rank == 1 else 2  # the bug: rank 1's shard has another length
    out = torch.zeros(2 * dist.get_world_size())
    dist.all_gather_into_tensor(out, torch.ones(n))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import mldebug.fr

    mldebug.fr.enable(args.out, trigger=False, on_failure=False)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    try:
        gather(rank)
    except RuntimeError as e:
        print(f"rank {rank}: {str(e).splitlines()[0][:120]}", flush=True)
    mldebug.fr.dump("after the uneven all_gather")
    raw = torch._C._distributed_c10d._dump_fr_trace_json(True, True)
    Path(args.out, "json").mkdir(mode=0o700, exist_ok=True)
    Path(args.out, "json", f"fr_rank{rank}.json").write_text(
        raw if isinstance(raw, str) else raw.decode())
    os._exit(0)  # the group is broken after the refused call: do not wait in shutdown


if __name__ == "__main__":
    main()
