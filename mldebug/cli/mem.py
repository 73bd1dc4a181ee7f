"""mldebug mem: memory reports - snapshots offline, ranks across nodes, peak of a tree, probe."""

from __future__ import annotations

import argparse
from typing import Any

from mldebug.cli._common import add_json_argument, add_target_arguments, finite_float, print_report

DESCRIPTION = """\
  mldebug mem report mem-node1-0.pickle          # peak, top sites, leaks, fragmentation, OOMs
  mldebug mem compare step2.pickle step5.pickle  # what grew, by allocation site
  mldebug mem plot mem.pickle -o mem.png         # active memory over time (.png .svg .html)
  mldebug mem top --nodes node[1-8] --watch 10   # every rank's RSS/USS/GPU; names the leaker
  mldebug mem peak -- torchrun ... train.py      # peak memory of the whole process tree
  mldebug mem probe --step 1GiB                  # how much can really be allocated here?

Snapshots are files written by torch.cuda.memory._dump_snapshot() (or mldebug.memory.record()),
read with a restricted unpickler: nothing in them can run code. Only 'probe --device cuda'
imports torch. Exit codes: 0 report produced, 1 nothing could be done, 2 usage error
('peak' exits with the command's own code)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="mem_action", metavar="ACTION", required=True)
    r = sub.add_parser("report", help="analyse one memory snapshot",
                       description="Peak allocated/reserved, top allocation sites at the peak "
                                   "(first user frame; torch frames folded), allocations never "
                                   "freed (leak suspects), fragmentation, OOM events.")
    r.add_argument("snapshot", metavar="SNAPSHOT", help="a torch.cuda.memory._dump_snapshot file")
    r.add_argument("--top", type=int, default=10, metavar="N", help="sites to list (default: 10)")
    _max_size(r)
    add_json_argument(r)
    c = sub.add_parser("compare", help="what grew between two snapshots, by site",
                       description="Bytes held at the end of each snapshot, per allocation site, "
                                   "and the difference B - A.")
    c.add_argument("a", metavar="A", help="the earlier snapshot")
    c.add_argument("b", metavar="B", help="the later snapshot")
    c.add_argument("--top", type=int, default=15, metavar="N", help="sites to list (default: 15)")
    _max_size(c)
    add_json_argument(c)
    pl = sub.add_parser("plot", help="active memory over time, stacked by site (.png .svg .html)",
                        description="Draw the active-memory timeline of a snapshot stacked by "
                                    "allocation site. .png/.svg need matplotlib (mldebug[plot]); "
                                    ".html is one self-contained file that opens offline.")
    pl.add_argument("snapshot", metavar="SNAPSHOT", help="a torch.cuda.memory._dump_snapshot file")
    pl.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="output file: .png, .svg or .html")
    pl.add_argument("--device", type=int, metavar="N",
                    help="CUDA device to draw (default: the first with a trace)")
    pl.add_argument("--top", type=int, default=12, metavar="N",
                    help="sites drawn separately; the rest are summed (default: 12)")
    _max_size(pl)
    add_json_argument(pl)
    t = sub.add_parser("top", help="every rank's RSS / USS / GPU memory, across nodes",
                       description="Find the rank processes (as 'mldebug hang' does) on this "
                                   "host, --nodes or --slurm-job and show their memory; with "
                                   "--watch S, sample for S seconds and name the ranks that "
                                   "grow (leak) and the ranks far from the others (imbalance).")
    t.add_argument("--watch", type=finite_float, default=0.0, metavar="S",
                   help="sample for S seconds and name growing / imbalanced ranks")
    t.add_argument("--pattern", metavar="REGEX",
                   help="Python processes whose command line matches (also without RANK)")
    t.add_argument("--pid", type=int, metavar="PID",
                   help="this process, or its rank-carrying descendants if it is a launcher")
    t.add_argument("--rows", type=int, default=10, metavar="N",
                   help="ranks listed, largest first (default: 10)")
    from mldebug.htmlview import add_view_arguments

    add_view_arguments(t, what=" of every rank's memory over the --watch")
    add_json_argument(t)
    add_target_arguments(t, default_timeout=30.0)
    pk = sub.add_parser("peak", help="run a command; peak memory of its whole process tree",
                        description="Run CMD and report the peak memory of all its processes "
                                    "however deep (a fresh cgroup when possible, else sampling), "
                                    "wall/user/sys time and OOM kills. Exits with CMD's code.")
    pk.add_argument("--interval", type=finite_float, default=0.05, metavar="S",
                    help="sampling interval when no cgroup can be used (default: 0.05)")
    pk.add_argument("--method", choices=("auto", "cgroup", "sampling"), default="auto",
                    help="how to measure (default: auto: cgroup, else sampling)")
    add_json_argument(pk)
    pk.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                    help="the command to run, after --")
    pr = sub.add_parser("probe", help="how much memory can really be allocated here",
                        description="Allocate (and touch) memory in a child process step by "
                                    "step until something stops it: --max, a cgroup limit, the "
                                    "OOM killer, MemoryError or a CUDA OOM. The default --max is "
                                    "10% of available memory (on cuda: of the device's free "
                                    "memory) or 4 GiB, whichever is smaller, and never above "
                                    "the cgroup limit, so the probe never takes a shared node; "
                                    "pass --max to probe further.")
    pr.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where to allocate (default: cpu; cuda needs torch)")
    pr.add_argument("--step", metavar="SIZE",
                    help="bytes per step, e.g. 1GiB (default: 1GiB, smaller for small limits)")
    pr.add_argument("--max", metavar="SIZE",
                    help="stop after this much (default: 10%% of available memory or 4GiB, "
                         "whichever is smaller, at most the cgroup limit)")
    add_json_argument(pr)


def _max_size(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-size", default="8GiB", metavar="SIZE",
                   help="refuse snapshot files larger than this (default: 8GiB)")


def run(args: argparse.Namespace) -> int:
    action = args.mem_action
    return int(_ACTIONS[action](args))


def _print(report: Any, as_json: bool) -> None:
    from mldebug.memory.report import render
    from mldebug.render import console

    print_report(report, as_json, lambda r: render(r, console()))


def _report(args: argparse.Namespace) -> int:
    from mldebug.memory.snapshot import analyze, load
    from mldebug.memory.units import parse_size

    doc = load(args.snapshot, parse_size(args.max_size))
    _print(analyze(doc, args.snapshot, top=args.top), args.json)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from mldebug.memory.snapshot import compare, load
    from mldebug.memory.units import parse_size

    limit = parse_size(args.max_size)
    rep = compare(load(args.a, limit), load(args.b, limit), args.a, args.b, top=args.top)
    _print(rep, args.json)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mldebug.memory import plot
    from mldebug.memory.snapshot import load
    from mldebug.memory.units import fmt_bytes, parse_size

    out = Path(args.output)
    if out.suffix.lower() not in (".png", ".svg", ".html"):
        from mldebug.errors import UsageError

        raise UsageError(f"cannot tell the format of {out.name}.", "Name it .png, .svg or .html.")
    doc = load(args.snapshot, parse_size(args.max_size))
    tl = plot.timeline(doc, args.device, top=args.top)
    del doc
    fmt = plot.write(tl, out, Path(args.snapshot).name)
    if args.json:
        from mldebug.cli._common import print_doc

        print_doc({"format": "mldebug.mem.plot/1", "output": str(out), "kind": fmt,
                    "device": tl.device, "events": tl.events, "peak": tl.peak,
                    "sites": tl.sites, "findings": []})
    else:
        print(f"wrote {out} ({fmt}): device {tl.device}, {tl.events} events, peak "
              f"{fmt_bytes(tl.peak)}, {len(tl.sites)} series")
    return 0


def _top(args: argparse.Namespace) -> int:
    from mldebug.cli._common import fanout_options
    from mldebug.errors import UsageError
    from mldebug.memory.top import analyze_top, collect_top

    if args.watch < 0 or args.rows < 1:
        raise UsageError("--watch must be >= 0 and --rows >= 1.", "e.g. --watch 10 --rows 20")
    from mldebug.htmlview import check_view_targets, write_views

    if args.html and not args.watch:
        raise UsageError("--html draws memory over a --watch.",
                         "Add --watch S, e.g. mldebug mem top --watch 10 --html mem.html.")
    check_view_targets(args)
    results = collect_top(fanout_options(args), watch=args.watch, pid=args.pid,
                          pattern=args.pattern)
    rep = analyze_top(results, watch=args.watch, rows=args.rows)
    _print(rep, args.json)
    if args.html:
        if not rep.processes:
            from mldebug.errors import MldebugError

            raise MldebugError("no rank process was sampled, so there is nothing to draw.",
                               "Check --pid/--pattern and --nodes (see the findings above).")
        from mldebug.memory.view import mem_html

        write_views(args, lambda: mem_html(rep))
    return 0 if rep.processes else 1


def _peak(args: argparse.Namespace) -> int:
    from mldebug.errors import UsageError
    from mldebug.memory.peak import run_peak

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command to run.", "Put it after --: mldebug mem peak -- python train.py")
    if args.interval <= 0:
        raise UsageError("--interval must be positive.", "Pass seconds, e.g. --interval 0.05.")
    rep = run_peak(cmd, method=args.method, interval=args.interval)
    if args.json:
        from mldebug.cli._common import print_doc

        print_doc(rep.to_dict())
    else:
        from mldebug.memory.report import render
        from mldebug.render import console

        render(rep, console(stderr=True))  # stdout stays the command's
    return rep.exit_code


def _probe(args: argparse.Namespace) -> int:
    from mldebug.memory.probe import probe
    from mldebug.memory.units import parse_size

    rep = probe(args.device, step=parse_size(args.step) if args.step else None,
                maximum=parse_size(args.max) if args.max else None)
    if rep.bound is not None:
        import sys

        from mldebug.memory.units import fmt_bytes

        print(f"mem probe: bounded at {fmt_bytes(rep.bound)} by default (from {rep.max_from}: "
              "10% of available memory or 4 GiB, whichever is smaller); pass --max SIZE to "
              "probe further.", file=sys.stderr)
    _print(rep, args.json)
    return 0


_ACTIONS = {"report": _report, "compare": _compare, "plot": _plot, "top": _top,
            "peak": _peak, "probe": _probe}
