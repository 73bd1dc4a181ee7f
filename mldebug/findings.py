"""The shared Finding type every diagnostic reports through, and its rendering.

A finding always carries a fix: what is wrong is only half of it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


class Severity(str, enum.Enum):
    """Ordered from most to least severe."""

    ERROR = "error"
    WARNING = "warning"
    HINT = "hint"
    INFO = "info"

    @property
    def rank(self) -> int:
        return _ORDER[self]

    @property
    def style(self) -> str:
        return _STYLE[self]


_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.HINT: 2, Severity.INFO: 3}
_STYLE = {
    Severity.ERROR: "bold red",
    Severity.WARNING: "yellow",
    Severity.HINT: "cyan",
    Severity.INFO: "dim",
}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: how bad, what, the evidence, and what to do about it."""

    severity: Severity
    title: str
    detail: str = ""
    fix: str = ""
    code: str = ""  # stable identifier for scripts, e.g. "nccl-socket-ifname-no-match"
    hosts: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.value
        d["hosts"] = list(self.hosts)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(
            severity=Severity(d["severity"]),
            title=d["title"],
            detail=d.get("detail", ""),
            fix=d.get("fix", ""),
            code=d.get("code", ""),
            hosts=tuple(d.get("hosts", ())),
        )


def fold_hosts(hosts: Iterable[str]) -> str:
    """node[1-64] for a host list; names hostlist cannot fold (from logs: commas, brackets)
    are listed as they are, after the foldable ones."""
    import hostlist

    names = sorted(set(hosts))
    odd = [h for h in names if any(c in h for c in ",[]")]
    plain = [h for h in names if h not in set(odd)]
    try:
        folded = str(hostlist.collect_hostlist(plain)) if plain else ""
    except hostlist.BadHostlist:
        folded = ",".join(plain)
    return ",".join(x for x in [folded, *odd] if x)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first; stable within a severity."""
    return sorted(findings, key=lambda f: f.severity.rank)


def worst(findings: Iterable[Finding]) -> Severity | None:
    ranked = sort_findings(findings)
    return ranked[0].severity if ranked else None


def findings_to_json(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [f.to_dict() for f in sort_findings(findings)]


def finding_lines(findings: Iterable[Finding]) -> list[list[tuple[str, str]]]:
    """Findings most severe first, as lines of (text, rich style) segments: the one layout,
    printed by ``render_findings`` through rich and by plain-text writers without it."""
    from mldebug.text import sanitize  # titles and details quote outside text (hosts, logs)

    lines: list[list[tuple[str, str]]] = []
    for f in sort_findings(findings):
        head = [(f"{f.severity.value.upper():<7}", f.severity.style), (" ", ""),
                (sanitize(f.title), "bold")]
        if f.hosts:
            head.append((f"  [{sanitize(fold_hosts(f.hosts))}]", "dim"))  # node[1-64]
        lines.append(head)
        lines.extend([("        " + sanitize(d), "")] for d in f.detail.splitlines())
        if f.fix:
            lines.append([("        fix: ", "green"), (sanitize(f.fix), "")])
    return lines


def render_findings(
    findings: Sequence[Finding], console: Console, *, empty: str = "No problems found."
) -> None:
    """Print findings most severe first, each with its fix."""
    from rich.text import Text

    if not findings:
        console.print(Text(empty, style="green"))
        return
    for line in finding_lines(findings):
        text = Text()
        for part, style in line:
            text.append(part, style=style or None)
        console.print(text)
