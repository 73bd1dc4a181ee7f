"""Plain data for ``mldebug why``: evidence items in, one verdict with its chain out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# what a claim rests on, strongest first (mldebug.why.join ranks claims by it)
DIRECT = "direct"  # the rank's own record of its fault (its exception, its dump, its record)
INFERRED = "inferred"  # from the others' waits, from silence, from a missing dump
GENERIC = "generic"  # something is wrong, no rank named ("every rank timed out")
HEALTHY = "healthy"  # the source saw nothing wrong


@dataclass(frozen=True)
class Source:
    """Where evidence came from: a file or a directory, the reader that read it, how many
    files, and a short description ("fr dumps of ranks 0-39"). ``run``/``attempt``: the
    torchrun ``--log-dir`` run directory and restart attempt the files all come from (None:
    not one attempt); the join reads an earlier attempt of a run as its history."""

    path: str
    reader: str  # log, elastic, fr, hang, numerics
    files: int = 1
    what: str = ""
    run: str = ""
    attempt: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "reader": self.reader, "files": self.files,
                "what": self.what, "attempt": self.attempt}


@dataclass(frozen=True)
class LauncherClaim:
    """What a launcher says caused the failure (torchrun's "Root Cause": the first rank to
    exit), read by the source's reader: ``said`` ("torchrun's Root Cause names rank 1 (exit
    code 1)"), the rank, what ended that rank (``meaning``), whether that alone marks it as a
    consequence of a failure elsewhere, and the entry's fields for ``--json``."""

    said: str
    rank: int | None
    meaning: str
    consequence: bool
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Evidence:
    """One reader's claim about the job.

    ``scope``: the ranks the source covers (an FR dump set: the ranks it has dumps of; a log:
    the ranks whose lines it carries). ``expected``: the ranks the source itself says the job
    had (a dump's world size), None when it does not say. ``culprits``/``cls``/``fact``/
    ``confidence``/``code``: the reader's verdict (its culprit ranks, fault class, the key fact
    in one sentence, high/medium/low, the code of its deciding finding). ``basis``: DIRECT,
    INFERRED, GENERIC or HEALTHY (set by the caller from the reader's code; the join
    downgrades a DIRECT claim whose culprits lie outside its own scope). ``consequences``:
    what the other ranks did as a result, one sentence (or empty). ``per_rank``: the source
    is one artifact per rank (dumps), so a rank of the job without one is itself evidence."""

    source: Source
    scope: tuple[int, ...]
    culprits: tuple[int, ...]
    cls: str | None
    fact: str
    confidence: str | None
    code: str
    basis: str
    expected: tuple[int, ...] | None = None
    consequences: str = ""
    fix: str = ""
    per_rank: bool = False
    # a launcher's own claim carried by this source (torchrun's "Root Cause"), which the join
    # says the truth of (mldebug.why.join.correct)
    launcher: LauncherClaim | None = None
    # a flight-recorder claim read as a cut through a running job (no culprit): the claim its
    # mismatch makes if the job was stuck instead, which stacks of the same moment can show
    # (mldebug.why.join, rule 8)
    if_stuck: Evidence | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source.path, "reader": self.source.reader,
                "scope": list(self.scope), "culprits": list(self.culprits), "class": self.cls,
                "fact": self.fact, "confidence": self.confidence, "code": self.code,
                "basis": self.basis}


@dataclass(frozen=True)
class Link:
    """One sentence of the evidence chain and the source it comes from."""

    text: str
    source: str
    reader: str

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "source": self.source, "reader": self.reader}


@dataclass
class WhyVerdict:
    """What the join decided: the envelope's six verdict keys plus the chain that led there."""

    kind: str  # culprits, ok, problems, undecided, nothing
    summary: str
    culprits: list[int]
    cls: str | None
    confidence: str | None
    code: str
    chain: list[Link] = field(default_factory=list)
    fix: str = ""
    winner: Evidence | None = None
    # what the join makes of a launcher's "Root Cause" (mldebug.why.join.correct), or None
    correction: dict[str, Any] | None = None
