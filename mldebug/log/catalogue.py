"""PyTorch's distributed error strings as data (``torch_messages.json``): which component said
a line, its cause and its fix; and the known PyTorch bugs by version (``torch_known.json``).

A catalogue string is a format: ``{}`` stands for a field. A line matches a string when the
string's longest literal piece is in the line and the whole format matches there (fields
as up to 300 characters). Loaded once, on first use.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).parent
MIN_ANCHOR = 10  # characters of literal text a string needs to be told apart from others
GENERIC = "unclassified"


@dataclass(frozen=True)
class Message:
    text: str
    component: str
    source: str
    versions: tuple[str, ...]
    anchor: str
    regex: str  # compiled on the first line that holds the anchor (most never do)

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compiled(self.regex)


@dataclass(frozen=True)
class Match:
    message: Message
    cause: str
    fix: str

    @property
    def code(self) -> str:
        return f"torch-{self.message.component}"


@lru_cache(maxsize=1024)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex)


def _compile(text: str) -> tuple[str, str]:
    pieces = text.split("{}")
    anchor = max(pieces, key=len).strip()
    return anchor, ".{0,300}?".join(re.escape(p) for p in pieces)


@lru_cache(maxsize=1)
def _catalogue() -> tuple[list[Message], dict[str, dict[str, str]]]:
    data = json.loads((HERE / "torch_messages.json").read_text())
    msgs = []
    for m in data["messages"]:
        anchor, rx = _compile(m["text"])
        if len(anchor) < MIN_ANCHOR:
            continue
        msgs.append(Message(m["text"], m["component"], m["source"], tuple(m["versions"]), anchor, rx))
    msgs.sort(key=lambda m: -len(m.text.replace("{}", "")))  # the most specific string first
    return msgs, data["components"]


def messages() -> list[Message]:
    return _catalogue()[0]


def match(line: str) -> Match | None:
    """The catalogue string ``line`` holds (the longest that matches), or None."""
    msgs, comps = _catalogue()
    for m in msgs:
        if m.anchor in line and m.pattern.search(line):
            comp = comps.get(m.component)
            if comp is None:
                return None
            return Match(m, comp["cause"], comp["fix"])
    return None


@dataclass(frozen=True)
class KnownIssue:
    signature: str
    affected: str  # a version range as written in the source: ">=2.2,<2.4"
    fixed_in: str
    title: str
    source: str


@lru_cache(maxsize=1)
def known_issues() -> list[KnownIssue]:
    data = json.loads((HERE / "torch_known.json").read_text())
    return [KnownIssue(k["signature"], k["affected"], k["fixed_in"], k["title"], k["source"])
            for k in data["issues"]]


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _in_range(version: str, spec: str) -> bool:
    v = _version(version)
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(>=|<=|<|>|==)\s*([\d.]+)\s*", part)
        if m is None:
            return False
        op, ref = m[1], _version(m[2])
        ok = {">=": v >= ref, "<=": v <= ref, "<": v < ref, ">": v > ref, "==": v[:len(ref)] == ref}[op]
        if not ok:
            return False
    return True


def known_for(line: str, torch_version: str | None) -> KnownIssue | None:
    """A known PyTorch bug whose signature ``line`` holds and whose range holds the version."""
    if not torch_version:
        return None
    for k in known_issues():
        if k.signature in line and _in_range(torch_version, k.affected):
            return k
    return None
