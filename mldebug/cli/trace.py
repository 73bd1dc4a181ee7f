"""mldebug trace: compare the ranks' recorded execution paths; run a script fully traced."""

from __future__ import annotations

import argparse
import os
import sys

HELP = "show the ranks' execution rings side by side, or run a script with a full trace"
DESCRIPTION = """\
In the job: mldebug.trace.enable(events="calls"|"lines", ring=N) keeps the last N events of
the user's code per thread; they are written at a watchdog stall, on the dump signal, on an
unhandled exception, or with mldebug.trace.dump().

  mldebug trace show DIR                  # ranks side by side, where a rank's path left
  mldebug trace show DIR --json
  mldebug trace run --lines -- python train.py --steps 10
  torchrun --nproc_per_node 4 -m mldebug.trace run train.py   # same, through torchrun

Exit codes: 0 report produced, 1 nothing readable, 2 usage error."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="trace_action", metavar="{show,run}", required=True)
    s = sub.add_parser("show", help="compare the ranks' ring files in a directory",
                       description="Group the ranks by where their recorded path ends and "
                                   "name the first event where a rank left the others' path.")
    s.add_argument("paths", nargs="+", metavar="DIR|FILE",
                   help="the watchdog's directory (its trace/ folder is used) or ring files")
    s.add_argument("--json", action="store_true", help="the report as JSON")
    from mldebug.htmlview import add_view_arguments

    add_view_arguments(s, trace_event=True)
    r = sub.add_parser("run", help="run a Python command with a full per-rank trace",
                       description="Run 'python SCRIPT ARGS' with every call (or line) of the "
                                   "user's code written, timestamped and [host:rank]-prefixed, "
                                   "to one file per rank.")
    r.add_argument("--lines", action="store_true", help="trace every line, not only calls")
    r.add_argument("--out", default="mldebug-trace", metavar="DIR",
                   help="directory for the trace files (created 0700; default ./mldebug-trace)")
    r.add_argument("command", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ARGS",
                   help="the command: a Python interpreter and a script")


def run(args: argparse.Namespace) -> int:
    if args.trace_action == "show":
        from mldebug.cli._common import print_report
        from mldebug.htmlview import check_view_targets, write_views
        from mldebug.trace.analyze import analyze
        from mldebug.trace.collect import abort_notes, load

        check_view_targets(args)
        traces, errors = load(args.paths)
        report = analyze(traces, errors, abort_notes(args.paths))

        def _render(rep: object) -> None:
            from mldebug.render import console
            from mldebug.trace.report import render

            render(rep, console())  # type: ignore[arg-type]

        print_report(report, args.json, _render)
        if traces:
            from mldebug.trace.view import trace_html, trace_trace

            write_views(args, lambda: trace_html(report), lambda: trace_trace(report))
        elif args.html or args.trace_event:
            from mldebug.errors import MldebugError

            raise MldebugError("no ring file could be read, so there is nothing to draw.",
                               "Pass the watchdog's directory (its trace/ folder) or ring files.")
        return 0 if traces else 1
    from mldebug.trace.launch import trace_command

    return trace_command(args.command, args.out, args.lines, os.environ, sys.executable)
