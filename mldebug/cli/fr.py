"""mldebug fr: trigger flight-recorder dumps on a live job, analyse them across ranks."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from mldebug.cli._common import finite_float
from mldebug.errors import MldebugError, UsageError

DESCRIPTION = """\
PyTorch's flight recorder keeps the last collectives of every rank. mldebug makes it dumpable
on demand and analyses all ranks at once:

  # in the training script, once (before or after init_process_group):
  import mldebug.fr; mldebug.fr.enable()

  mldebug fr trigger                      # every rank on this host dumps now
  mldebug fr trigger --nodes node[1-8]    # ... on every node, gathered here
  mldebug fr analyze DIR                  # first divergence, culprit rank, call site
  mldebug fr watch --interval 10          # the ranks everybody waits for (stragglers)
  mldebug fr env                          # export lines for PyTorch's native recorder

Docs: docs/fr.md."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from mldebug.cli._common import add_json_argument, add_target_arguments

    sub = p.add_subparsers(dest="fr_command", metavar="SUBCOMMAND", title="subcommands")
    t = sub.add_parser("trigger", help="make every rank dump now and collect the dumps here",
                       description="Every rank that called mldebug.fr.enable() writes its "
                       "flight-recorder dump; the dumps are gathered into --out, named "
                       "fr-<host>-rank<R>. Works while the job is hung.")
    _add_dir_out(t, "to gather the dumps in")
    t.add_argument("--max-mb", type=finite_float, default=1024.0, metavar="MB",
                   help="most megabytes of dumps one node sends back (default: 1024); ranks "
                        "beyond it are named with the reason")
    t.add_argument("--discover", action="store_true",
                   help="also trigger recorders in every MLDEBUG_FR_DIR found in the rank "
                        "processes' environments and every /tmp/mldebug-fr-<uid>")
    t.add_argument("--analyze", action="store_true", help="analyse the gathered dumps too")
    t.add_argument("--list", action="store_true",
                   help="trigger nothing: list the jobs' folders under --dir (one per job, "
                        "made by mldebug.fr.enable()), their live ranks and dumps, newest "
                        "first")
    t.add_argument("--frames", type=int, default=2, metavar="N",
                   help="user frames per call site with --analyze (default: 2)")
    add_target_arguments(t, default_timeout=30.0,
                         timeout_help="seconds each rank may take to write its dump")
    _add_pid_job(t)
    add_json_argument(t)
    t.set_defaults(_fr=_trigger)

    a = sub.add_parser("analyze", help="cross-rank analysis of dumps: first divergence, culprit",
                       description="Load every rank's dump (restricted unpickler: plain data "
                       "only), align entries per process group by sequence number and report "
                       "the first divergence, missing and lagging ranks, with the culprit "
                       "rank(s) and their call sites. JSON schema: docs/fr.md.")
    a.add_argument("inputs", nargs="*", metavar="DIR|FILE",
                   help="a directory of dumps, or dump files (any names); none: the job "
                        "--job or --pid names, found in its folder under --dir")
    a.add_argument("--dir", metavar="DIR",
                   help="with --job/--pid: the ranks' dump directory (default: "
                        "$MLDEBUG_FR_DIR or /tmp/mldebug-fr-<uid>, as mldebug.fr.enable())")
    a.add_argument("--job", metavar="KEY",
                   help="read the dumps of this job's folder (its key, as 'mldebug fr trigger "
                        "--list' and 'mldebug hang' name jobs); the job may have ended")
    a.add_argument("--pid", type=int, metavar="PID",
                   help="read the dumps of the job whose launcher (or one rank) has this pid")
    a.add_argument("--all", action="store_true",
                   help="also print every rank's whole timeline side by side")
    a.add_argument("--frames", type=int, default=2, metavar="N",
                   help="user (non-torch) frames per call site (default: 2)")
    a.add_argument("--rank", type=int, metavar="R",
                   help="with --all: only the timeline rank R belongs to")
    from mldebug.htmlview import add_view_arguments

    add_view_arguments(a, trace_event=True)
    add_json_argument(a)
    a.set_defaults(_fr=_analyze)

    w = sub.add_parser("watch", help="dump twice S seconds apart and name the ranks that "
                       "arrive late at the collectives in between (stragglers)",
                       description="Trigger every rank's dump, wait --interval seconds, trigger "
                       "again, and report the stragglers over the collectives issued in between: "
                       "per rank, how often it arrived last and by how much (docs/fr.md, "
                       "Stragglers). Needs only mldebug.fr.enable() in the job.")
    w.add_argument("--interval", type=finite_float, default=10.0, metavar="S",
                   help="seconds between the two dumps (default: 10)")
    _add_dir_out(w, "for both dumps (<out>/1, <out>/2)")
    add_target_arguments(w, default_timeout=30.0)
    _add_pid_job(w)
    add_view_arguments(w, what=" of the stragglers")
    add_json_argument(w)
    w.set_defaults(_fr=_watch)

    e = sub.add_parser("env", help="print export lines for PyTorch's native recorder",
                       description="Print the environment PyTorch's own flight recorder reads "
                       "(current names and their pre-2.9 spellings), for jobs that do not call "
                       "mldebug.fr.enable() or that use NCCL's dump-on-timeout: paste them into "
                       "the launch script before init_process_group. Nothing is changed here.")
    e.add_argument("--dir", metavar="DIR", help="dump directory (default: as enable())")
    e.add_argument("--buffer-size", type=int, default=2000, metavar="N",
                   help="entries kept per rank (default: 2000)")
    e.set_defaults(_fr=_env)


