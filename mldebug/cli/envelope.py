"""One JSON shape for every command's ``--json`` output (docs/json.md).

Every document starts with the same keys::

    {"schema": "mldebug.CMD[.SUB]/N",   # what follows and its version
     "verdict": {"kind", "summary", "culprits", "class", "confidence", "code"},  # deciders only
     "findings": [...],                  # always a list (mldebug.findings.Finding.to_dict)
     ...the command's own fields...,
     "deprecated": {FIELD: "what replaces it"}}   # only where old fields are kept

``wrap`` builds it from the document a command's report gives (``to_dict()``): the command's
fields stay where they were, so a script written for the older shape keeps working for one
release; ``deprecated`` names the fields that go at the next schema and what replaces each.
A command without a verdict (make-tiny, mem report, docs...) has no ``verdict`` key.

Pure: no I/O, no heavy import; the CLI sets the running command (``running``) and every
``--json`` print goes through ``mldebug.cli._common.print_doc``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

# the document version of each command key ("CMD" or "CMD.SUB"), bumped when a field is
# renamed or removed; 2 for every command that had a --json before the envelope came (the
# schema string they had, if any, stays one release as ``legacy_schema``)
VERSIONS: dict[str, int] = {
    "hang": 3, "hang.analyze": 3, "fr.analyze": 2, "fr.trigger": 2, "fr.jobs": 1, "fr.watch": 2, "env": 2,
    "nccl-log": 2, "log": 2, "dist-test": 2, "numerics.report": 2, "make-tiny": 2,
    "shrink-layers": 2, "make-tiny-dataset": 2, "mem.report": 2, "mem.compare": 2,
    "mem.plot": 2, "mem.top": 2, "mem.peak": 2, "mem.probe": 2, "pdb.list": 2,
    "trace.show": 2, "docs": 2, "completion": 1, "why": 1,
}

VERDICT_KEYS = ("kind", "summary", "culprits", "class", "confidence", "code")
CONFIDENCE = ("high", "medium", "low")

_RUNNING: contextvars.ContextVar[tuple[str, str | None]] = contextvars.ContextVar(
    "mldebug_command", default=("", None))


def running(command: str, sub: str | None = None) -> None:
    """Say which command prints (the CLI dispatcher does, once the arguments are parsed)."""
    _RUNNING.set((command, sub))


def current() -> tuple[str, str | None]:
    return _RUNNING.get()


def key_of(command: str, sub: str | None) -> str:
    return f"{command}.{sub}" if sub and f"{command}.{sub}" in VERSIONS else command


def schema_of(command: str, sub: str | None = None) -> str:
    key = key_of(command, sub)
    return f"mldebug.{key}/{VERSIONS.get(key, 1)}"


def verdict(kind: str, summary: str, culprits: list[int] | None = None, cls: str | None = None,
            confidence: str | None = None, code: str = "") -> dict[str, Any]:
    """The envelope's verdict: what the command decided, in the same six keys everywhere."""
    assert confidence is None or confidence in CONFIDENCE, confidence
    return {"kind": kind, "summary": summary, "culprits": sorted(set(culprits or [])),
            "class": cls, "confidence": confidence, "code": code}


def _first(findings: list[dict[str, Any]], *severities: str) -> dict[str, Any] | None:
    return next((f for f in findings if f.get("severity") in severities), None)


# --- each deciding command's verdict, read from its own document ---------------------------

_HANG_CONFIDENCE = {"suspects": "high", "progress": "high", "same-place": "low",
                    "ambiguous": "low", "no-processes": None}


