"""mldebug hang: stacks of every rank on every node, grouped, with the culprit named."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mldebug.cli._common import (
    add_json_argument,
    add_target_arguments,
    fanout_options,
)
from mldebug.fanout import FanoutOptions

HELP = "dump every rank's Python stack (py-spy), group them and name the odd rank out"
DESCRIPTION = """\
Find the rank processes of a hung job (every Python process whose environment carries a
rank: torchrun, deepspeed, accelerate, srun, mpirun workers), dump each with py-spy in
parallel, group identical stacks, and name the suspects: ranks outside any collective while
the others wait in one, the minority when ranks wait in different places, missing ranks.

  mldebug hang                                  # this host
  mldebug hang --nodes node[1-64] --native      # every node, over pdsh/ssh
  mldebug hang --slurm-job 123456 --json        # every node of a SLURM job
  mldebug hang --watch 5                        # hung (stack unchanged) or just slow?
  mldebug hang --out hang-dir; mldebug hang analyze hang-dir
  mldebug hang analyze rank*.txt                # pasted 'py-spy dump' output

The job is only ever read: a dump pauses each process for milliseconds (not at all with
--nonblocking). Exit codes: 0 report produced, 1 nothing collected, 2 usage error."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("which processes")
    t.add_argument("--pid", type=int, metavar="PID",
                   help="this process, or its rank-carrying descendants if it is a launcher")
    t.add_argument("--pattern", metavar="REGEX",
                   help="Python processes whose command line matches (also without RANK)")
    who = t.add_mutually_exclusive_group()
    who.add_argument("--all-users", action="store_true",
                     help="every user's processes (the default when root; else only yours)")
    who.add_argument("--user", metavar="NAME",
                     help="only this user's processes (a name or uid, resolved on each node)")
    d = p.add_argument_group("how to dump")
    d.add_argument("--native", action="store_true", help="include C/C++ frames (py-spy --native)")
    d.add_argument("--nonblocking", action="store_true",
                   help="do not pause the processes while sampling (may be inaccurate)")
    d.add_argument("--locals", action="store_true",
                   help="collect local variables; ranks at one call site in different loop "
                        "iterations are then told apart")
    d.add_argument("--py-spy", metavar="PATH",
                   help="py-spy binary on the nodes (default: beside their Python, then PATH)")
    d.add_argument("--watch", type=float, metavar="S",
                   help="dump twice S seconds apart and mark each group stuck or moving")
    a = p.add_argument_group("report")
    a.add_argument("--all-threads", action="store_true",
                   help="group by every thread's stack, not only the main thread's")
    a.add_argument("--out", "-o", metavar="DIR", help="save the raw dumps and the report in DIR")
    a.add_argument("--fr", action="store_true",
                   help="also make every rank that called mldebug.fr.enable() dump its "
                        "flight recorder, and add the cross-rank analysis (docs/fr.md)")
    add_json_argument(a)
    add_target_arguments(p, default_timeout=20.0,
                         timeout_help="seconds each py-spy dump may take on a node (a node's "
                                      "whole budget: this, doubled with --watch, plus --watch)")
    sub = p.add_subparsers(dest="hang_action", metavar="[analyze]")
    an = sub.add_parser("analyze", help="re-analyse saved dumps (a --out DIR, py-spy JSON or text)",
                        description="Re-run the analysis on a directory written by --out, on "
                                    "'py-spy dump --json' files, or on plain 'py-spy dump' text "
                                    "(pdsh 'host:' prefixes are understood).")
    an.add_argument("paths", nargs="+", metavar="DIR|FILE",
                    help="a directory written by --out, or py-spy dump files (JSON or text)")
    an.add_argument("--all-threads", action="store_true", dest="all_threads_analyze",
                    help="group by every thread's stack, not only the main thread's")
    an.add_argument("--json", action="store_true", dest="json_analyze",
                    help="print the whole report as JSON (schema in docs/)")


def run(args: argparse.Namespace) -> int:
    from mldebug.hang.analyze import analyze
    from mldebug.render import print_json

    if args.hang_action == "analyze":
        from mldebug.hang.collect import load

        coll = load(args.paths)
        report = analyze(coll, all_threads=args.all_threads or args.all_threads_analyze)
        if args.json or args.json_analyze:
            print_json(report.to_dict())
        else:
            from mldebug.hang.report import render

            render(report)
        return 0 if report.processes else 1

    from mldebug.hang.collect import (
        collection_from_results,
        node_docs,
        options_from_args,
        save,
    )
    from mldebug.hang.report import render, render_text

    target = fanout_options(args)
    opts = options_from_args(args)
    results = node_docs(opts, target)
    coll = collection_from_results(results, watch=opts.watch or None)
    report = analyze(coll, all_threads=args.all_threads)
    if args.out:
        out = Path(args.out)
        written = save(out, results, report.to_dict(), render_text(report))
        print(f"mldebug hang: saved {len(written)} dumps and the report in {out}/ "
              f"(re-analyse: mldebug hang analyze {out})", file=sys.stderr)
    fr_doc, fr_analysis = (_flight_recorder(args, target) if args.fr else (None, None))
    if args.json:
        doc = report.to_dict()
        if args.fr:
            doc["flight_recorder"] = fr_doc
        print_json(doc)
    else:
        render(report)
        if args.fr:
            _render_fr(fr_doc, fr_analysis)
    return 0 if report.processes else 1


def _flight_recorder(args: argparse.Namespace,
                     target: FanoutOptions) -> tuple[dict[str, object], object]:
    """Trigger flight-recorder dumps on the same nodes and analyse them across ranks."""
    import tempfile

    from mldebug.fr.analyze import analyze as fr_analyze
    from mldebug.fr.collect import trigger
    from mldebug.fr.loader import load_files

    out = Path(args.out) / "fr" if args.out else Path(tempfile.mkdtemp(prefix="mldebug-hang-fr-"))
    result = trigger(target, out, None)
    doc: dict[str, object] = result.to_dict()
    analysis = None
    if result.files:
        analysis = fr_analyze(load_files(result.files))
        doc["analysis"] = analysis.to_dict()
    else:
        doc["analysis"] = None
        doc["hint"] = ("no rank answered: only ranks that called mldebug.fr.enable() can dump "
                       "on demand (docs/fr.md)")
    return doc, analysis


def _render_fr(doc: dict[str, object] | None, analysis: object) -> None:
    assert doc is not None
    print()
    print(f"Flight recorder: {len(doc['files'])} dump(s) in {doc['out_dir']}/")  # type: ignore[arg-type]
    if analysis is None:
        print(f"  {doc.get('hint')}")
        return
    from mldebug.fr.report import render as fr_render
    from mldebug.render import console

    fr_render(analysis, console())  # type: ignore[arg-type]
