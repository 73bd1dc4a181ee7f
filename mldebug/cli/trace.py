"""mldebug trace: compare the ranks' recorded execution paths; run a script fully traced."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

DESCRIPTION = """\
In the job: mldebug.trace.enable(events="calls"|"lines", ring=N) keeps the last N events of
the user's code per thread; they are written at a watchdog stall, on the dump signal, on an
unhandled exception, or with mldebug.trace.dump().

Live (no DIR): 'trace show --pid PID' (the launcher's or a rank's pid) or '--job KEY' selects
one job's ranks on this host - as 'mldebug hang' and 'mldebug fr trigger' do - and sends each
rank the signal its dump handler listens to (mldebug.install_dump_handler() or
mldebug.watchdog() in the job; a rank without one is never signalled, only named). The ranks
keep running; each writes its ring beside its stacks, and ranks that wrote none are named with
the reason. With neither, the one job of yours on this host is asked (several: pick one).

  mldebug trace show DIR                  # ranks side by side, where a rank's path left
  mldebug trace show DIR --json
  mldebug trace show --pid 4123           # a live job here: its ranks write their rings now
  mldebug trace show --job run:abc123     # ... the job with this key ('mldebug hang' lists them)
  mldebug trace show --k8s-job llama -n training   # every pod of a job (also --nodes, --slurm-job)
  mldebug trace run --lines -- python train.py --steps 10
  torchrun --nproc_per_node 4 -m mldebug.trace run train.py   # same, through torchrun

Exit codes: 0 report produced, 1 no ring read (or no rank selected), 2 usage error."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="trace_action", metavar="{show,run}", required=True)
    s = sub.add_parser("show", help="compare the ranks' rings: saved in a directory, or "
                                    "asked now from a live job here (--pid/--job)",
                       description="Group the ranks by where their recorded path ends and "
                                   "name the first event where a rank left the others' path. "
                                   "Without DIR: the ranks of one live job on this host "
                                   "(--pid/--job, as for 'mldebug hang' and 'mldebug fr "
                                   "trigger') write their rings now, on the signal their dump "
                                   "handler listens to; ranks that wrote none are named with "
                                   "the reason. The job keeps running.")
    s.add_argument("paths", nargs="*", metavar="DIR|FILE",
                   help="the watchdog's directory (its trace/ folder is used) or ring files; "
                        "none: ask a live job's ranks on this host (--pid/--job)")
    live = s.add_argument_group("a live job on this host (instead of DIR)")
    live.add_argument("--pid", type=int, metavar="PID",
                      help="only this job: its launcher's (or one rank's) pid on this host")
    live.add_argument("--job", metavar="KEY",
                      help="only the job with this key (as 'mldebug hang' names jobs) on this "
                           "host")
    from mldebug.cli._common import add_target_arguments

    add_target_arguments(s, default_timeout=30.0,
                         timeout_help="seconds each rank may take to write its ring (a "
                                      "watchdog's handler looks every min(5, timeout/4) s)")
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
        from mldebug.cli._common import check_seconds, print_report
        from mldebug.htmlview import check_view_targets, write_views
        from mldebug.trace.analyze import analyze
        from mldebug.trace.collect import abort_notes, load

        check_view_targets(args)
        from mldebug.cli._common import fanout_options

        target = fanout_options(args)
        if args.paths and (args.pid is not None or args.job is not None
                           or not target.is_local):
            from mldebug.errors import UsageError

            raise UsageError("pass saved rings (DIR|FILE) or a live job (--pid/--job, --nodes, "
                             "--slurm-job, --k8s/--k8s-job), not both.",
                             "e.g. mldebug trace show capture/, or mldebug trace show --pid "
                             "<torchrun's pid>.")
        if args.paths:
            traces, errors = load(args.paths)
            report = analyze(traces, errors, abort_notes(args.paths))
        elif not target.is_local:  # the ranks of every node or pod, asked there
            report = _remote(target, args.pid, args.job, args.timeout)
            traces = report.traces
        else:
            check_seconds("--timeout", args.timeout)
            report = _live(args.pid, args.job, args.timeout)
            traces = report.traces

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

            raise MldebugError("no ring could be read, so there is nothing to draw.",
                               "See the reasons above; pass the watchdog's directory (its "
                               "trace/ folder) or ring files, or a live job with --pid/--job.")
        return 0 if traces else 1
    from mldebug.trace.launch import trace_command

    return trace_command(args.command, args.out, args.lines, os.environ, sys.executable)


def _job_label(key: str | None, ranks: list[dict[str, Any]]) -> str:
    rs = sorted(r for t in ranks if isinstance(r := (t.get("identity") or {}).get("rank"), int))
    from mldebug.render import fold_ints

    who = f"rank{'s' if len(rs) > 1 else ''} {fold_ints(rs)}, " if rs else ""
    pids = ", ".join(str(t["pid"]) for t in ranks[:4]) + (", ..." if len(ranks) > 4 else "")
    return f"{key or '(no job key)'} ({who}pid{'s' if len(ranks) > 1 else ''} {pids})"


