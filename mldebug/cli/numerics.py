"""mldebug numerics: what NanSentinel recorded - the first rank, step and module of a NaN."""

from __future__ import annotations

import argparse

from mldebug.cli._common import add_json_argument, print_report

DESCRIPTION = """\
NanSentinel (from mldebug import NanSentinel) checks the loss and the gradients of every step,
on every rank, before the all-reduce; when something is not finite, the rank where it was born
replays the step under DebugUnderflowOverflow and every rank appends a JSON record to a
private directory. This command merges those records (copy every node's directory into one,
or point it at a shared one) and names the first non-finite value:

  first non-finite: rank 2 (node7), step 7, backward of layers.3.gate (Gate), from finite
  incoming gradients; reproducible on replay, so data or model, not hardware

  mldebug numerics report nan-records
  mldebug numerics report nan-records --json    (first: rank, step, module, phase, reproducible)

Exit code 0 when the records were read (whatever the verdict, 'no non-finite value recorded'
included: every rank's sentinel creates its file when it starts); 1 for a directory that holds
no record file (empty, or not the sentinel's dir=) or cannot be read."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = sub.add_parser("report", help="merge the ranks' records and print one verdict",
                       description="Merge the per-rank record files (numerics-HOST-rankN.jsonl, "
                       "also one directory level down) and name the first non-finite value.")
    r.add_argument("dir", metavar="DIR", help="the dir= NanSentinel wrote its records to")
    add_json_argument(r)


def run(args: argparse.Namespace) -> int:
    from mldebug.numerics.records import analyze, load_records, render
    from mldebug.render import console

    report = analyze(load_records(args.dir))
    print_report(report, args.json, lambda r: render(r, console()))
    return 0
