"""Scoring the fault matrix: per route, precision and recall of the culprit ranks, class
accuracy, false suspects on the no-culprit cases, median and p90 seconds to verdict. Pure:
results in, a table out (tests/test_faults.py scores hand-made results)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# a route's verdict class -> the matrix's classes it stands for ("outside" is either)
WIDE = {"outside": {"blocked", "spinning", "stopped"}}


@dataclass
class Outcome:
    """What one route said about one case."""

    case: str  # fault name
    route: str
    truth: list[int]  # the culprit ranks (empty: no culprit)
    classes: list[str]  # accepted classes
    culprits: list[int] | None  # None: the route gave no answer (failed, not applicable)
    cls: str | None  # the route's class, in the matrix's vocabulary
    seconds: float
    summary: str = ""
    error: str = ""
    ranks: int = 4
    seed: int = 0
    peer: bool = False

    @property
    def answered(self) -> bool:
        return self.culprits is not None

    @property
    def class_ok(self) -> bool:
        if self.cls is None or self.culprits is None:
            return False
        return bool(({self.cls} | WIDE.get(self.cls, set())) & set(self.classes))

    @property
    def exact(self) -> bool:
        return self.culprits is not None and set(self.culprits) == set(self.truth)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "class_ok": self.class_ok, "exact": self.exact}


@dataclass
class RouteScore:
    route: str
    cases: int = 0
    answered: int = 0
    tp: int = 0
    fp: int = 0
    fn: int = 0
    exact: int = 0
    class_ok: int = 0
    no_culprit_cases: int = 0
    false_suspect_cases: int = 0
    seconds: list[float] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    class_scored: bool = True

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def class_accuracy(self) -> float:
        return self.class_ok / self.cases if self.cases else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "cases": self.cases, "answered": self.answered,
                "precision": round(self.precision, 3), "recall": round(self.recall, 3),
                "exact": self.exact,
                "class_accuracy": round(self.class_accuracy, 3) if self.class_scored else None,
                "no_culprit_cases": self.no_culprit_cases,
                "false_suspect_cases": self.false_suspect_cases,
                "median_s": _q(self.seconds, 0.5), "p90_s": _q(self.seconds, 0.9),
                "wrong": self.wrong}


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    i = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return round(s[i], 2)


def score(outcomes: Iterable[Outcome]) -> dict[str, RouteScore]:
    """One RouteScore per route, in the order routes first appear. A case the route did not
    answer counts its culprits as missed (recall), never as a precision hit."""
    table: dict[str, RouteScore] = {}
    outcomes = list(outcomes)
    # a route whose answers carry no class (the py-spy fold: stacks, not a verdict) is
    # scored on its culprits alone, and its class column says so
    classless = {o.route for o in outcomes} - {o.route for o in outcomes if o.cls is not None}
    for o in outcomes:
        s = table.setdefault(o.route, RouteScore(o.route, class_scored=o.route not in classless))
        s.cases += 1
        got = set(o.culprits or [])
        truth = set(o.truth)
        if o.answered:
            s.answered += 1
            s.seconds.append(o.seconds)
        s.tp += len(got & truth)
        s.fp += len(got - truth)
        s.fn += len(truth - got)
        s.exact += o.exact
        s.class_ok += o.class_ok
        if not truth:
            s.no_culprit_cases += 1
            s.false_suspect_cases += bool(got)
        if not (o.exact and (o.class_ok or not s.class_scored)):
            said = "no answer" if not o.answered else f"{sorted(got) or 'none'}/{o.cls}"
            s.wrong.append(f"{o.case}: {said} (truth {sorted(truth) or 'none'}/{o.classes[0]})")
    return table


HEADER = ("route", "cases", "precision", "recall", "exact", "class acc", "false susp.",
          "median s", "p90 s")


def table_rows(scores: dict[str, RouteScore]) -> list[tuple[str, ...]]:
    rows = []
    for s in scores.values():
        d = s.to_dict()
        rows.append((s.route, str(s.cases), f"{s.precision:.2f}", f"{s.recall:.2f}",
                     f"{s.exact}/{s.cases}",
                     f"{s.class_accuracy:.2f}" if s.class_scored else "-",
                     f"{s.false_suspect_cases}/{s.no_culprit_cases}",
                     _fmt(d["median_s"]), _fmt(d["p90_s"])))
    return rows


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def markdown(scores: dict[str, RouteScore]) -> str:
    """The scoreboard as a Markdown table (docs/benchmarks.md keeps it)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(scores)]
    return "\n".join(lines)


def text(scores: dict[str, RouteScore]) -> str:
    rows = [HEADER, *table_rows(scores)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
