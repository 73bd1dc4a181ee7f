"""The distributed smoke test every rank runs (``mldebug dist-test``).

Init the process group, all_reduce ones and check the sum equals the world size, barrier,
allocate on the device, and print one ``[host:local_rank] OK (global rank r/ws)`` line per
rank. A collective that times out is reported as a timeout naming the collective.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from mldebug.dist import identity
from mldebug.printing import printflock

TIMEOUT_MARKERS = ("timed out", "timeout", "deadline exceeded")


@dataclass
class Options:
    backend: str | None = None
    timeout: float = 60.0
    fault: str | None = None  # "skip-allreduce:RANK" - for tests: that rank skips the all_reduce


def _is_timeout(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(m in text.lower() for m in TIMEOUT_MARKERS) or isinstance(exc, TimeoutError)


def _fault_rank(fault: str | None, kind: str) -> int | None:
    if not fault:
        return None
    name, _, rank = fault.partition(":")
    return int(rank) if name == kind and rank.isdigit() else None


def run_worker(opts: Options) -> int:
    """Run the checks in this rank. Returns 0 on success, 1 on failure."""
    import torch
    import torch.distributed as dist

    ident = identity()
    rank = ident.rank if ident.rank is not None else 0
    local_rank = ident.local_rank if ident.local_rank is not None else 0
    world = ident.world_size if ident.world_size is not None else 1
    tag = f"[{ident.host}:{local_rank}]"
    where = f"(global rank {rank}/{world})"

    backend = opts.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    step = "init_process_group"
    try:
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = device
        dist.init_process_group(
            backend=backend, timeout=datetime.timedelta(seconds=opts.timeout), **kwargs
        )
        if _fault_rank(opts.fault, "skip-allreduce") == rank:
            printflock(f"{tag} skipping all_reduce on purpose (--fault) {where}")
            time.sleep(opts.timeout + 30)  # stay alive so the others time out, not error
            return 1
        step = "all_reduce"
        t = torch.ones(4, device=device)
        dist.all_reduce(t)
        if not torch.all(t == world):
            printflock(
                f"{tag} FAIL {where}: all_reduce of ones gave {t.tolist()}, expected {world}"
            )
            return 1
        step = "barrier"
        dist.barrier()
        step = "device allocation"
        x = torch.empty(1 << 20, dtype=torch.uint8, device=device)
        x.fill_(1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # report, never hang or dump a raw trace at the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if _is_timeout(exc):
            printflock(
                f"{tag} TIMEOUT {where}: {step} did not complete within {opts.timeout:g}s - "
                f"another rank never joined it ({type(exc).__name__}: {first})"
            )
        else:
            printflock(f"{tag} FAIL {where}: {step} failed: {type(exc).__name__}: {first}")
            if os.environ.get("MLDEBUG_VERBOSE"):
                traceback.print_exc()
        return 1

    printflock(f"{tag} OK {where}")
    if rank == 0:
        cuda = torch.version.cuda or "none"
        nccl = "none"
        if torch.cuda.is_available():
            try:
                nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
            except Exception:
                nccl = "unknown"
        printflock(
            f"{tag} torch {torch.__version__}, CUDA {cuda}, NCCL {nccl}, backend {backend}, "
            f"world size {world}"
        )
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 0


def launcher_command(nproc: int, opts: Options) -> list[str]:
    """The torchrun command line ``mldebug dist-test --nproc N`` runs."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", "-m", "mldebug", "dist-test",
        "--timeout", f"{opts.timeout:g}",
    ]
    if opts.backend:
        cmd += ["--backend", opts.backend]
    if opts.fault:
        cmd += ["--fault", opts.fault]
    return cmd
