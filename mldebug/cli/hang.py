"""mldebug hang: stacks of every rank on every node, grouped, with the culprit named."""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from pathlib import Path
from typing import Any

from mldebug.cli._common import (
    add_json_argument,
    add_show_secrets_argument,
    add_target_arguments,
    fanout_options,
    finite_float,
)

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
  mldebug hang --job run:abc123                 # one job of several on shared nodes

Processes are grouped into jobs first (elastic run id, SLURM job+step, MASTER_ADDR:PORT,
launcher) and each job gets its own verdict. Inside a SLURM allocation, plain
'mldebug hang' looks at this node only: use --slurm-job $SLURM_JOB_ID for every node.

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
    d.add_argument("--watch", type=finite_float, metavar="S",
                   help="dump twice S seconds apart and mark each group stuck or moving")
    from mldebug.htmlview import add_view_arguments

    add_view_arguments(d, force=False, what=" of the ranks' state at both dumps (with --watch;"
                       " --force replaces a file mldebug wrote)")
    d.add_argument("--store", metavar="HOST:PORT",
                   help="the job's TCPStore (its MASTER_ADDR:MASTER_PORT), where the ranks' "
                        "torch debug servers are registered; default: from the ranks' or their "
                        "launcher's environment and command line (docs/hang.md)")
    d.add_argument("--debug-image", metavar="IMAGE",
                   help="with --k8s/--k8s-job: for pods whose ranks neither py-spy nor a torch "
                        "debug server read, an ephemeral container from IMAGE (python3 and "
                        "py-spy in it) via kubectl debug --profile=sysadmin (docs/k8s.md, the "
                        "route ladder)")
    d.add_argument("--signal", nargs="?", const="SIGUSR1", metavar="SIG",
                   help="no ptrace: send SIG (default SIGUSR1) to the ranks and collect the dumps "
                        "their mldebug.watchdog()/install_dump_handler() writes (docs/capture.md)")
    a = p.add_argument_group("report")
    a.add_argument("--all-threads", action="store_true",
                   help="group by every thread's stack, not only the main thread's")
    a.add_argument("--job", metavar="KEY",
                   help="analyse only this job (a key from the report, e.g. run:abc123 or "
                        "master:10.0.0.1:29500)")
    a.add_argument("--all", action="store_true",
                   help="list every suspect, group and error (default: one screen, with "
                        "'N more')")
    a.add_argument("--out", "-o", metavar="DIR", help="save the raw dumps and the report in DIR "
                   "(a new or empty directory)")
    a.add_argument("--force", action="store_true",
                   help="with --out: replace a directory an earlier 'mldebug hang --out' wrote")
    a.add_argument("--fr", action="store_true",
                   help="also make every rank that called mldebug.fr.enable() dump its "
                        "flight recorder, and add the cross-rank analysis (docs/fr.md)")
    a.add_argument("--no-fr", action="store_true",
                   help="never ask the ranks' flight recorders (by default they are asked "
                        "only when the stacks cannot tell which rank caused a collective "
                        "mismatch: a subgroup collective, a call matched out of order)")
    a.add_argument("--fr-dir", metavar="DIR",
                   help="with --fr: the ranks' dump directory when enable(dump_dir=...) set one "
                        "(default: as enable(); MLDEBUG_FR_DIR of each rank is found anyway)")
    add_json_argument(a)
    add_show_secrets_argument(a)
    add_target_arguments(p, default_timeout=20.0,
                         timeout_help="seconds each py-spy dump may take on a node (a node's "
                                      "whole budget: this, doubled with --watch, plus --watch)")
    sub = p.add_subparsers(dest="hang_action", metavar="[analyze]")
    an = sub.add_parser("analyze", help="re-analyse saved dumps (a --out DIR, a watchdog's DIR, "
                                        "py-spy JSON or text, faulthandler text)",
                        description="Re-run the analysis on a directory written by --out or by "
                                    "mldebug.watchdog() (with its faulthandler/ texts), on "
                                    "'py-spy dump --json' files, on plain 'py-spy dump' text "
                                    "(pdsh 'host:' prefixes are understood), or on Python "
                                    "faulthandler text.")
    an.add_argument("paths", nargs="+", metavar="DIR|FILE",
                    help="a directory written by --out or mldebug.watchdog(), or dump files "
                         "(py-spy JSON or text, faulthandler text)")
    an.add_argument("--all-threads", action="store_true", dest="all_threads_analyze",
                    help="group by every thread's stack, not only the main thread's")
    an.add_argument("--json", action="store_true", dest="json_analyze",
                    help="the report as JSON (docs/hang.md, 'JSON')")
    an.add_argument("--job", metavar="KEY", dest="job_analyze", help="only this job")
    an.add_argument("--all", action="store_true", dest="all_analyze",
                    help="list every suspect, group and error")