def _add_pid_job(p: argparse.ArgumentParser) -> None:
    """--pid / --job, as mldebug hang has them: only that job's ranks on this host."""
    p.add_argument("--pid", type=int, metavar="PID",
                   help="only this job: its launcher's (or one rank's) pid on this host")
    p.add_argument("--job", metavar="KEY",
                   help="only the job with this key (as 'mldebug hang' names jobs) on this host")


def job_pids(args: argparse.Namespace, local: bool) -> set[int] | None:
    """The rank pids --pid / --job select on this host (None: no selection). A selection
    that finds no rank is an error with the fix, never 'every job'."""
    if args.pid is None and args.job is None:
        return None
    if not local:
        raise UsageError("--pid/--job select processes on this host; with --nodes/--hostfile/"
                         "--slurm-job each node has its own pids.",
                         "Run on the job's node, or drop --pid/--job (every registered rank "
                         "of your user dumps).")
    from mldebug.cli._common import job_targets

    targets = job_targets(args.pid, args.job)
    return {int(t["pid"]) for t in targets} | ({args.pid} if args.pid is not None else set())


def several_jobs_note(args: argparse.Namespace, local: bool) -> str | None:
    """Without --pid/--job on this host: a note when rank processes of several jobs run
    here, since fr's cross-rank analysis has no notion of jobs (two jobs' rank 0 are one rank
    to it). None when one job (or none) is here, or a selection was given."""
    if args.pid is not None or args.job is not None or not local:
        return None
    from mldebug.cli._common import job_targets

    keys = sorted({str((t.get("job") or {}).get("key") or f"pid {t['pid']}")
                   for t in job_targets(None, None)})
    if len(keys) < 2:
        return None
    return (f"mldebug fr: note: rank processes of {len(keys)} jobs run on this host "
            f"({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}); the analysis mixes "
            "every job whose ranks dumped into --dir. Narrow it to one: --job KEY or --pid "
            "<its launcher's pid>.")


def _add_dir_out(p: argparse.ArgumentParser, what: str) -> None:
    """--dir (where the ranks registered) and --out (where the dumps land), as trigger has."""
    p.add_argument("--dir", metavar="DIR",
                   help="the ranks' dump directory (default: $MLDEBUG_FR_DIR or "
                        "/tmp/mldebug-fr-<uid>, as mldebug.fr.enable())")
    p.add_argument("--out", "-o", metavar="DIR",
                   help=f"a new or empty directory {what} (default: a new private "
                        "$TMPDIR/mldebug-fr-dumps-<time>-XXXX, printed at the end)")


def run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_fr", None)
    if fn is None:
        raise UsageError("mldebug fr needs a subcommand.",
                         "Use 'mldebug fr trigger', 'mldebug fr analyze DIR', 'mldebug fr watch' "
                         "or 'mldebug fr env'.")
    return int(fn(args))


