"""Collection for ``mldebug hang``: run the node collector here or on every node, turn the
answers into model objects, and save/load them for later analysis."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldebug.errors import UsageError
from mldebug.fanout import FanoutOptions, NodeJob, NodeResult, OnNode, run, to_argv
from mldebug.hang.model import IDENTITY_FIELDS, CollectError, Collection, Process
from mldebug.hang.pyspy import parse_text_dump, threads_from_json
from mldebug.names import trailing_number

NODE_MODULES = ("mldebug.nodekit", "mldebug.dist", "mldebug.errors", "mldebug.hang.node")
NODE_SCHEMA = {"host": str, "processes": list}
DUMP_FORMAT = "mldebug.hang.dump/1"


@dataclass
class CollectOptions:
    pid: int | None = None
    pattern: str | None = None
    all_users: bool = False
    user: str | None = None
    slurm_job: str | None = None
    native: bool = False
    nonblocking: bool = False
    locals: bool = False
    py_spy: str | None = None
    timeout: float = 20.0
    watch: float = 0.0
    jobs: int = 16

    def node_args(self) -> list[str]:
        return to_argv(self)


def node_docs(opts: CollectOptions, target: FanoutOptions,
              on_node: OnNode | None = None) -> list[NodeResult]:
    """One JSON document per node (or an error saying why there is none)."""
    if target.is_local:
        from mldebug.hang import node

        doc = node.collect(node.parser().parse_args(opts.node_args()))
        return [NodeResult(doc["host"], data=doc)]
    # The node budget: two rounds of dumps (with --watch) plus the pause between them.
    node_timeout = opts.timeout * (2 if opts.watch else 1) + opts.watch + 5
    return run(NodeJob(NODE_MODULES, opts, NODE_SCHEMA),
               dataclasses.replace(target, timeout=node_timeout), on_node)


def process_from_node(host: str, p: dict[str, Any]) -> Process:
    ident = p.get("identity") or {}
    known: dict[str, Any] = {k: ident.get(k) for k in IDENTITY_FIELDS}
    proc = Process(host=host, pid=int(p["pid"]), cmdline=list(p.get("cmdline") or []), **known)
    if p.get("dump") is not None:
        proc.threads = threads_from_json(p["dump"])
    if p.get("dump_later") is not None:
        proc.threads_later = threads_from_json(p["dump_later"])
    return proc


def collection_from_results(results: Sequence[NodeResult], watch: float | None = None) -> Collection:
    coll = Collection(hosts=[r.host for r in results], watch=watch or None)
    for r in results:
        if r.data is None:
            coll.errors.append(CollectError(r.host, None, r.error or "no answer"))
            continue
        doc = r.data
        if not isinstance(doc, dict) or "processes" not in doc:
            coll.errors.append(CollectError(r.host, None, "answered something that is not a "
                                                          "collector document"))
            continue
        host = str(doc.get("host") or r.host)
        try:  # a node's document is outside data: a wrongly typed one costs only that node
            errors = [CollectError(host, e.get("pid"), str(e.get("error")))
                      for e in doc.get("errors") or ()]
            procs = []
            for p in doc["processes"]:
                if p.get("error"):
                    errors.append(CollectError(host, int(p["pid"]), str(p["error"])))
                if p.get("dump") is not None:
                    procs.append(process_from_node(host, p))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            coll.errors.append(CollectError(r.host, None, "answered a wrongly typed document "
                                                          f"({type(e).__name__}: {e})"))
            continue
        coll.errors.extend(errors)
        coll.processes.extend(procs)
    return coll


# -- save / load -------------------------------------------------------------------------
def save(out: Path, results: Sequence[NodeResult], report_dict: dict[str, Any],
         report_text: str) -> list[Path]:
    """Write raw per-process py-spy dumps and the report under ``out``."""
    dumps = out / "dumps"
    dumps.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        if r.data is None:
            continue
        host = str(r.data.get("host") or r.host)
        for p in r.data.get("processes") or ():
            if p.get("dump") is None:
                continue
            rank = (p.get("identity") or {}).get("rank")
            name = f"{host}-rank{rank}-{p['pid']}.json" if rank is not None else f"{host}-{p['pid']}.json"
            path = dumps / name
            path.write_text(json.dumps({"format": DUMP_FORMAT, "host": host, **p}, indent=1))
            written.append(path)
    (out / "report.json").write_text(json.dumps(report_dict, indent=2))
    (out / "report.txt").write_text(report_text)
    return written


def _expand_inputs(paths: Iterable[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            sub = p / "dumps" if (p / "dumps").is_dir() else p
            found = sorted(f for f in sub.iterdir() if f.is_file() and f.name not in
                           ("report.json", "report.txt"))
            if not found:
                raise UsageError(f"{p} holds no dump files.",
                                 "Pass a directory written by 'mldebug hang --out DIR', or files.")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"{p} does not exist.", "Pass dump files or a --out directory.")
    return files


def load(paths: Iterable[str]) -> Collection:
    """Read saved dumps: mldebug dump files, raw ``py-spy dump --json`` output, or py-spy text."""
    coll = Collection()
    watch = False
    for f in _expand_inputs(paths):
        text = f.read_text(errors="replace")
        stripped = text.lstrip()
        if stripped.startswith(("{", "[")):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                coll.errors.append(CollectError(f.name, None, f"unreadable JSON: {e.msg}"))
                continue
            if isinstance(data, dict) and data.get("format") == DUMP_FORMAT:
                proc = process_from_node(str(data.get("host", "?")), data)
                watch = watch or proc.threads_later is not None
                coll.processes.append(proc)
            elif isinstance(data, list):  # plain py-spy --json
                pid = _pid_from(data, f)
                coll.processes.append(Process(host=_host_from(f), pid=pid,
                                              threads=threads_from_json(data)))
            else:
                coll.errors.append(CollectError(f.name, None, "not a py-spy or mldebug dump"))
        else:
            procs = parse_text_dump(text, default_host=_host_from(f))
            if not procs:
                coll.errors.append(CollectError(f.name, None, "no py-spy dump found in the file"))
            coll.processes.extend(procs)
    if watch:
        coll.watch = 0.0
    return coll


def _pid_from(data: list[Any], f: Path) -> int:
    for t in data:
        if isinstance(t, dict) and t.get("pid"):
            return int(t["pid"])
    return trailing_number(f.name) or 0


def _host_from(f: Path) -> str:
    """Text and raw py-spy dumps carry no host; pdsh prefixes (parsed later) override this."""
    return ""


def options_from_args(args: argparse.Namespace) -> CollectOptions:
    import re

    if args.pattern:
        try:
            re.compile(args.pattern)
        except re.error as e:
            raise UsageError(f"--pattern {args.pattern!r} is not a valid regular expression: {e}.",
                             "Quote it for the shell, e.g. --pattern 'train\\.py'.") from None
    if args.user is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?", args.user):
        raise UsageError(f"--user {args.user!r} is not a user name or uid.", "e.g. --user alice")
    if args.watch is not None and args.watch <= 0:
        raise UsageError("--watch must be a positive number of seconds.", "e.g. --watch 5")
    return CollectOptions(
        pid=args.pid, pattern=args.pattern, all_users=args.all_users, user=args.user,
        slurm_job=args.slurm_job,
        native=args.native, nonblocking=args.nonblocking, locals=args.locals,
        py_spy=args.py_spy, timeout=args.timeout, watch=args.watch or 0.0,
        # py-spy --native is CPU-heavy and degrades when oversubscribed: one per CPU; plain
        # dumps mostly wait on the target, so several per CPU
        jobs=max(2, min(64, (os.cpu_count() or 2) * (1 if args.native else 4))),
    )
