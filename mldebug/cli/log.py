"""mldebug log: post-mortem of a dead job from its logs - who failed first, who never arrived."""

from __future__ import annotations

import argparse

from mldebug.cli._common import add_json_argument, print_report

DESCRIPTION = """\
Read what a dead job left - the launcher's log with every rank's lines interleaved, per-rank
files (torchrun --log-dir, srun --output=log-%t), or standard input - and name the culprit:

  - the rank whose real error came first (the others' timeouts are named as consequences),
  - a rank killed by SIGKILL (the kernel OOM killer) or crashed by a signal,
  - the ranks whose last enqueued NCCL work is behind the others' (PyTorch watchdog lines),
  - ranks that issued a different collective at the same sequence number,
  - ranks that said nothing while every other rank timed out (stuck outside the collective).

Reads [rankN]: / [defaultN]: / srun -l / mpirun --tag-output prefixes and the times on
PyTorch's log lines. NCCL WARN lines are grouped; `mldebug nccl-log` explains them.

  mldebug log train.log
  mldebug log logs/                      a directory of per-rank files
  kubectl logs job/train | mldebug log -

Exit code 0 whenever the logs were read (whatever the verdict); 2 for a bad path or option."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="log files, directories of per-rank logs, or - for standard input")
    p.add_argument("--world-size", type=int, metavar="N",
                   help="ranks the job had (finds ranks that printed nothing at all)")
    add_json_argument(p)


def run(args: argparse.Namespace) -> int:
    from mldebug.errors import UsageError
    from mldebug.log.analyze import analyze
    from mldebug.log.collect import load
    from mldebug.log.report import render
    from mldebug.render import console

    if args.world_size is not None and not 0 < args.world_size <= 1 << 20:
        raise UsageError("--world-size must be between 1 and 1048576.", "Pass the job's number of ranks.")
    report = analyze(load(args.files, args.world_size))
    print_report(report, args.json, lambda r: render(r, console()))
    return 0