def _analyze(args: argparse.Namespace) -> int:
    from mldebug.cli._common import print_doc
    from mldebug.fr.analyze import analyze
    from mldebug.fr.loader import expand_inputs, load_files
    from mldebug.fr.report import render, render_timeline
    from mldebug.render import console

    if args.frames < 0:
        raise UsageError("--frames must be 0 or more.", "Pass e.g. --frames 2.")
    if args.inputs and (args.job is not None or args.pid is not None):
        raise UsageError("pass dump files or directories, or --job/--pid, not both.",
                         "Drop the paths to read the job's folder, or drop --job/--pid.")
    if not args.inputs:
        if args.job is None and args.pid is None:
            raise UsageError("fr analyze needs dumps: a directory, files, or --job/--pid.",
                             "Pass the directory 'mldebug fr trigger' printed, or --job KEY "
                             "('mldebug fr trigger --list' lists the jobs).")
        args.inputs = [_job_folder(args)]
    for item in args.inputs:
        if not Path(item).exists():
            raise UsageError(f"{item} does not exist.",
                             "Pass the directory 'mldebug fr trigger' wrote, or dump files.")
    from mldebug.htmlview import check_view_targets, write_views

    check_view_targets(args)
    notes: list[str] = []
    files = expand_inputs(args.inputs, notes)
    if notes:
        import sys

        for note in notes:
            print(f"mldebug fr: {note}", file=sys.stderr)
    if not files:
        raise MldebugError(f"no files in {', '.join(args.inputs)}.",
                           "Collect dumps first: mldebug fr trigger --out DIR.")
    ds = load_files(files)
    result = analyze(ds, frames=args.frames)
    if args.json:
        print_doc(result.to_dict())
    else:
        con = console()
        if args.all:
            render_timeline(ds, con, args.frames, args.rank)
        render(result, con)
    if ds.dumps:
        from mldebug.fr.traceevent import fr_trace
        from mldebug.fr.view import fr_html

        write_views(args, lambda: fr_html(ds, result, "mldebug fr analyze"),
                    lambda: fr_trace(ds, result))
    elif args.html or args.trace_event:
        raise MldebugError("none of the files could be loaded as a flight-recorder dump, so "
                           "there is nothing to draw.",
                           "See the reasons above; collect again with mldebug fr trigger.")
    if not ds.dumps:
        if not args.json:
            raise MldebugError("none of the files could be loaded as a flight-recorder dump.",
                               "See the reasons above; collect again with mldebug fr trigger.")
        return 1
    return 0


def _job_folder(args: argparse.Namespace) -> str:
    """The folder of the job --job/--pid names under --dir (newest with dumps, if several)."""
    import sys

    from mldebug.fr import node

    base = args.dir or node.default_dir()
    homes = node.list_homes(base)["homes"]
    if args.job is not None:
        picked = [h for h in homes if h["key"] == args.job]
        what = f"--job {args.job}"
    else:
        pids = {args.pid}
        try:
            pids |= job_pids(args, True) or set()
        except MldebugError:
            pass  # the job has ended: its launcher's pid, as its folder recorded it
        picked = [h for h in homes if h["launcher_pid"] == args.pid or set(h["pids"]) & pids]
        what = f"--pid {args.pid}"
    with_dumps = [h for h in picked if h["dumps"]]
    if not with_dumps:
        known = sorted({str(h["key"]) for h in homes if h["key"]})[:5]
        raise MldebugError(
            f"no job folder with dumps under {base} matches {what}"
            + (f" ({len(picked)} without dumps)" if picked else "") + ".",
            "List the jobs with 'mldebug fr trigger --list'" + (
                f" (keys here: {', '.join(known)})" if known else "")
            + ", or pass the dump directory itself.")
    if len(with_dumps) > 1:
        print(f"mldebug fr: {len(with_dumps)} job folders match {what}: reading the newest, "
              f"{with_dumps[0]['dir']} (the others: mldebug fr trigger --list).",
              file=sys.stderr)
    return str(with_dumps[0]["dir"])


