"""mldebug dist-test: can every rank talk to every other rank?"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from mldebug.errors import MldebugError, UsageError, torch_missing

HELP = "check that every rank can init, all_reduce, barrier and allocate (run under any launcher)"
DESCRIPTION = """\
Distributed smoke test. Run it under your launcher, exactly as your job runs:

  torchrun --nproc_per_node 8 -m mldebug dist-test
  srun python -m mldebug dist-test

or let mldebug start torchrun on this host:

  mldebug dist-test --nproc 4

Each rank prints '[host:local_rank] OK (global rank r/ws)'; rank 0 also prints the torch,
CUDA and NCCL versions. A collective that does not complete within --timeout is reported
as a timeout naming the collective, not left to hang."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, metavar="N",
                   help="launch N ranks on this host with torchrun (default: run as the "
                        "rank the launcher made this process, or a 1-rank world)")
    p.add_argument("--backend", choices=["nccl", "gloo", "mpi", "ucc"],
                   help="process-group backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds a collective may take before it is reported (default: 60)")
    p.add_argument("--fault", help=argparse.SUPPRESS)  # "skip-allreduce:RANK", for tests


def run(args: argparse.Namespace) -> int:
    from mldebug.dist import identity
    from mldebug.disttest import Options, launcher_command, run_worker

    if args.timeout <= 0:
        raise UsageError("--timeout must be positive.", "Pass seconds, e.g. --timeout 60.")
    opts = Options(backend=args.backend, timeout=args.timeout, fault=args.fault)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MldebugError(torch_missing("mldebug dist-test")) from None

    if args.nproc is not None:
        if args.nproc < 1:
            raise UsageError("--nproc must be at least 1.", "Pass e.g. --nproc 4.")
        if identity().is_distributed:
            raise UsageError(
                "--nproc was given inside a launched rank.",
                "Either run 'mldebug dist-test --nproc N' directly, or run "
                "'mldebug dist-test' under your launcher, not both.",
            )
        cmd = launcher_command(args.nproc, opts)
        print(f"mldebug dist-test: launching {args.nproc} ranks: {' '.join(cmd[2:])}", flush=True)
        rc = subprocess.call(cmd)
        status = "all ranks OK" if rc == 0 else f"FAILED (torchrun exit code {rc})"
        print(f"mldebug dist-test: {status}", flush=True)
        return 0 if rc == 0 else 1

    if not identity().is_distributed:  # plain `mldebug dist-test`: a one-rank world
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    sys.stdout.flush()
    return run_worker(opts)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
