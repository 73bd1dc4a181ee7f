"""mldebug nccl-log: what NCCL chose and complained about, from NCCL_DEBUG=INFO logs."""

from __future__ import annotations

import argparse

from mldebug.cli._common import add_json_argument, print_report

HELP = "summarise NCCL_DEBUG=INFO logs: versions, transports, interfaces, init, WARNs, collective counts"
DESCRIPTION = """\
Read NCCL debug output - one job log, per-process files from NCCL_DEBUG_FILE=...%h.%p, or a
torchrun log with [rankN]: prefixes - and report per process the NCCL version, the network
transport and interfaces (NET/IB, NET/Socket, NET/<plugin>), which ranks never completed
communicator init, every WARN grouped by message, and collective counts per operation
(with NCCL_DEBUG_SUBSYS=COLL).

  mldebug nccl-log /tmp/nccl-log.*.txt
  mldebug nccl-log main_log.txt --split 'iteration: '     counts per iteration slice

Exit code 0 when a report was produced (also with findings)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="log files or directories of log files")
    p.add_argument("--split", metavar="REGEX",
                   help="start a new slice of collective counts at each line matching REGEX "
                        "(like csplit), e.g. 'iteration: '")
    add_json_argument(p)


def run(args: argparse.Namespace) -> int:
    from mldebug.nccllog.parse import analyze, load
    from mldebug.nccllog.report import render
    from mldebug.render import console

    report = analyze(load(args.files, args.split))
    report.split = bool(args.split)
    print_report(report, args.json, lambda r: render(r, console()))
    return 0
