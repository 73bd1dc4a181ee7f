"""mldebug nccl-log: what NCCL chose and complained about, from NCCL_DEBUG=INFO logs."""

from __future__ import annotations

import argparse

from mldebug.cli._common import add_json_argument, print_report

DESCRIPTION = """\
Read NCCL debug output - one job log, per-process files from NCCL_DEBUG_FILE=...%h.%p, a
pipe, or a log with launcher prefixes ([rank3]:, [1,4]<stdout>:, (pid=N) from Ray, kubectl
timestamps) - and report per process the NCCL version, the network transport and interfaces
(NET/IB, NET/Socket, NET/<plugin>), which ranks never completed communicator init, the known
causes behind the WARN lines (/dev/shm, GPUDirect RDMA, IB completion errors, interfaces,
firewalls, plugins, versions), every other WARN grouped by message, and collective counts
per operation (with NCCL_DEBUG_SUBSYS=COLL).

  mldebug nccl-log /tmp/nccl-log.*.txt
  kubectl logs job/train | mldebug nccl-log -
  mldebug nccl-log main_log.txt --split 'iteration: '     counts per iteration slice

Exit code 0 when a report was produced (also with findings)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="log files, directories of log files, FIFOs, or '-' for standard input")
    p.add_argument("--split", metavar="REGEX",
                   help="start a new slice of collective counts at each line matching REGEX "
                        "(like csplit), e.g. 'iteration: '")
    add_json_argument(p)


def run(args: argparse.Namespace) -> int:
    from mldebug.nccllog.analyze import analyze
    from mldebug.nccllog.parse import load
    from mldebug.nccllog.report import render
    from mldebug.render import console

    report = analyze(load(args.files, args.split))
    report.split = bool(args.split)
    print_report(report, args.json, lambda r: render(r, console()))
    return 0