def _hang(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    old = doc.get("verdict")
    if not isinstance(old, dict):  # --signal's document: findings only
        return None, {}
    culprits = [s["rank"] for s in doc.get("suspects") or [] if s.get("rank") is not None]
    kind = str(old.get("kind", ""))
    return {**verdict(kind, str(old.get("summary", "")), culprits, old.get("class"),
                      _HANG_CONFIDENCE.get(kind), str(old.get("code", "")))}, {}


def _log(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    from mldebug.log.classes import class_of

    old = doc.get("verdict")
    culprits = list(doc.get("culprits") or [])
    sure = doc.pop("confidence", None)
    if not isinstance(old, dict):
        first = _first(doc.get("findings") or [], "error", "warning")
        return verdict("ok" if first is None else "problems",
                       "no failure found in these lines" if first is None else first["title"],
                       [], "healthy", None,
                       "" if first is None else first.get("code", "")), {}
    kind = "culprits" if culprits else ("undecided" if sure == "low" else "problems")
    v = verdict(kind, str(old.get("title", "")), culprits, class_of(old.get("code", "")),
                sure, str(old.get("code", "")))
    # the verdict was the Finding itself: its keys stay for one release
    legacy = {k: old[k] for k in ("severity", "title", "detail", "fix", "hosts") if k in old}
    return {**v, **legacy}, {
        "verdict.title": "verdict.summary",
        "verdict.severity": "findings[0].severity",
        "verdict.detail": "findings[0].detail",
        "verdict.fix": "findings[0].fix",
        "verdict.hosts": "findings[0].hosts",
    }


def _fr_verdict(doc: dict[str, Any]) -> dict[str, Any]:
    from mldebug.fr.classes import class_of

    culprits = list(doc.get("culprit_ranks") or [])
    findings = doc.get("findings") or []
    first = _first(findings, "error", "warning")
    cls = class_of(doc)
    kind = "culprits" if culprits else ("ok" if cls == "healthy" else "undecided")
    summary = first["title"] if first else (
        "every rank recorded the same collectives" if cls == "healthy" else
        "the dumps do not name a culprit")
    return verdict(kind, summary, culprits, cls, "high" if culprits or cls == "healthy"
                   else "low", first.get("code", "") if first else "")


def _fr(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    if "culprit_ranks" in doc:
        return _fr_verdict(doc), {"culprit_ranks": "verdict.culprits"}
    if isinstance(doc.get("analysis"), dict):  # trigger --analyze, watch
        return _fr_verdict(doc["analysis"]), {}
    return None, {}


def _numerics(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    text = doc.pop("verdict", "")
    doc["verdict_text"] = text
    first = doc.get("first") or None
    f0 = _first(doc.get("findings") or [], "error", "warning")
    coll = doc.get("collectives") or None
    if coll and (not first or coll.get("step", 0) <= first.get("step", 0)):
        # a collective-fingerprint mismatch (the report's verdict text says so first)
        v = verdict("culprits" if coll.get("differing") else "problems", str(text),
                    list(coll.get("differing") or []), "desync", "high",
                    f0.get("code", "") if f0 else "")
    elif first:
        v = verdict("culprits" if first.get("rank") is not None else "problems", str(text),
                    [first["rank"]] if first.get("rank") is not None else [], "non-finite",
                    "high", f0.get("code", "") if f0 else "")
    elif doc.get("replica"):
        v = verdict("culprits", str(text), list(doc["replica"].get("differing") or []),
                    "replica-diverged", "high", f0.get("code", "") if f0 else "")
    else:
        v = verdict("ok", str(text), [], None, "high", f0.get("code", "") if f0 else "")
    return v, {"verdict_text": "verdict.summary (verdict was this string before schema 2)"}


def _dist_test(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    findings = doc.get("findings") or []
    first = _first(findings, "error", "warning")
    bad = [r["rank"] for r in doc.get("ranks") or []
           if isinstance(r, dict) and r.get("status", "ok") != "ok" and r.get("rank") is not None]
    ok = bool(doc.get("ok"))
    return verdict("ok" if ok else ("culprits" if bad else "problems"),
                   "every check passed on every rank" if ok else
                   (first["title"] if first else "a check failed"),
                   [] if ok else bad, None, "high",
                   first.get("code", "") if first else ""), {}


def _checks(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """env and nccl-log: a verdict from the worst finding (they name hosts, not ranks)."""
    first = _first(doc.get("findings") or [], "error", "warning")
    if first is None:
        return verdict("ok", "no problem found", [], None, "high"), {}
    return verdict("problems", first["title"], [], None, "high", first.get("code", "")), {}


def _trace(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    world = len(doc.get("ranks") or [])
    divs = [d for d in doc.get("divergences") or [] if d.get("ranks")]
    first = _first(doc.get("findings") or [], "error", "warning")
    if doc.get("progress"):  # live: every ring moved between two reads (a slow branch)
        return verdict("ok", "every rank's ring moved between two reads: the job makes "
                       "progress", [], "healthy", "medium", "trace-progress"), {}
    if doc.get("busy"):  # live: a minority kept running while the rest stood still
        f = next((f for f in doc.get("findings") or [] if f.get("code") == "trace-busy-elsewhere"),
                 first)
        return verdict("culprits", f["title"] if f else "busy elsewhere", list(doc["busy"]),
                       "spinning", "medium", "trace-busy-elsewhere"), {}
    if divs and world and len(divs[0]["ranks"]) < world / 2:
        return verdict("culprits", first["title"] if first else "ranks diverge",
                       list(divs[0]["ranks"]), "desync", "medium",
                       first.get("code", "") if first else ""), {}
    if divs:
        return verdict("undecided", first["title"] if first else "ranks diverge", [],
                       None, "low", first.get("code", "") if first else ""), {}
    return verdict("ok", "every rank ran the same calls", [], None, "high"), {}


def _why(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """why's verdict is the join's (mldebug.why.join), already in the six keys."""
    v = doc.pop("verdict")
    return verdict(str(v["kind"]), str(v["summary"]), list(v["culprits"]), v["class"],
                   v["confidence"], str(v["code"])), {}


DECIDERS: dict[str, Callable[[dict[str, Any]], tuple[dict[str, Any] | None, dict[str, str]]]] = {
    "hang": _hang, "hang.analyze": _hang, "log": _log, "fr.analyze": _fr, "fr.trigger": _fr,
    "fr.watch": _fr, "numerics.report": _numerics, "dist-test": _dist_test, "env": _checks,
    "nccl-log": _checks, "trace.show": _trace, "why": _why,
}


def wrap(doc: dict[str, Any], command: str | None = None, sub: str | None = None
         ) -> dict[str, Any]:
    """The envelope around one command's document (a new dict; ``doc`` may be changed)."""
    if command is None:
        command, sub = current()
    if not command:  # called outside the CLI (a library caller): the document as it is
        return doc
    key = key_of(command, sub)
    deprecated: dict[str, str] = {}
    legacy = doc.pop("schema", None)
    if "format" in doc and isinstance(doc["format"], str) and doc["format"].startswith("mldebug."):
        legacy = doc["format"]
        deprecated["format"] = "schema"
    elif legacy is not None:
        deprecated["legacy_schema"] = "schema"
    decide = DECIDERS.get(key)
    v, more = decide(doc) if decide else (None, {})
    deprecated.update(more)
    out: dict[str, Any] = {"schema": schema_of(command, sub)}
    if v is not None:
        out["verdict"] = v
    elif "verdict" in doc:
        out["verdict"] = doc.pop("verdict")
    out["findings"] = doc.pop("findings", None) or []
    doc.pop("verdict", None)
    if legacy is not None and "format" not in deprecated:
        out["legacy_schema"] = legacy
    out.update(doc)
    if deprecated:
        out["deprecated"] = deprecated
    return out