def _live(pid: int | None, job: str | None, timeout: float) -> Any:
    """Ask the selected job's ranks on this host for their rings; the report, or an error
    with the fix when there is nothing to compare (no rank, several jobs, no handler, no
    ring anywhere)."""
    from mldebug.cli._common import job_targets
    from mldebug.errors import MldebugError
    from mldebug.trace.analyze import analyze
    from mldebug.trace.live import ask, results

    targets = job_targets(pid, job)
    if not targets:
        raise MldebugError("no rank process of yours on this host, and no saved rings given.",
                           "Run it on a node of the job, or pass a saved directory: "
                           "mldebug trace show DIR.")
    jobs: dict[str | None, list[dict[str, Any]]] = {}
    for t in targets:
        jobs.setdefault((t.get("job") or {}).get("key"), []).append(t)
    if len(jobs) > 1:
        listed = "; ".join(_job_label(k, v) for k, v in list(jobs.items())[:6])
        first = next((k for k in jobs if k), None)
        raise MldebugError(
            f"{len(jobs)} jobs have rank processes here: {listed}"
            + (f" and {len(jobs) - 6} more" if len(jobs) > 6 else "")
            + "; trace show compares the ranks of one job.",
            "Pick one: --job KEY" + (f" (e.g. --job {first})" if first else "")
            + " or --pid <its launcher's pid>.")
    [(key, ranks)] = jobs.items()
    label = key or f"pid {ranks[0]['pid']}"
    asked = ask(ranks, timeout)
    traces, notes = results(asked)
    if not traces:
        kinds = {a.kind for a in asked}
        n = f"{len(asked)} rank process{'es' if len(asked) != 1 else ''}"
        if kinds == {"no-handler"}:
            raise MldebugError(
                f"job {label}: none of its {n} on this host has a dump handler, so nothing "
                "can ask for its ring without stopping it (no rank was signalled).",
                "Add mldebug.trace.enable() and mldebug.install_dump_handler() (or "
                "mldebug.watchdog()) to the training script and restart it; meanwhile "
                f"'mldebug hang --pid {pid if pid is not None else ranks[0]['pid']}' shows "
                "the stacks (py-spy).")
        if kinds == {"no-ring"}:
            dumps = sorted({str((a.entry or {}).get("dir")) for a in asked})
            raise MldebugError(
                f"job {label}: its {n} on this host answered the dump signal, but the "
                "execution ring is not enabled in the job (no mldebug.trace.enable()).",
                "Add `import mldebug.trace; mldebug.trace.enable(events=\"lines\")` at the "
                "start of the training script and restart the job; the stacks they just wrote: "
                f"mldebug hang analyze {' '.join(dumps)}")
    one_rank = pid is not None and job is None and [int(t["pid"]) for t in ranks] == [pid] \
        and (ranks[0].get("identity") or {}).get("rank") is not None
    unnoted = ("not selected: --pid named one rank; pass the launcher's pid or "
               f"--job {key} for every rank of the job here") if one_rank and key else None
    report = analyze(traces, [], notes, job=label, live=True, unnoted=unnoted)
    if (report.divergences or len(report.groups) > 1) and not report.missing \
            and len(traces) > 1:
        # one read cannot tell a rank stuck in a branch from a slow rank passing through it:
        # read again until every ring moved (progress) or RECHECK_S passed (hang's re-check).
        # A slow rank's peers wait in C for it, so one short look may see only some move.
        import time

        from mldebug.ranks import alive, proc_sample
        from mldebug.trace.analyze import moved

        want = {(t.host, t.pid) for t in traces}
        seen: set[tuple[str, int]] = set()  # rings that changed, or ranks that ended
        ended: set[tuple[str, int]] = set()
        cpu_busy: set[tuple[str, int]] = set()  # main thread on the CPU (a saturated ring
        #                                         of one loop reads the same each time)
        before = {k: proc_sample(k[1]) for k in want}
        start = time.monotonic()
        print(f"mldebug: the ranks are in different places; reading their rings again for up "
              f"to {RECHECK_S:g}s to tell slow from stuck", file=sys.stderr)
        while time.monotonic() - start < RECHECK_S and seen != want:
            time.sleep(RECHECK_STEP_S)
            again, _ = results(ask(ranks, timeout))
            seen |= moved(traces, again)
            for k in want - seen:
                now, then = proc_sample(k[1]), before.get(k)
                if now is None or not alive(k[1]):
                    ended.add(k)  # the rank finished or was ended meanwhile: not stuck here
                elif then is not None and _runs(then, now):
                    cpu_busy.add(k)
            seen |= ended
        took = round(time.monotonic() - start, 1)
        if seen == want and len(ended) < len(want):
            report = analyze(traces, [], notes, job=label, live=True, unnoted=unnoted,
                             progress=took)
        elif not ended and (busy := (seen | cpu_busy)):
            report = analyze(traces, [], notes, job=label, live=True, unnoted=unnoted,
                             busy=(busy, took))
    return report