def _list(args: argparse.Namespace) -> int:
    import time

    from mldebug.cli._common import fanout_options, print_doc
    from mldebug.fr.collect import list_jobs
    from mldebug.render import console, fold_ints

    target = fanout_options(args)
    pids = job_pids(args, target.is_local)
    docs = list_jobs(target, args.dir, pids)
    homes = sum(len(d["homes"]) for d in docs)
    if args.json:
        from mldebug.cli.envelope import running

        running("fr", "jobs")  # its own document: mldebug.fr.jobs/1
        print_doc({"nodes": docs, "jobs": homes})
        return 0
    from rich.table import Table
    from rich.text import Text

    con = console()
    table = Table(box=None, pad_edge=False)
    for col in ("host", "job", "live ranks", "dumps", "changed", "folder"):
        table.add_column(col)
    now = time.time()
    for d in docs:
        for h in d["homes"]:
            age = max(0.0, now - float(h.get("mtime") or now))
            when = (f"{age:.0f}s ago" if age < 120 else f"{age / 60:.0f}m ago" if age < 7200
                    else f"{age / 3600:.0f}h ago")
            live = (f"{fold_ints(h['ranks'])} ({len(h['pids'])} pid)" if h["ranks"]
                    else f"{len(h['pids'])} pid" if h["pids"] else "none (ended)")
            table.add_row(Text(str(d["host"])), Text(str(h.get("key") or "-")), Text(live),
                          Text(str(h["dumps"])), Text(when), Text(str(h["dir"])))
        for note in d["notes"] + ([d["error"]] if d.get("error") else []):
            con.print(Text(f"{d['host']}: {note}", style="yellow"))
    if homes:
        con.print(table)
        con.print(Text(f"{homes} job folder(s)   next: mldebug fr analyze --job KEY, or "
                       "mldebug fr analyze FOLDER"))
    else:
        con.print(Text(f"no job folder under {args.dir or 'the default directory'}: no rank "
                       "called mldebug.fr.enable() here (or it was given another directory: "
                       "--dir DIR)"))
    return 0


def _trigger(args: argparse.Namespace) -> int:
    from mldebug.cli._common import fanout_options, print_doc
    from mldebug.fr.collect import silent_finding, trigger
    from mldebug.render import console

    if args.list:
        if args.out or args.analyze:
            raise UsageError("--list triggers nothing, so --out and --analyze have no dumps.",
                             "Drop --list to trigger the dumps.")
        return _list(args)
    target = fanout_options(args)
    if not args.max_mb > 0:
        raise UsageError(f"--max-mb must be a positive number, not {args.max_mb}.",
                         "Pass e.g. --max-mb 1024.")
    pids = job_pids(args, target.is_local)
    result = trigger(target, args.out, args.dir,  # progress: on stderr, on a terminal
                     max_bytes=int(args.max_mb * (1 << 20)), discover=args.discover, pids=pids)
    out = result.out_dir
    analysis = None
    if args.analyze and result.files:
        from mldebug.fr.analyze import analyze
        from mldebug.fr.loader import load_files

        analysis = analyze(load_files(result.files), frames=args.frames)
        note = several_jobs_note(args, target.is_local)
        if note:
            import sys

            print(note, file=sys.stderr)
    silent = silent_finding(result)
    if silent is not None and analysis is not None:
        analysis.findings.insert(0, silent)  # the silent ranks first: they are the finding
    if args.json:
        doc = result.to_dict()
        doc["findings"] = [silent.to_dict()] if silent is not None else []
        if analysis is not None:
            doc["analysis"] = analysis.to_dict()
        print_doc(doc)
    else:
        from rich.text import Text

        con = console()
        for n in result.nodes:
            line = Text(f"{n.host}: ", style="bold")
            line.append(f"{len(n.files)} dump(s)", style="green" if n.files else "yellow")
            con.print(line)
            for err in n.errors:
                con.print(Text(f"  {err}", style="yellow"))
            for note in n.notes:
                con.print(Text(f"  {note}", style="dim"))
        if result.removed:
            con.print(Text("0 dump(s); nothing was written (the output directory was removed)"))
        else:
            con.print(Text(f"{len(result.files)} dump(s) in {out}/" + (
                f"   next: mldebug fr analyze {out}" if result.files and not args.analyze
                else "")))
        if analysis is not None:
            from mldebug.fr.report import render

            render(analysis, con)
        elif silent is not None:
            from mldebug.findings import render_findings

            render_findings([silent], con)
    return 0 if result.files else 1


