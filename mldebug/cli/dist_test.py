"""mldebug dist-test: can every rank talk to every other rank?"""

from __future__ import annotations

import argparse
import os
import sys

from mldebug.cli._common import finite_float
from mldebug.errors import MldebugError, UsageError, torch_missing

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
    from mldebug.cli._common import add_json_argument

    p.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", type=int, metavar="N",
                   dest="nproc",
                   help="launch N ranks on this host with torchrun, in a private network "
                        "namespace where one can be made (default: run as the rank the "
                        "launcher made this process, or a 1-rank world)")
    p.add_argument("--backend", choices=["nccl", "gloo", "mpi", "ucc"],
                   help="process-group backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--timeout", type=finite_float, default=60.0, metavar="S",
                   help="seconds each collective (init, all_reduce, barrier) may take before "
                        "it is reported as a timeout (default: 60)")
    p.add_argument("--max-nproc", type=int, metavar="N",
                   help=f"allow --nproc up to N (default: {MAX_NPROC_PER_CPU} per CPU, at "
                        f"least {MIN_MAX_NPROC}): a typo must not spawn ranks until the "
                        "OOM killer fires")
    add_json_argument(p)
    p.add_argument("--fault", help=argparse.SUPPRESS)  # "skip-allreduce:RANK", for tests


MAX_NPROC_PER_CPU = 4
MIN_MAX_NPROC = 16


def check_nproc(nproc: int | None, max_nproc: int | None) -> None:
    """``--nproc`` within bounds (before torch is imported): at least 1, at most
    ``--max-nproc`` (default: 4 per CPU, at least 16)."""
    if nproc is None:
        return
    if nproc < 1:
        raise UsageError("--nproc must be at least 1.", "Pass e.g. --nproc 4.")
    limit = max_nproc if max_nproc is not None else max(
        MIN_MAX_NPROC, MAX_NPROC_PER_CPU * (os.cpu_count() or 1))
    if nproc > limit:
        raise UsageError(f"--nproc {nproc} is over the limit of {limit} ranks on this host "
                         f"({'--max-nproc' if max_nproc is not None else 'default: 4 per CPU'}).",
                         f"Pass a smaller --nproc, or --max-nproc {nproc} if you mean it.")


def run(args: argparse.Namespace) -> int:
    check_nproc(args.nproc, args.max_nproc)
    from mldebug.cli._common import check_seconds, print_report
    from mldebug.dist import identity
    from mldebug.disttest.report import RankResult, analyze, render
    from mldebug.disttest.worker import Options, launch, nccl_without_cuda, run_worker
    from mldebug.render import console

    check_seconds("--timeout", args.timeout)
    opts = Options(backend=args.backend, timeout=args.timeout, fault=args.fault,
                   quiet=args.json)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MldebugError(torch_missing("mldebug dist-test")) from None

    if args.nproc is not None:
        if identity().is_distributed:
            raise UsageError(
                "--nproc was given inside a launched rank.",
                "Either run 'mldebug dist-test --nproc N' directly, or run "
                "'mldebug dist-test' under your launcher, not both.",
            )
        why = nccl_without_cuda(args.backend)
        if why:  # one line here instead of the same failure from every rank
            ranks = [RankResult(r, args.nproc, status="fail", step="init_process_group",
                                message=why) for r in range(args.nproc)]
            report = analyze(args.nproc, ranks)
            print_report(report, args.json, lambda r: print(f"mldebug dist-test: FAIL: {why}. "
                                                            f"{r.findings[0].fix}"))
            return 1
        say = (lambda line: None) if args.json else (lambda line: print(line, end="", flush=True))
        if not args.json:
            print(f"mldebug dist-test: launching {args.nproc} ranks", flush=True)
        ranks, rc, private = launch(args.nproc, opts, say)
        report = analyze(args.nproc, ranks, rc)
        if not args.json:
            status = "all ranks OK" if rc == 0 and report.ok else f"FAILED (torchrun exit code {rc})"
            net = "" if private else " (no private network namespace could be made: the " \
                "rendezvous store listened on every interface)"
            print(f"mldebug dist-test: {status}{net}", flush=True)
        print_report(report, args.json, lambda r: render(r, console()))
        return 0 if rc == 0 and report.ok else 1

    if not identity().is_distributed:  # plain `mldebug dist-test`: a one-rank world
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    sys.stdout.flush()
    result = run_worker(opts)
    if args.json:
        print_report(analyze(result.world_size, [result]), True, lambda r: None)
    return 0 if result.status == "ok" else 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