def _remote(target: Any, pid: int | None, job: str | None, timeout: float) -> Any:
    """``trace show`` over the fan-out (pdsh, srun, kubectl exec): each node or pod asks its
    own ranks (``mldebug.trace.node``) and answers with their rings; one job's ranks are
    compared as a local live ``trace show`` compares them (one read: the re-read for progress
    is local only). A node that did not answer is named in the report's errors."""
    import dataclasses

    from mldebug.errors import MldebugError
    from mldebug.fanout import NodeJob, run
    from mldebug.trace.analyze import analyze
    from mldebug.trace.collect import rank_from_doc
    from mldebug.trace.node import NODE_MODULES, NODE_SCHEMA

    @dataclasses.dataclass
    class TraceArgs:
        pid: int | None = None
        job: str | None = None
        timeout: float = 30.0

    results = run(NodeJob(NODE_MODULES, TraceArgs(pid, job, timeout), NODE_SCHEMA),
                  dataclasses.replace(target, timeout=timeout + 15), progress=False)
    errors: list[str] = []
    jobs: dict[str | None, list[tuple[str, dict[str, Any]]]] = {}
    for r in results:
        if r.data is None:
            errors.append(f"{r.host}: {r.error or 'no answer'}")
            continue
        for e in r.data.get("errors") or ():
            errors.append(f"{r.host}: {str(e)[:300]}")
        for x in r.data.get("ranks") or ():
            if isinstance(x, dict) and isinstance(x.get("pid"), int):
                key = x.get("job") if isinstance(x.get("job"), str) else None
                jobs.setdefault(key, []).append((r.host, x))
    if not jobs:
        raise MldebugError("no rank process on any node or pod answered"
                           + (f" ({'; '.join(errors[:3])})" if errors else "") + ".",
                           "'mldebug hang' with the same options lists the ranks and jobs.")
    if len(jobs) > 1:
        listed = "; ".join(f"{k or '(no job key)'} ({len(v)} ranks)"
                           for k, v in list(jobs.items())[:6])
        first = next((k for k in jobs if k), None)
        raise MldebugError(f"{len(jobs)} jobs have rank processes there: {listed}; trace show "
                           "compares the ranks of one job.",
                           "Pick one: --job KEY" + (f" (e.g. --job {first})" if first else ""))
    [(key, ranks)] = jobs.items()
    traces, notes = [], []
    for host, x in ranks:
        ring = x.get("trace")
        if isinstance(ring, dict):
            try:
                events = [e for e in ring.get("events") or () if isinstance(e, list)]
                t = rank_from_doc({**ring, "host": host, "events": ring.get("kind"),
                                   "locations": events,
                                   "threads": [{"events": list(range(len(events)))}]
                                   + [{}] * max(0, int(ring.get("threads") or 1) - 1)},
                                  f"{host}:{x['pid']}")
            except (TypeError, ValueError) as e:
                errors.append(f"{host}: rank pid {x['pid']}: malformed ring ({e})"[:300])
                continue
            traces.append(t)
        else:
            rank = x.get("rank") if isinstance(x.get("rank"), int) else None
            notes.append((rank, x["pid"], f"{str(x.get('reason') or 'no ring')[:300]} "
                                          f"(on {host})"))
    traces.sort(key=lambda t: (t.rank is None, t.rank or 0, t.host, t.pid))
    if not traces and all("dump handler" in why for _, _, why in notes):
        raise MldebugError(
            f"job {key or '?'}: none of its {len(notes)} rank processes has a dump handler, so "
            "nothing can ask for its ring without stopping it (no rank was signalled).",
            "Add mldebug.trace.enable() and mldebug.install_dump_handler() (or "
            "mldebug.watchdog()) to the training script and restart it; meanwhile "
            "'mldebug hang' with the same options shows the stacks.")
    return analyze(traces, errors, notes, job=key or "(no job key)", live=True)


RECHECK_S = 6.0  # trace show's longest look for progress in a live job whose ranks diverge
RECHECK_STEP_S = 1.0  # between its reads
BUSY_CPU = 0.3  # of a core, used by a rank's main thread over the look: it runs (not waits)
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _runs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The main thread ran between two /proc samples (mldebug.ranks.proc_sample): at least
    BUSY_CPU of a core, or runnable at both with ticks (a shared, loaded node), as
    ``mldebug hang`` calls a rank spinning."""
    dt, ticks = b["t"] - a["t"], b["ticks"] - a["ticks"]
    if dt <= 0 or ticks <= 0:
        return False
    return ticks / CLK_TCK >= BUSY_CPU * dt or (a["state"] == "R" and b["state"] == "R")