def _watch(args: argparse.Namespace) -> int:
    from mldebug.cli._common import fanout_options, print_doc
    from mldebug.fr.analyze import analyze
    from mldebug.fr.collect import watch
    from mldebug.fr.loader import load_files
    from mldebug.render import console

    if not 0 < args.interval < 86400:
        raise UsageError(f"--interval must be between 0 and 86400 seconds, not {args.interval}.",
                         "Pass e.g. --interval 10.")
    from mldebug.htmlview import check_view_targets, write_views

    check_view_targets(args)
    target = fanout_options(args)
    result = watch(target, args.interval, args.out, args.dir, pids=job_pids(args, target.is_local))
    files = result.second.files
    if not files:
        raise MldebugError(f"no rank dumped (first trigger: {len(result.first.files)} dump(s)).",
                           "Check that the job called mldebug.fr.enable(); if it passed "
                           "enable(dump_dir=...) or set MLDEBUG_FR_DIR, pass the same --dir DIR "
                           "here; 'mldebug fr trigger' shows each rank's reason.")
    ds = load_files(files)
    analysis = analyze(ds, since=result.since)
    note = several_jobs_note(args, target.is_local)
    if note:
        import sys

        print(note, file=sys.stderr)
    if args.json:
        doc = result.to_dict()
        doc["analysis"] = analysis.to_dict()
        print_doc(doc)
    else:
        from rich.text import Text

        from mldebug.fr.report import render

        con = console()
        con.print(Text(f"{len(files)} dump(s) {args.interval:g}s after the first "
                       f"({result.second.out_dir}); {analysis.straggler_window} collective(s) "
                       "in between"))
        render(analysis, con)
    if args.html:
        from mldebug.fr.view import fr_html

        write_views(args, lambda: fr_html(ds, analysis, "mldebug fr watch", result.since))
    return 0


# names only torch before 2.9 reads, printed commented out (mldebug.fr.enable() sets them
# only there): torch 2.9+ prints a deprecation warning on every rank when they are set
OLD_ONLY = frozenset({"TORCH_NCCL_TRACE_BUFFER_SIZE"})


def _env(args: argparse.Namespace) -> int:
    from mldebug.fr.recorder import default_dir, native_env

    d = Path(args.dir) if args.dir else default_dir()
    env = native_env(d, args.buffer_size, legacy=True)  # the job's torch is not known here
    comments = {
        "TORCH_NCCL_DESYNC_DEBUG": "name the rank/collective that fell out of step at a timeout",
        "TORCH_FR_BUFFER_SIZE": "entries kept per rank; non-zero turns the recorder on "
                                "(before torch 2.9: TORCH_NCCL_TRACE_BUFFER_SIZE)",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "torch before 2.9 only (uncomment there): newer torch "
                                        "warns on every rank when it is set",
        "TORCH_FR_DUMP_ON_TIMEOUT": "NCCL: dump when the watchdog fires (gloo never does; "
                                    "use mldebug.fr.enable() there)",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "pre-2.9 name of TORCH_FR_DUMP_ON_TIMEOUT",
        "TORCH_FR_DUMP_TEMP_FILE": "dump path prefix; each rank appends its rank "
                                   "(before torch 2.9: TORCH_NCCL_DEBUG_INFO_TEMP_FILE)",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "pre-2.9 name of TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "NCCL: writing to <this><rank>.pipe dumps that rank "
                                           "(mldebug fr trigger pokes these pipes)",
    }
    print(f"# PyTorch flight recorder, native path (set before init_process_group). "
          f"Make the directory first: mkdir -p {d / 'nccl'}")
    for key, value in env.items():
        off = "# " if key in OLD_ONLY else ""
        print(f"{off}export {key}={shlex.quote(value)}  # {comments.get(key, '')}")
    return 0
