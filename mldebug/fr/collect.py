"""Trigger dumps on this node or many nodes and gather them into one local directory.

Both paths run the same stdlib-only node script (``mldebug/fr/node.py``): in-process for
``trigger_local`` (what ``mldebug hang`` calls), over ``mldebug.fanout`` for
``mldebug fr trigger --nodes``. Files are named ``fr-<host>-rank<R>`` so ranks of different
nodes never collide; the rank is also inside each dump.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.fanout import FanoutOptions
from mldebug.findings import Finding
from mldebug.fr import node as node_script


@dataclass
class NodeOutcome:
    host: str
    files: list[Path] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "rank 3 (pid 123): why"
    notes: list[str] = field(default_factory=list)
    dirs: list[tuple[str, int | None]] = field(default_factory=list)  # (dump dir, rank) answered
    # live ranks that did not answer the trigger (stopped, frozen): {"rank", "pid", "why"}
    silent: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "files": [str(f) for f in self.files],
                "errors": self.errors, "notes": self.notes, "silent": self.silent}


@dataclass
class TriggerResult:
    out_dir: Path
    nodes: list[NodeOutcome]
    removed: bool = False  # out_dir was made here and removed again: nothing came back

    @property
    def files(self) -> list[Path]:
        return [f for n in self.nodes for f in n.files]

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": None if self.removed else str(self.out_dir),
                "files": [str(f) for f in self.files],
                "nodes": [n.to_dict() for n in self.nodes]}


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def prepare_out(out: str | Path | None, create: bool = True) -> tuple[Path, bool]:
    """The directory to gather dumps into, and whether it was created here.

    Default: a new private directory ``$TMPDIR/mldebug-fr-dumps-<time>-XXXX`` (mode 0700) -
    never the current directory, where a forgotten folder of dumps ends up in a repository.
    A given ``--out`` must not exist (it is created 0700) or be an empty directory: earlier
    dumps are never overwritten nor mixed into a new analysis. ``create=False``: a given
    ``--out`` is only checked (``trigger`` builds it aside and renames it into place).
    """
    import tempfile

    from mldebug.errors import UsageError

    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Path(tempfile.mkdtemp(prefix=f"mldebug-fr-dumps-{stamp}-")), True
    from mldebug.paths import resolve

    if Path(out).is_symlink():
        raise UsageError(f"--out {out} is a symlink; refused.", "Pass a new directory.")
    p = resolve(out)  # '..' after a missing directory refused
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"--out {p} exists and is not a directory.", "Pass a new directory.")
        if p.stat().st_uid != os.geteuid():
            raise UsageError(f"--out {p} belongs to another user (uid {p.stat().st_uid}), who "
                             "could plant links in it while dumps are written.",
                             "Pass a new directory (mldebug creates it, mode 0700).")
        if any(p.iterdir()):
            raise UsageError(f"--out {p} already holds files; dumps of two triggers would be "
                             "mixed (or overwritten).", "Pass a new or empty directory.")
        return p, False
    if not create:
        return p, False
    try:
        p.mkdir(parents=True, mode=0o700)
    except OSError as e:
        raise UsageError(f"cannot create --out {p}: {e.strerror}.",
                         "Pass a directory you can write.") from None
    return p, True


def _write_new(path: Path, data: bytes, mode: int) -> Path:
    """Create ``path`` exclusively (never through a symlink, never over a file); a name
    already taken gets a ``-<n>`` suffix."""
    for n in range(1000):
        cand = path if n == 0 else path.with_name(f"{path.name}-{n}")
        try:
            fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         mode)
        except FileExistsError:
            continue
        with open(fd, "wb") as f:
            f.write(data)
        os.chmod(cand, mode)  # the umask must not widen or narrow what the source had
        return cand
    raise OSError(f"{path}: 1000 files of that name already")


def save_node_doc(host: str, doc: dict[str, Any], out_dir: Path,
                  max_bytes: int = node_script.MAX_DUMP_BYTES) -> NodeOutcome:
    """Write the dumps one node returned; pure apart from writing the files. The node keeps
    its dumps within ``max_bytes`` in all; a node that sends more gets the rest refused.

    Each file keeps its source's permission (0644 stays 0644, anything narrower becomes
    0600): a dump readable only by the job's user is not made readable by all.
    """
    from mldebug.nodetrust import check_host
    from mldebug.paths import name_part

    claim = check_host(host, doc)  # a node speaks for itself: filed under the host asked
    host = name_part(_SAFE.sub("_", str(host)), 255)
    notes, ranks = doc.get("notes", []), doc.get("ranks", [])
    if not isinstance(notes, list) or not isinstance(ranks, list):
        return NodeOutcome(host, errors=["the node sent a malformed document (notes/ranks "
                                         "are not lists); ignored"])
    outcome = NodeOutcome(host, notes=[str(n)[:2000] for n in notes])
    if claim:
        outcome.errors.append(claim)
    left = max_bytes
    for err in doc.get("errors") or []:
        outcome.errors.append(str(err)[:2000])
    for item in ranks:
        if not isinstance(item, dict):
            outcome.errors.append(f"malformed rank item {str(item)[:80]!r}; ignored")
            continue
        rank, pid = item.get("rank"), item.get("pid")
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
        pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        own = item.get("ns_pid")
        own = own if isinstance(own, int) and not isinstance(own, bool) and own != pid else None
        who = f"rank {rank}" + (f" (pid {pid}" + (f", {own} in its pid namespace" if own else "")
                                + ")" if pid else "")
        if item.get("error"):
            outcome.errors.append(f"{who}: {str(item['error'])[:2000]}")
            if item.get("silent") is True:
                outcome.silent.append({"rank": rank, "pid": pid,
                                       "why": str(item["error"])[:2000]})
        data = item.get("data")
        if not data or not isinstance(data, str):
            continue
        try:
            raw = zlib.decompressobj().decompress(base64.b64decode(data),
                                                   min(left, node_script.MAX_DUMP_BYTES) + 1)
        except (ValueError, zlib.error) as e:
            outcome.errors.append(f"{who}: the node sent an unreadable dump ({e})")
            continue
        if len(raw) > min(left, node_script.MAX_DUMP_BYTES):
            outcome.errors.append(f"{who}: the node's dumps are over the per-node cap "
                                  f"({max_bytes} bytes); not written, raise --max-mb")
            continue
        left -= len(raw)
        src_mode = item.get("mode")
        mode = 0o644 if isinstance(src_mode, int) and src_mode & 0o044 == 0o044 else 0o600
        if isinstance(item.get("dir"), str):
            outcome.dirs.append((item["dir"], rank))
        suffix = f"rank{rank}" if rank is not None else f"pid{pid if pid else 'x'}"
        outcome.files.append(_write_new(out_dir / f"fr-{host}-{suffix}", raw, mode))
    return outcome


def silent_finding(result: TriggerResult) -> Finding | None:
    """The ranks that are alive but did not answer the trigger, as the finding they are: a
    healthy rank's recorder dumps within a second, so a silent one is stopped or frozen, and
    the ranks that did answer are not suspects for it (whatever their dumps lack)."""
    from mldebug.findings import Finding, Severity
    from mldebug.render import fold_ints

    silent = [(n.host, s) for n in result.nodes for s in n.silent]
    if not silent:
        return None
    ranks = sorted({s["rank"] for _, s in silent if s["rank"] is not None})
    who = f"rank(s) {fold_ints(ranks)}" if ranks else f"{len(silent)} process(es)"
    answered = len(result.files)
    detail = "\n".join(f"rank {s['rank']} ({h}, pid {s['pid']}): {s['why']}"
                        for h, s in silent[:32])
    return Finding(
        Severity.ERROR,
        f"{who} alive but did not answer the trigger: stopped or frozen"
        + (f" ({answered} other rank(s) answered and are not suspects for this)"
           if answered else ""),
        "A rank whose recorder thread can run writes its dump within a second; these could "
        "not, so they are what holds the job up (their collectives cannot progress either). "
        "Their flight-recorder entries are missing, so any culprit the dumps alone suggest "
        "is limited to what the answering ranks saw.\n" + detail,
        "Look at the silent ranks: resume a stopped one (kill -CONT PID); read a frozen one "
        "with 'mldebug hang --native --pid PID' (py-spy reads a process that holds the GIL).",
        code="fr-silent-ranks", hosts=tuple(sorted({h for h, _ in silent})))


def trigger_local(out_dir: str | Path, timeout: float = 30.0,
                  dump_dir: str | Path | None = None) -> list[Path]:
    """Make every rank on this node dump now; copy the dumps into ``out_dir``.

    ``dump_dir`` is where the ranks' ``mldebug.fr.enable()`` registered (default: the same
    default as enable(): ``$MLDEBUG_FR_DIR`` or ``/tmp/mldebug-fr-<uid>``). Returns the files
    written, ``fr-<host>-rank<R>``; ranks that did not answer within ``timeout`` are skipped
    (use ``trigger_local_report`` for the reasons). Never blocks longer than ``timeout`` + 5 s.
    """
    return trigger_local_report(out_dir, timeout, dump_dir).files


def trigger_local_report(out_dir: str | Path, timeout: float = 30.0,
                         dump_dir: str | Path | None = None,
                         max_bytes: int = node_script.MAX_DUMP_BYTES,
                         discover: bool = False, pids: set[int] | None = None) -> NodeOutcome:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    doc = node_script.trigger_all(str(dump_dir or node_script.default_dir()), timeout,
                                  max_bytes=max_bytes, discover=discover, pids=pids)
    return save_node_doc(str(doc.get("host", "localhost")), doc, out)


def trigger(target: FanoutOptions, out_dir: str | Path | None,
            dump_dir: str | Path | None = None, timeout: float | None = None, *,
            max_bytes: Any = node_script.MAX_DUMP_BYTES, progress: Any = True,
            discover: Any = False, pids: Any = None) -> TriggerResult:
    """Trigger every rank on every node of ``target``; ``timeout`` (default: the options')
    bounds the ranks' answers on each node.

    ``out_dir`` None: a new private temporary directory (see ``prepare_out``). Each node sends
    at most ``max_bytes`` of dumps (checked again here); each node's files are written, and its
    data dropped, the moment that node answers. ``progress``: nodes answered / total and
    failures so far on stderr, on a terminal (``mldebug.progress``).
    ``discover``: also trigger the recorders of every dump directory found in the rank
    processes' environments (``MLDEBUG_FR_DIR``) and ``/tmp/mldebug-fr-<uid>`` of every user.
    ``pids`` (a collection of ints): trigger only these processes, and discover only their
    directories (``mldebug hang --fr`` passes the job's ranks).
    An output directory created here is removed again when no dump came back.
    """
    from mldebug import paths
    from mldebug.lifetime import sigterm_unwinds

    out, created = prepare_out(out_dir, create=False)
    existed = out.exists()
    timeout = target.timeout if timeout is None else timeout
    result = TriggerResult(out, [])
    swapped = False
    # built in a private directory beside --out and renamed into place at the end (SIGINT and
    # SIGTERM held for the rename): an interrupted trigger leaves the finished output or nothing
    with sigterm_unwinds():
        try:
            with paths.staged(out, command="mldebug fr trigger", private=True) as st:
                result.nodes = _trigger_into(target, st.path, dump_dir, timeout, max_bytes,
                                             progress, discover, pids)
                if not result.files:
                    raise _NoDumps
                os.unlink(paths.MARKER, dir_fd=st.fd)  # fr never replaces an output: no marker
            swapped = True
        except _NoDumps:
            pass
        finally:
            if created and not swapped:
                try:
                    out.rmdir()  # the empty temporary directory made here: nothing left behind
                except OSError:
                    pass
    for n in result.nodes:  # the files as they are now, after the rename
        n.files = [out / f.name for f in n.files]
    result.removed = not swapped and (created or not existed)
    return result


class _NoDumps(Exception):
    """No dump came back: the staged output is dropped, nothing is renamed into place."""


def _trigger_into(target: FanoutOptions, out: Path, dump_dir: str | Path | None,
                  timeout: float, max_bytes: Any, progress: Any, discover: Any,
                  pids: Any) -> list[NodeOutcome]:
    if target.is_local:
        only = {int(p) for p in pids} if pids is not None else None
        return [trigger_local_report(out, timeout, dump_dir, int(max_bytes), bool(discover),
                                     only)]
    nodes: list[NodeOutcome] = []

    def on_doc(host: str, doc: dict[str, Any] | None, error: str) -> None:
        if doc is None:
            nodes.append(NodeOutcome(host, errors=[f"node: {error}"]))
            return
        try:
            nodes.append(save_node_doc(host, doc, out, int(max_bytes)))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            nodes.append(NodeOutcome(host, errors=[
                f"node: answered a wrongly typed document ({type(e).__name__}: {e})"]))

    order = _fan_out(target, dump_dir, timeout, int(max_bytes), bool(discover), bool(progress),
                     pids, on_doc)
    rank = {h: i for i, h in enumerate(order)}
    nodes.sort(key=lambda n: rank.get(n.host, len(rank)))
    return nodes


@dataclass
class NodeArgs:
    """The arguments of ``mldebug/fr/node.py`` (``mldebug.fanout.to_argv`` makes its argv)."""

    timeout: float
    max_bytes: int = node_script.MAX_DUMP_BYTES
    dir: str | None = None
    discover: bool = False
    pids: str | None = None  # comma-separated
    list: bool = False  # list the job folders (node.list_homes), trigger nothing


NODE_MODULES = ("mldebug.nodekit", "mldebug.errors", "mldebug.privdir", "mldebug.dist",
                "mldebug.ranks", "mldebug.fr.node")
NODE_SCHEMA = {"host": str, "ranks": list}


def _fan_out(target: FanoutOptions, dump_dir: str | Path | None, timeout: float, max_bytes: int,
             discover: bool, progress: bool, pids: Any,
             on_doc: Callable[[str, dict[str, Any] | None, str], None]) -> list[str]:
    """The one fan-out call of fr: run the node script on every node and hand each node's
    (host, doc, error) to ``on_doc`` the moment it answers; the fan-out keeps no document.
    Returns the hosts in the order asked."""
    from mldebug import fanout

    args = NodeArgs(timeout, max_bytes, None if dump_dir is None else str(dump_dir), discover,
                    None if pids is None else ",".join(str(int(p)) for p in pids))

    def on_result(res: fanout.NodeResult) -> None:
        doc, res.data = res.data, None
        on_doc(res.host, doc, res.error or "no answer")

    results = fanout.run(fanout.NodeJob(NODE_MODULES, args, NODE_SCHEMA),
                         dataclasses.replace(target, timeout=timeout + 10), on_result,
                         progress=progress)
    return [r.host for r in results]


def list_jobs(target: FanoutOptions, dump_dir: str | Path | None = None,
              pids: set[int] | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """``mldebug fr trigger --list``: every node's job folders (``node.list_homes``), one
    document per node ({"host", "homes", "notes", "error"?}), in the order asked."""
    d = str(dump_dir or node_script.default_dir())
    if target.is_local:
        return [node_script.list_homes(d, pids)]
    from mldebug import fanout

    args = NodeArgs(target.timeout, dir=None if dump_dir is None else str(dump_dir), list=True)
    docs: list[dict[str, Any]] = []

    def on_result(res: fanout.NodeResult) -> None:
        doc, res.data = res.data, None
        if not isinstance(doc, dict) or not isinstance(doc.get("homes"), list):
            docs.append({"host": res.host, "homes": [], "notes": [],
                         "error": res.error or "the node sent no list"})
            return
        docs.append({"host": res.host, "homes": [h for h in doc["homes"][:node_script.MAX_HOMES]
                                                 if isinstance(h, dict)],
                     "notes": [str(n)[:2000] for n in doc.get("notes") or []][:20]})

    results = fanout.run(fanout.NodeJob(NODE_MODULES, args, NODE_SCHEMA), target, on_result,
                         progress=progress)
    order = {r.host: i for i, r in enumerate(results)}
    docs.sort(key=lambda doc: order.get(doc["host"], len(order)))
    return docs


def for_hang(target: FanoutOptions, out_dir: str | Path | None, timeout: float,
             fr_dir: str | Path | None = None,
             pids: Any = None) -> tuple[dict[str, Any], Any, Any]:
    """What ``mldebug hang --fr`` adds: trigger the recorders of the job's rank processes
    (``pids``; None: every registered process) - in ``fr_dir`` (default: as enable()) and in
    every directory their environments name - and analyse the dumps. Returns the JSON block,
    the Analysis and the loaded dumps (a DumpSet; both None when no rank answered): the join
    behind ``hang`` (mldebug.cli.why.fr_evidence) reads them as ``why`` reads saved ones."""
    from mldebug.fr.analyze import analyze
    from mldebug.fr.loader import load_files
    from mldebug.render import fold_ints

    result = trigger(target, out_dir, fr_dir, timeout=timeout, discover=True, pids=pids)
    doc: dict[str, Any] = result.to_dict()
    default = str(fr_dir or node_script.default_dir())
    elsewhere: dict[str, list[int]] = {}
    # the default, its fallback (``-XXXXXXXX``) and their job folders: where enable() puts them
    usual = re.compile(re.escape(default.rstrip("/")) + r"(-[A-Za-z0-9_]{8})?")
    for n in result.nodes:
        for d, rank in n.dirs:
            if not (usual.fullmatch(d) or usual.fullmatch(os.path.dirname(d))) \
                    and rank is not None:
                elsewhere.setdefault(d, []).append(rank)
    doc["recorders_elsewhere"] = [{"dir": d, "ranks": sorted(rs)} for d, rs in elsewhere.items()]
    notes = [f"rank(s) {fold_ints(sorted(rs))} had their recorder in {d}, not in {default}"
             for d, rs in elsewhere.items()]
    analysis = ds = None
    if result.files:
        ds = load_files(result.files)
        analysis = analyze(ds)
        analysis.notes.extend(notes)
        if notes:
            from mldebug.fr.diagnose import build_findings

            analysis.findings = build_findings(analysis)
        doc["analysis"] = analysis.to_dict()
    else:
        doc["analysis"] = None
        doc["hint"] = (f"no rank answered in {default} nor in any MLDEBUG_FR_DIR of the rank "
                       "processes: only ranks that called mldebug.fr.enable() can dump on "
                       "demand; if enable(dump_dir=...) names another directory, pass "
                       "--fr-dir DIR (docs/fr.md)")
    doc["notes"] = notes
    return doc, analysis, ds


@dataclass
class WatchResult:
    """Two triggers ``interval`` seconds apart and the window between them."""

    first: TriggerResult
    second: TriggerResult
    since: dict[str, int]  # pg -> last collective seq in the first dumps
    interval: float

    def to_dict(self) -> dict[str, Any]:
        return {"interval_s": self.interval, "since": self.since,
                "first": self.first.to_dict(), "second": self.second.to_dict()}


def last_seqs(files: list[Path]) -> dict[str, int]:
    """Per process group, the highest collective sequence number any of the dumps holds."""
    from mldebug.fr.loader import load_files

    ds = load_files(files)
    since: dict[str, int] = {}
    for tl in ds.timelines:
        for pg, gi in tl.groups.items():
            if gi.seqs and gi.seqs[-1] > since.get(pg, -1):
                since[pg] = gi.seqs[-1]
    return since


def watch(target: FanoutOptions, interval: float, out_dir: str | Path | None,
          dump_dir: str | Path | None = None, timeout: float | None = None,
          pids: Any = None) -> WatchResult:
    """Trigger every rank twice, ``interval`` seconds apart, into ``<out>/1`` and ``<out>/2``;
    the straggler statistics of the second dumps then cover only the collectives between.
    ``pids``: only these processes (``--pid``/``--job``), as for ``trigger``."""
    out, created = prepare_out(out_dir)
    first = trigger(target, out / "1", dump_dir, timeout=timeout, pids=pids)
    since = last_seqs(first.files) if first.files else {}
    time.sleep(interval)
    second = trigger(target, out / "2", dump_dir, timeout=timeout, pids=pids)
    if created and not first.files and not second.files:
        try:
            out.rmdir()
        except OSError:
            pass
    return WatchResult(first, second, since, interval)
