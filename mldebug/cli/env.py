"""mldebug env: check the environment (NCCL, torch, limits, network) of this host or many."""

from __future__ import annotations

import argparse
import re

from mldebug.cli._common import (
    add_json_argument,
    add_show_secrets_argument,
    add_target_arguments,
    fanout_options,
    finite_float,
    print_report,
)
from mldebug.errors import UsageError

DESCRIPTION = """\
Gather facts (OS, Python, torch, GPUs, network interfaces, InfiniBand, /dev/shm, memlock,
ptrace, core dumps, py-spy, NCCL_*/TORCH_*/CUDA_* variables) and check them: deprecated or
conflicting variables, invalid NCCL settings, NCCL_SOCKET_IFNAME / NCCL_IB_HCA that select
nothing, debug settings left on, limits that break NCCL or 'mldebug hang'.

  mldebug env                        this host
  mldebug env --nodes node[1-8]      every node, plus what differs between them
  mldebug env --check-port           can this node reach MASTER_ADDR:MASTER_PORT?
  mldebug env --markdown             a block to paste into a bug report
  mldebug env --preset hang          print the exports for debugging a hang

Exit code 1 when an error-level finding exists (usable in a job prologue), else 0.
torch is never imported by mldebug itself: its version, CUDA and NCCL are read by a child
process with a timeout (--torch-import also imports it there)."""

_PORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from mldebug.env.presets import names

    add_json_argument(p)
    p.add_argument("--markdown", "--report", action="store_true", dest="markdown",
                   help="print a Markdown block to paste into a bug report (versions, GPUs, "
                        "topology, packages, variables with secrets redacted, findings)")
    p.add_argument("--preset", choices=names(), metavar="NAME",
                   help="print shell exports for a debugging setup and exit: "
                        + ", ".join(names()) + " (off = the unset lines)")
    p.add_argument("--check-port", nargs="?", const="master", action="append",
                   metavar="HOST:PORT",
                   help="check a TCP port is reachable from each node (no value: "
                        "MASTER_ADDR:MASTER_PORT); repeatable")
    p.add_argument("--torch-timeout", type=finite_float, default=10.0, metavar="S",
                   help="seconds the torch probe may take on each node (default: 10)")
    p.add_argument("--torch-import", action="store_true",
                   help="also import torch (in a child process) to report CUDA availability, "
                        "device count and backends; slower")
    add_show_secrets_argument(p)
    add_target_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.preset:
        from mldebug.env import presets

        print(presets.render(args.preset), end="")
        return 0
    ports = list(args.check_port or [])
    for spec in ports:
        if spec != "master" and not _PORT.match(spec):
            raise UsageError(f"--check-port {spec!r} is not HOST:PORT.",
                             "Pass e.g. --check-port node1:29500, or no value for "
                             "MASTER_ADDR:MASTER_PORT.")
    if args.torch_timeout <= 0:
        raise UsageError("--torch-timeout must be positive.", "Pass seconds, e.g. 10.")
    target = fanout_options(args)

    from mldebug.env.collect import NodeArgs, collect
    from mldebug.env.report import build_report, markdown, render
    from mldebug.render import console

    facts, failed = collect(target, NodeArgs(args.torch_timeout, args.torch_import, ports))
    report = build_report(facts, {r.host: r.error or "no answer" for r in failed})
    if args.markdown:  # a URL password in a finding title, a token in a difference: redacted
        from mldebug.redact import redact_text

        text = markdown(report)
        print(text if args.show_secrets else redact_text(text), end="")
    else:
        print_report(report, args.json, lambda r: render(r, console()),
                     show_secrets=args.show_secrets)
    return 1 if report.has_errors else 0