def _secrets(doc: dict[str, Any], args: argparse.Namespace) -> Any:
    """``doc`` with command lines and environments redacted, unless --show-secrets."""
    from mldebug.redact import redact_doc

    return doc if getattr(args, "show_secrets", False) else redact_doc(doc)


def _rebase(obj: Any, old: str, new: str) -> Any:
    """Every string path under ``old`` in a JSON-like document, moved under ``new``."""
    if isinstance(obj, str):
        return new + obj[len(old):] if obj == old or obj.startswith(old + "/") else obj
    if isinstance(obj, list):
        return [_rebase(x, old, new) for x in obj]
    if isinstance(obj, dict):
        return {k: _rebase(v, old, new) for k, v in obj.items()}
    return obj


def run(args: argparse.Namespace) -> int:
    from mldebug.cli import why
    from mldebug.cli.envelope import wrap
    from mldebug.why.join import join

    if args.hang_action == "analyze":
        from mldebug.hang.analyze import analyze
        from mldebug.hang.collect import load
        from mldebug.hang.report import render, write_json

        report = analyze(load(args.paths),
                         all_threads=args.all_threads or args.all_threads_analyze,
                         job=args.job or args.job_analyze)
        if args.json or args.json_analyze:
            write_json(wrap(_secrets(report.to_dict(), args)))
        else:
            render(report, show_all=args.all or args.all_analyze)
        return 0 if report.processes else 1

    from mldebug.hang.options import options_from_args, start_local
    from mldebug.htmlview import check_view_targets, write_views

    if args.html and not args.watch:
        from mldebug.errors import UsageError

        raise UsageError("--html draws the ranks' state over a --watch.",
                         "Add --watch S, e.g. mldebug hang --watch 5 --html hang.html.")
    check_view_targets(args)
    target = fanout_options(args)
    opts = options_from_args(args)
    out = None
    if args.out:  # checked before anything runs; the resolved path
        from mldebug.hang.collect import check_out

        out = check_out(Path(args.out), force=args.force)
    docs: Any = None
    ladder = None
    if args.debug_image and target.k8s is None:
        from mldebug.errors import UsageError

        raise UsageError("--debug-image is for Kubernetes pods (kubectl debug).",
                         "Add --k8s SELECTOR or --k8s-job NAME (docs/k8s.md).")
    if target.k8s is not None and not args.signal:  # the route ladder per pod
        from mldebug.hang.ladder import K8sLadder

        ladder = K8sLadder(args.debug_image)
        docs = ladder.docs
    elif args.signal:  # the ranks dump themselves (mldebug.capture), no py-spy
        from mldebug.hang.signal_collect import signal_docs

        docs = functools.partial(signal_docs, signal=args.signal)
    elif target.is_local and out is None:
        # py-spy starts now; the analysis and the report load while the dumps run
        docs = start_local(opts)
    from mldebug.hang.analyze import analyze
    from mldebug.hang.collect import collect, save_report, staged_out
    from mldebug.hang.report import render, render_text, write_json

    # --out: written into a private directory beside it, swapped in at the end (all or nothing)
    with staged_out(out, force=args.force) if out is not None else contextlib.nullcontext() as stage:
        where = stage.path if stage is not None else None
        results, coll, written = collect(opts, target, progress=not args.json, docs=docs,
                                         out=where, show_secrets=args.show_secrets)
        report = analyze(coll, all_threads=args.all_threads, job=args.job)
        # `mldebug why`'s join runs on the same evidence (one job's): the stacks' claim is
        # taken before flight.settle folds the recorder's answer in (that is the fr claim)
        joined = len(report.jobs) == 1
        items = [why.live_hang_item(report, str(out or "live"))] if joined else []
        record = None
        from mldebug.hang import flight

        # the stacks could not tell who caused a collective mismatch: the ranks' flight
        # recorders can (mldebug.fr.enable()), so they are asked as --fr asks them
        if args.fr or (not args.no_fr and len(report.jobs) == 1 and flight.needs_fr(report)):
            record = flight.collect(target, where, args.timeout, fr_dir=args.fr_dir,
                                    pids=[p.pid for p in report.processes])
            if where is not None and out is not None:  # the paths it will have
                record.doc = _rebase(record.doc, str(where), str(out))
            if record.analysis is not None:
                flight.settle(report, record.analysis)
            fr_item = why.live_fr_item(record.dumps, record.analysis,
                                       str(out / "fr") if out is not None else "live")
            if items and fr_item is not None:
                items.append(fr_item)
        verdict = join(items) if items else None
        if where is not None:
            save_report(where, _secrets(report.to_dict(), args),
                        render_text(report, show_all=True))
    if out is not None:
        print(f"mldebug hang: saved {len(written)} dumps and the report in {out}/ "
              f"(re-analyse: mldebug hang analyze {out})", file=sys.stderr)
    if args.json:
        doc = _secrets(report.to_dict(), args)
        if record is not None:
            doc["flight_recorder"] = record.to_dict()
        if args.signal:
            from mldebug.hang.signal_report import to_dict

            doc["capture"] = to_dict(results, {(p.host, p.pid) for p in report.processes})
        if ladder is not None:
            doc["k8s_routes"] = [lad.to_dict() for lad in ladder.pods]
        if verdict is not None:
            doc["why"] = why.document(verdict, items, [])
        write_json(wrap(doc))
    else:
        if target.is_local and not args.pid and not args.slurm_job:
            from mldebug.hang.collect import slurm_scope_note

            note = slurm_scope_note()
            if note:
                print(note, file=sys.stderr)
        render(report, show_all=args.all)
        if record is not None and args.fr:
            from mldebug.render import console

            flight.render(record, console())
        if args.signal:  # which route answered, which ranks have no handler
            from mldebug.hang.signal_report import render as render_capture
            from mldebug.render import console

            render_capture(results, console(), {(p.host, p.pid) for p in report.processes})
        if ladder is not None:  # which rung read each pod's ranks, why the ones above did not
            from mldebug.render import console
            from mldebug.text import sanitize

            con = console()
            con.print("[bold]routes per pod[/bold] (py-spy -> debug-server -> kubectl-debug "
                      "-> signal)")
            for lad in ladder.pods:
                con.print(sanitize(lad.line()), markup=False, highlight=False, soft_wrap=True)
        # what `mldebug why` says of the same evidence, where it adds to the verdict above:
        # the recorder's dumps were joined in, or it names other ranks
        if verdict is not None and report.processes and (
                len(items) > 1 or set(verdict.culprits) != {s.rank for s in report.suspects}):
            from mldebug.render import console
            from mldebug.text import sanitize

            for line in why.brief(verdict):
                console().print(sanitize(line), markup=False, highlight=False, soft_wrap=True)
    if args.html:
        if not report.processes:
            from mldebug.errors import MldebugError

            raise MldebugError("no rank process was dumped, so there is nothing to draw.",
                               "See the errors above; check --pid/--pattern and --nodes.")
        from mldebug.hang.view import hang_html

        write_views(args, lambda: hang_html(report))
    return 0 if report.processes else 1
