"""Collection for ``mldebug hang``: run the node collector here or on every node, turn the
answers into model objects, and save/load them for later analysis."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldebug.abortnotes import NOTE_FORMAT, missing_notes
from mldebug.errors import UsageError
from mldebug.fanout import FanoutOptions, NodeJob, NodeResult, OnResult, run
from mldebug.hang.model import (
    IDENTITY_FIELDS,
    CollectError,
    Collection,
    KernelWait,
    Process,
    ProcSample,
)
from mldebug.hang.options import CollectOptions, options_from_args
from mldebug.hang.pyspy import json_int, parse_text_dump, threads_from_json
from mldebug.names import trailing_number
from mldebug.paths import HANG_MARKER, HANG_REPORTS

NODE_MODULES = ("mldebug.nodekit", "mldebug.dist", "mldebug.errors", "mldebug.ranks",
                "mldebug.stacks", "mldebug.hang.gpu", "mldebug.hang.debugserver",
                "mldebug.hang.node")
NODE_SCHEMA = {"host": str, "processes": list}
__all__ = ["CollectOptions", "options_from_args"]  # re-exported from mldebug.hang.options
DUMP_FORMAT = "mldebug.hang.dump/1"
MAX_DUMP_BYTES = 64 << 20  # one process's dump; anything bigger is not one


def node_docs(opts: CollectOptions, target: FanoutOptions, on_result: OnResult,
              progress: bool = True) -> list[NodeResult]:
    """Hand each node's JSON document (or an error saying why there is none) to ``on_result``
    as that node answers; returns host and error per node (``mldebug.fanout.run``)."""
    if target.is_local:
        from mldebug.hang import node

        doc = node.collect(node.parser().parse_args(opts.node_args()))
        on_result(NodeResult(doc["host"], data=doc))
        return [NodeResult(doc["host"])]
    # The node budget: two rounds of dumps (with --watch) plus the pause between them, and
    # as much again for the debug-server route (ranks py-spy could not read).
    node_timeout = opts.timeout * (4 if opts.watch else 2) + opts.watch + 5
    return run(NodeJob(NODE_MODULES, opts, NODE_SCHEMA),
               dataclasses.replace(target, timeout=node_timeout), on_result, progress=progress)


def _opt_int(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{v!r} is not an integer")
    if not -(1 << 63) < v < 1 << 63:
        raise ValueError(f"{str(v)[:24]}... is out of range")
    return v


def _opt_str(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"{v!r} is not a string")
    return v


def _undumped(host: str, p: dict[str, Any], error: str,
              out: dict[tuple[str, int], str],
              stopped: dict[tuple[str, int], tuple[str, int]] | None = None) -> None:
    """Remember a live rank py-spy could not read (stopped, traced, ptrace denied), keyed by
    its job and rank, so the analysis says so instead of calling the rank gone; a rank whose
    /proc state was T (stopped) at a sample goes in ``stopped`` too."""
    try:
        proc = process_from_node(host, dict(p, dump=None, dump_later=None, workers=[]))
    except ValueError:
        return
    # mldebug.hang.node.explain_pyspy_error's wording for a process gone during the dump
    if "exited during the dump" in error or any(x.state in ("Z", "X") for x in proc.samples):
        return  # gone: missing like any rank that exited, not alive-but-unreadable
    if proc.rank is not None and not proc.lone:
        out[(proc.job_key, proc.rank)] = f"pid {proc.pid} on {host}: {error}"[:400]
        if stopped is not None and any(x.state == "T" for x in proc.samples):
            stopped[(proc.job_key, proc.rank)] = (host, proc.pid)


def process_from_node(host: str, p: dict[str, Any], clk_tck: int = 100,
                      bad: list[str] | None = None) -> Process:
    """A Process from one entry of a node document; ValueError when it is malformed (a frame
    line inf or NaN too). A damaged thread id is read as 0 and named in ``bad``."""
    if not isinstance(p, dict):
        raise ValueError("a process entry is not an object")
    ident = p.get("identity") or {}
    if not isinstance(ident, dict):
        raise ValueError("'identity' is not an object")
    known: dict[str, Any] = {}
    for k in IDENTITY_FIELDS:
        v = ident.get(k)
        known[k] = _opt_str(v) if k in ("launcher", "run_id") else _opt_int(v)
    pid = _opt_int(p.get("pid"))
    if pid is None:
        raise ValueError("a process has no pid")
    cmdline = p.get("cmdline") or []
    if not isinstance(cmdline, list):
        raise ValueError("'cmdline' is not a list")
    job = p.get("job") or {}
    if not isinstance(job, dict):
        raise ValueError("'job' is not an object")
    ns_pid = _opt_int(p.get("ns_pid"))
    proc = Process(host=host, pid=pid, cmdline=[str(c) for c in cmdline], **known,
                   ns_pid=ns_pid if ns_pid != pid else None,
                   job=_opt_str(job.get("key")), job_launcher=_opt_str(job.get("launcher")),
                   lone=bool(job.get("lone")))
    for key, attr in (("dump", "threads"), ("dump_later", "threads_later")):
        data = p.get(key)
        if data is None:
            continue
        if not isinstance(data, list):
            raise ValueError(f"'{key}' is not a py-spy thread list")
        setattr(proc, attr, threads_from_json(data, bad))
    for w in p.get("workers") or ():
        if isinstance(w, dict) and w.get("dump") is not None:
            proc.workers.append(process_from_node(host, w, clk_tck, bad))
    proc.samples = samples_from_node(p.get("samples"))
    route = p.get("route")
    proc.route = route if isinstance(route, str) and len(route) <= 32 else None
    detail = p.get("route_detail")
    proc.route_detail = detail if isinstance(detail, str) and len(detail) <= 64 else None
    proc.kernel = kernel_from_node(p.get("kernel"))
    recheck = p.get("recheck")
    proc.recheck = (float(recheck) if isinstance(recheck, (int, float))
                    and not isinstance(recheck, bool) and 0 < recheck <= 60
                    and proc.threads_later is not None else None)
    proc.clk_tck = clk_tck
    return proc


def _short_str(v: Any, limit: int) -> str | None:
    return v[:limit] if isinstance(v, str) and v else None


def kernel_from_node(raw: Any) -> KernelWait | None:
    """A process entry's ``kernel`` (mldebug.hang.node.kernel_wait); malformed parts dropped
    (it only refines the verdict's wording)."""
    if not isinstance(raw, dict):
        return None
    lock_raw = raw.get("lock")
    lock: dict[str, Any] = lock_raw if isinstance(lock_raw, dict) else {}
    fd, holder = raw.get("fd"), lock.get("holder")
    k = KernelWait(syscall=_short_str(raw.get("syscall"), 32),
                   file=_short_str(raw.get("file"), 300),
                   fd=fd if isinstance(fd, int) and not isinstance(fd, bool) else None,
                   wchan=_short_str(raw.get("wchan"), 64),
                   lock_kind=_short_str(lock.get("kind"), 16),
                   lock_holder=holder if isinstance(holder, int)
                   and not isinstance(holder, bool) and holder > 0 else None,
                   lock_holder_comm=_short_str(lock.get("holder_comm"), 64))
    return k if k != KernelWait() else None


def samples_from_node(raw: Any) -> list[ProcSample]:
    """The /proc samples of one process entry; malformed ones are dropped (they only refine
    the verdict), at most 8 kept."""
    out: list[ProcSample] = []
    if not isinstance(raw, list):
        return out
    for s in raw[:8]:
        if not isinstance(s, dict):
            continue
        t, state, ticks = s.get("t"), s.get("state"), s.get("ticks")
        io, pt = s.get("io"), s.get("proc_ticks", 0)
        if (isinstance(t, (int, float)) and isinstance(state, str) and len(state) <= 2
                and isinstance(ticks, int) and isinstance(pt, int)
                and (io is None or isinstance(io, int))):
            out.append(ProcSample(float(t), state, ticks, pt, io))
    return out


def add_node_result(coll: Collection, r: NodeResult) -> None:
    """Fold one node's answer into the collection; a malformed document becomes that node's
    error with the reason, and the other nodes are unaffected."""
    if r.data is None:
        coll.errors.append(CollectError(r.host, None, r.error or "no answer"))
        return
    doc = r.data
    if not isinstance(doc, dict) or not isinstance(doc.get("processes"), list):
        coll.errors.append(CollectError(r.host, None, "answered something that is not a "
                                                      "collector document"))
        return
    from mldebug.nodetrust import check_host

    host = r.host  # a node speaks for itself only: its answer is filed under the host asked
    procs: list[Process] = []
    errors: list[CollectError] = []
    undumped: dict[tuple[str, int], str] = {}
    stopped: dict[tuple[str, int], tuple[str, int]] = {}
    tck = doc.get("clk_tck")
    tck = tck if isinstance(tck, int) and 1 <= tck <= 10000 else 100
    claim = check_host(r.host, doc)
    if claim:  # a note, not an error: the node did answer
        coll.notes.append(CollectError(host, None, claim))
    try:
        for e in doc.get("errors") or ():
            errors.append(CollectError(host, _opt_int(e.get("pid")), str(e.get("error"))))
        for p in doc["processes"]:
            if p.get("error"):
                errors.append(CollectError(host, _opt_int(p.get("pid")), str(p["error"])))
            if p.get("dump") is None:
                if p.get("error"):
                    _undumped(host, p, str(p["error"]), undumped, stopped)
                continue
            procs.append(process_from_node(host, p, tck))
    except (AttributeError, TypeError, ValueError, RecursionError) as e:
        coll.errors.append(CollectError(r.host, None, f"answered a malformed collector document "
                                                      f"({type(e).__name__}: {e})"[:300]))
        return
    coll.errors.extend(errors)
    coll.processes.extend(procs)
    coll.undumped.update(undumped)
    coll.stopped.update(stopped)
    rechecks = [p.recheck for p in procs if p.recheck is not None]
    if rechecks:
        coll.recheck = max(rechecks + [coll.recheck or 0.0])
    if doc.get("gpu") is not None:
        from mldebug.hang.gpu import SignalError, check_polls

        try:
            polls = check_polls(doc["gpu"])
        except (SignalError, AttributeError, TypeError) as e:
            coll.errors.append(CollectError(host, None, f"GPU signals malformed: {e}"[:300]))
            return
        coll.gpu[host] = polls
        for err in dict.fromkeys(e for p in polls for e in p["errors"]):
            coll.errors.append(CollectError(host, None, err))


def collection_from_results(results: Sequence[NodeResult], watch: float | None = None) -> Collection:
    coll = Collection(hosts=[r.host for r in results], watch=watch or None)
    for r in results:
        add_node_result(coll, r)
    return coll


def collect(opts: CollectOptions, target: FanoutOptions, *, progress: bool = False,
            docs: Callable[..., list[NodeResult]] | None = None, out: Path | None = None,
            show_secrets: bool = False) -> tuple[list[NodeResult], Collection, list[Path]]:
    """Collect from every node of ``target``, folding each node's answer into the collection
    as it arrives (the raw document is dropped then: at 1,000 nodes the documents are ~150 MB).

    The fan-out shows nodes answered / total on stderr (a terminal only) unless ``progress``
    is False. ``docs``: another way to get the node documents with ``node_docs``'s signature
    (the ranks dumping themselves on a signal). ``out``: a directory from ``prepare_out``
    where each node's raw dumps are written as the node answers. Returns per node its host,
    error and a slim document (each process without its stacks, for ``mldebug.hang.signal_report``),
    the collection, and the dump files written.
    """
    node_docs_fn = docs or node_docs
    coll = Collection(watch=opts.watch or None)
    slim: dict[str, NodeResult] = {}
    written: list[Path] = []

    def on_result(r: NodeResult) -> None:
        add_node_result(coll, r)
        if out is not None:
            written.extend(save_node(out, r, show_secrets=show_secrets))
        slim[r.host] = NodeResult(r.host, data=slim_doc(r.data), error=r.error)

    hosts = [r.host for r in node_docs_fn(opts, target, on_result, progress)]
    coll.hosts = hosts
    return [slim.get(h) or NodeResult(h, error="no answer") for h in hosts], coll, written


_STACKS = ("dump", "dump_later", "workers")


def slim_doc(doc: Any) -> dict[str, Any] | None:
    """A node document without its stacks: what is left once the analysis has them."""
    if not isinstance(doc, dict):
        return None
    procs = doc.get("processes")
    return {**{k: v for k, v in doc.items() if k != "processes"},
            "processes": [{k: v for k, v in p.items() if k not in _STACKS}
                          if isinstance(p, dict) else p for p in procs]
            if isinstance(procs, list) else procs}


def slurm_scope_note(env: dict[str, str] | None = None) -> str | None:
    """Inside a SLURM allocation a plain run sees this node only: say so, with the command
    for every node of the job."""
    e = os.environ if env is None else env
    job = e.get("SLURM_JOB_ID")
    if not job:
        return None
    nodes = e.get("SLURM_JOB_NODELIST") or e.get("SLURM_NODELIST") or "?"
    return (f"mldebug hang: inside SLURM job {job} ({nodes}) this looks at this node only; "
            f"for every node of the job: mldebug hang --slurm-job {job}")


# -- save / load -------------------------------------------------------------------------
OUT_MARKER = HANG_MARKER


def check_out(out: Path, *, force: bool) -> Path:
    """``--out`` checked before anything runs (``mldebug.paths.check_out`` with hang's marker);
    the resolved path. A reused directory is refused, or with ``force`` replaced as a whole when
    mldebug hang wrote it - never mixed."""
    from mldebug import paths

    p = Path(out).expanduser()
    if not force and not p.is_symlink() and p.is_dir() and any(p.iterdir()):
        raise UsageError(f"--out {out} already holds files; old dumps would mix with "
                         "the new ones.", "Pass a new directory, or --force to replace "
                         "a directory an earlier 'mldebug hang --out' wrote.")
    return paths.check_out(p, force=force, marker=OUT_MARKER, command="mldebug hang")


def staged_out(out: Path, *, force: bool = False) -> Any:
    """The context ``mldebug hang --out`` writes in: a private directory beside ``out`` that
    replaces it when the run ends (``mldebug.paths.staged``), so an interrupted run leaves
    the finished directory or nothing."""
    from mldebug import paths

    return paths.staged(out, marker=OUT_MARKER, marker_text=_MARKER_TEXT, private=True,
                        replace=force)


_MARKER_TEXT = "written by mldebug hang --out; --force may replace this directory\n"


def prepare_out(out: Path, *, force: bool) -> Path:
    """Make ``out`` an empty directory of ours holding the marker (``check_out``, then an
    empty staged directory swapped in); the resolved path."""
    out = check_out(out, force=force)
    with staged_out(out, force=force):
        pass
    return out


def _file_part(value: Any) -> str:
    from mldebug.paths import name_part

    return name_part(value)


def save_node(out: Path, r: NodeResult, *, show_secrets: bool = False) -> list[Path]:
    """Write one node's raw per-process py-spy dumps under ``out/dumps`` (see staged_out);
    ``collect`` calls it as each node answers. File names are built from the host we asked
    (never the node's own ``host`` field) and the rank and pid, each reduced to a plain name
    part; files are created new (0600, never through a link)."""
    from mldebug.paths import write_new
    from mldebug.redact import redact_doc

    if not isinstance(r.data, dict):
        return []
    dumps = out / "dumps"
    dumps.mkdir(mode=0o700, exist_ok=True)
    written = []
    host = r.host
    for p in r.data.get("processes") or ():
        if not isinstance(p, dict) or p.get("dump") is None:
            continue
        ident = p.get("identity")
        rank = ident.get("rank") if isinstance(ident, dict) else None
        stem = (f"{_file_part(host)}-rank{_file_part(rank)}-{_file_part(p.get('pid'))}"
                if rank is not None else f"{_file_part(host)}-{_file_part(p.get('pid'))}")
        doc = {"format": DUMP_FORMAT, "host": host, **p}
        data = json.dumps(doc if show_secrets else redact_doc(doc), indent=1)
        for n in range(1000):  # a node naming one pid twice: both kept, neither overwritten
            path = dumps / (f"{stem}.json" if n == 0 else f"{stem}-{n}.json")
            try:
                write_new(path, data)
                break
            except FileExistsError:
                continue
        written.append(path)
    return written


def save_report(out: Path, report_dict: dict[str, Any], report_text: str) -> None:
    """Write the report (JSON and text) beside the dumps under ``out`` (new files, 0600)."""
    from mldebug.paths import write_new

    json_name, text_name = HANG_REPORTS
    write_new(out / json_name, json.dumps(report_dict, indent=2))
    from mldebug.text import sanitize

    write_new(out / text_name, sanitize(report_text, multiline=True))


@dataclass
class _Inputs:
    files: list[Path] = dataclasses.field(default_factory=list)
    # faulthandler texts of a capture directory (DIR/faulthandler), with the directory
    texts: list[tuple[Path, Path]] = dataclasses.field(default_factory=list)
    errors: list[CollectError] = dataclasses.field(default_factory=list)
    dirs: list[Path] = dataclasses.field(default_factory=list)  # directories given


def _expand_inputs(paths: Iterable[str]) -> _Inputs:
    from mldebug.hang import fhtext

    found_in = _Inputs()
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            sub = p / "dumps" if (p / "dumps").is_dir() else p
            found = sorted((f for f in sub.iterdir() if f.name not in
                            (*HANG_REPORTS, OUT_MARKER)
                            and not f.is_symlink() and f.is_file()),  # a planted link: skipped
                           key=lambda f: f.name)
            # a watchdog's directory: ranks whose only stacks are faulthandler's text
            texts, errors = fhtext.capture_texts(p, {fhtext.stem(f.name) for f in found})
            if not found and not texts:
                raise UsageError(f"{p} holds no dump files.",
                                 "Pass a directory written by 'mldebug hang --out DIR' or by "
                                 "mldebug.watchdog(), or files.")
            found_in.files.extend(found)
            found_in.dirs.append(p)
            found_in.texts.extend((t, p) for t in texts)
            found_in.errors.extend(errors)
        elif p.is_file():
            found_in.files.append(p)
        else:
            raise UsageError(f"{p} does not exist.", "Pass dump files or a --out directory.")
    return found_in


def load(paths: Iterable[str]) -> Collection:
    """Read saved dumps: mldebug dump files, raw ``py-spy dump --json`` output, py-spy text,
    and faulthandler text (a watchdog's ``faulthandler/`` files, or a file given directly).

    The garbage collector is paused meanwhile: loading builds millions of objects and none
    is garbage, so its passes only cost time (superlinear in the number of ranks)."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return _load(paths)
    finally:
        if enabled:
            gc.enable()


def _load(paths: Iterable[str]) -> Collection:
    from mldebug.hang import fhtext
    from mldebug.stacks import looks_like_faulthandler

    coll = Collection()
    watch = False
    inputs = _expand_inputs(paths)
    coll.errors.extend(inputs.errors)
    by_dir: dict[Path, list[Process]] = {}  # each capture directory's JSON dumps
    for f in inputs.files:
        try:
            with open(f, "rb") as fh:
                raw = fh.read(MAX_DUMP_BYTES + 1)
        except OSError as e:
            coll.errors.append(CollectError(f.name, None, f"unreadable: {e.strerror}"))
            continue
        if len(raw) > MAX_DUMP_BYTES:
            coll.errors.append(CollectError(f.name, None, f"larger than {MAX_DUMP_BYTES >> 20} MiB:"
                                                          " not a stack dump; skipped"))
            continue
        if raw.lstrip()[:1] in (b"{", b"["):
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError) as e:
                coll.errors.append(CollectError(f.name, None, f"unreadable JSON: {e}"[:200]))
                continue
            bad: list[str] = []  # damaged thread ids read as 0 (one note for the file)
            if isinstance(data, dict) and data.get("format") == DUMP_FORMAT:
                try:
                    proc = process_from_node(str(data.get("host", "?")), data, bad=bad)
                except (AttributeError, TypeError, ValueError) as e:
                    coll.errors.append(CollectError(f.name, None, f"malformed dump: {e}"))
                    continue
                if proc.recheck is not None:
                    coll.recheck = max(proc.recheck, coll.recheck or 0.0)
                else:
                    watch = watch or proc.threads_later is not None
                coll.processes.append(proc)
                by_dir.setdefault(f.parent.parent if f.parent.name == "dumps" else f.parent,
                                  []).append(proc)
            elif isinstance(data, list):  # plain py-spy --json
                try:
                    coll.processes.append(Process(host="", pid=_pid_from(data, f, bad),
                                                  threads=threads_from_json(data, bad)))
                except (AttributeError, TypeError, ValueError) as e:
                    coll.errors.append(CollectError(f.name, None, f"malformed py-spy JSON: {e}"))
                    continue
            else:
                coll.errors.append(CollectError(f.name, None, "not a py-spy or mldebug dump"))
            if bad:
                coll.errors.append(CollectError(f.name, None, "damaged numbers read as 0/none (the"
                                                f" rest of the file is analysed): {', '.join(bad)}"))
        else:
            from mldebug.text import drop_nuls

            data, nuls = drop_nuls(raw)  # a crashed node's unwritten blocks: read past them
            if nuls:
                coll.errors.append(CollectError(f.name, None, f"{nuls} NUL bytes skipped (a "
                                                "crashed node's unwritten blocks?)"))
            text = data.decode(errors="replace")
            if looks_like_faulthandler(text):
                fh_proc = fhtext.process_from_text(text, f.name)
                if fh_proc is None:
                    coll.errors.append(CollectError(f.name, None, "no faulthandler dump found"))
                else:
                    coll.processes.append(fh_proc)
                continue
            procs = parse_text_dump(text, default_host="")
            if not procs:
                coll.errors.append(CollectError(f.name, None, "neither a py-spy dump nor a faulthandler traceback: "
                                                "give py-spy dump output, mldebug hang --out dumps "
                                                "or a faulthandler text"))
            coll.processes.extend(procs)
    for path, d in inputs.texts:
        try:
            text = fhtext.read_tail(path, os.lstat(path.parent).st_uid).decode(errors="replace")
        except OSError as e:
            coll.errors.append(CollectError(path.name, None, f"unreadable: {e.strerror}"))
            continue
        siblings = by_dir.get(d, [])
        fh_proc = fhtext.process_from_text(text, path.name, fhtext.learned_prefixes(siblings))
        if fh_proc is None:
            coll.errors.append(CollectError(path.name, None, "no faulthandler dump found"))
            continue
        fhtext.adopt_job([fh_proc], siblings)
        coll.processes.append(fh_proc)
    _abort_notes(coll, inputs.dirs)
    if watch:
        coll.watch = 0.0
    return coll


ABORT_NOTE_FORMAT = NOTE_FORMAT  # written by mldebug.capture.evidence, read in mldebug.abortnotes


def _abort_notes(coll: Collection, dirs: list[Path]) -> None:
    """dump+abort's exit notes (mldebug.capture.evidence): each rank they name as missing
    and that has no dump here becomes an error saying why."""
    have_ranks = {p.rank for p in coll.processes if p.rank is not None}
    have_pids = {p.pid for p in coll.processes}
    for d in dirs:
        for rank, pid, why in missing_notes(d):
            if (rank is not None and rank in have_ranks) or pid in have_pids:
                continue
            who = f"rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"
            coll.errors.append(CollectError(d.name, pid, f"{who} has no dump: {why}"))


def _pid_from(data: list[Any], f: Path, bad: list[str] | None = None) -> int:
    for t in data:
        if isinstance(t, dict) and t.get("pid"):
            pid = json_int(t["pid"], "pid", bad, None)
            if pid is not None:
                return pid
            break
    return trailing_number(f.name) or 0
