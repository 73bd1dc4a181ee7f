"""From the nodes' answers to a list of sessions with findings; choosing the one to connect to.

Pure functions: the node documents come in as plain dicts (validated here, one bad node
never spoils the others' answers), so they are tested without a cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from mldebug.debugger.model import NodeError, Session, SessionList, Skipped
from mldebug.errors import MldebugError
from mldebug.findings import Finding, Severity
from mldebug.render import fold_ints


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_str(v: Any, limit: int = 4096) -> str | None:
    return v[:limit] if isinstance(v, str) else None


def session_from_doc(host: str, d: Any) -> Session:
    """One session from a node's document; ValueError when it is not one."""
    if not isinstance(d, dict):
        raise ValueError("a session entry is not an object")
    pid, port = _opt_int(d.get("pid")), _opt_int(d.get("port"))
    if pid is None or port is None or not 0 < port < 65536:
        raise ValueError("a session entry lacks a valid pid or port")
    return Session(host=_opt_str(d.get("host"), 255) or host, pid=pid, port=port,
                   kind=_opt_str(d.get("kind"), 32) or "pdb", rank=_opt_int(d.get("rank")),
                   local_rank=_opt_int(d.get("local_rank")),
                   world_size=_opt_int(d.get("world_size")), run_id=_opt_str(d.get("run_id"), 255),
                   slurm_job=_opt_str(d.get("slurm_job"), 64),
                   file=_opt_str(d.get("file")), line=_opt_int(d.get("line")),
                   function=_opt_str(d.get("function"), 255))


def session_list(answers: Iterable[tuple[str, dict[str, Any] | None, str | None]]) -> SessionList:
    """``answers``: (host, document or None, error) per node, as the fan-out returns them."""
    out = SessionList()
    for host, doc, error in answers:
        out.hosts.append(host)
        if doc is None:
            out.errors.append(NodeError(host, error or "no answer"))
            continue
        if doc.get("error"):
            out.errors.append(NodeError(host, str(doc["error"])[:500]))
            continue
        try:
            entries = doc.get("sessions") or []
            if not isinstance(entries, list):
                raise ValueError("'sessions' is not a list")
            sessions = [session_from_doc(host, d) for d in entries]
        except ValueError as e:
            out.errors.append(NodeError(host, f"answered a malformed document: {e}"))
            continue
        out.sessions += sessions
        for s in doc.get("skipped") or []:
            if isinstance(s, dict):
                out.skipped.append(Skipped(host, str(s.get("file"))[:255], str(s.get("reason"))[:500]))
    out.sessions.sort(key=lambda s: (s.run_id or "", s.rank if s.rank is not None else -1,
                                     s.host, s.pid))
    out.findings = findings(out)
    return out


def findings(sl: SessionList) -> list[Finding]:
    """What a user should know about the list: nothing open, nodes not reached, ambiguity."""
    found: list[Finding] = []
    if sl.errors:
        found.append(Finding(
            Severity.WARNING, f"{len(sl.errors)} node(s) did not answer",
            detail="\n".join(f"{e.host}: {e.reason}" for e in sl.errors[:5]),
            fix="Sessions there are not listed; check ssh to those nodes (mldebug hang "
                "--nodes reaches them the same way).",
            code="pdb-node-error", hosts=tuple(e.host for e in sl.errors)))
    if not sl.sessions:
        found.append(Finding(
            Severity.INFO, "no debugger session is open",
            fix="A rank opens one at mldebug.breakpoint(rank=N) (or post-mortem with "
                "install_excepthook(debug=True)) when it has no terminal; check --nodes and "
                "that you are the user who runs the job.", code="pdb-none-open"))
    by_rank: dict[int, set[str]] = defaultdict(set)
    for s in sl.sessions:
        if s.rank is not None:
            by_rank[s.rank].add(s.run_id or f"{s.host}:{s.pid}")
    ambiguous = [r for r, runs in by_rank.items() if len(runs) > 1]
    if ambiguous:
        found.append(Finding(
            Severity.HINT, f"rank(s) {fold_ints(ambiguous)} have sessions in several jobs",
            fix="Connect with HOST:PORT (the 'connect' column) instead of the rank.",
            code="pdb-rank-ambiguous"))
    if any(s.kind == "debugpy" for s in sl.sessions):
        found.append(Finding(
            Severity.WARNING, "debugpy sessions accept any local user",
            detail="debugpy has no token: whoever connects to the port first on that node "
                   "gets the session (pdb sessions require the token).",
            fix="Attach your IDE now, or use pdb sessions on nodes you share.",
            code="pdb-debugpy-no-token"))
    if sl.skipped:
        found.append(Finding(
            Severity.INFO, f"{len(sl.skipped)} registration(s) skipped",
            detail="\n".join(f"{s.host}: {s.file}: {s.reason}" for s in sl.skipped[:5]),
            fix="Stale ones belong to ranks that ended without closing their session; they "
                "are harmless and may be removed.", code="pdb-skipped-registration",
            hosts=tuple(s.host for s in sl.skipped)))
    return found


def choose(sessions: Sequence[Session], rank: int) -> Session:
    """The one pdb session of ``rank``; a clear error when there is none or several."""
    match = [s for s in sessions if s.rank == rank and s.kind != "debugpy"]
    if not match:
        open_ranks = fold_ints(s.rank for s in sessions if s.rank is not None)
        raise MldebugError(
            f"no pdb session of rank {rank} is open"
            + (f" (open: rank(s) {open_ranks})" if open_ranks else ""),
            "Check mldebug pdb list (with the same --nodes / --slurm-job); the rank opens one "
            "when it reaches mldebug.breakpoint().")
    if len(match) > 1:
        raise MldebugError(
            f"{len(match)} sessions of rank {rank} are open: "
            + ", ".join(s.target for s in match[:8]),
            "Connect to one of them as HOST:PORT.")
    return match[0]
