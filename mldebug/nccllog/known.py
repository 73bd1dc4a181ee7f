"""Known NCCL bugs by version (known_issues.json): a log whose NCCL version and message match
a row is told "known bug in X, fixed in Y", with the row's sources. Pure: no I/O after load."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PATH = Path(__file__).with_name("known_issues.json")
_VERSION = re.compile(r"(\d{1,3})\.(\d{1,3})\.(\d{1,4})")


def version_tuple(v: str | None) -> tuple[int, int, int] | None:
    m = _VERSION.match(v or "")
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


@dataclass(frozen=True)
class KnownIssue:
    id: str
    summary: str
    fixed: str
    sources: tuple[str, ...]
    first: str | None  # first affected version (None: any older)
    last: str  # last affected version
    message: re.Pattern[str] | None = None
    source_file: re.Pattern[str] | None = None
    env: str | None = None
    env_value: re.Pattern[str] | None = None
    workaround: str | None = None
    env_differs: bool = False  # the setting differs between processes (not just set)

    def affects(self, version: str | None) -> bool:
        v = version_tuple(version)
        if v is None:
            return False
        lo = version_tuple(self.first) if self.first else (0, 0, 0)
        hi = version_tuple(self.last)
        return lo is not None and hi is not None and lo <= v <= hi

    def matches_message(self, msg: str, src: str = "") -> bool:
        if self.message is None or not self.message.search(msg[:4096]):
            return False
        return self.source_file is None or bool(self.source_file.search(src or msg[:300]))

    def matches_env(self, env: dict[str, str]) -> bool:
        if self.env is None or self.env not in env:
            return False
        return self.env_value is None or bool(self.env_value.search(env[self.env]))

    @property
    def range_text(self) -> str:
        if not self.first:
            return f"<= {self.last}"
        return self.first if self.first == self.last else f"{self.first}-{self.last}"


@lru_cache(maxsize=1)
def load() -> list[KnownIssue]:
    rows = json.loads(PATH.read_text(encoding="utf-8"))["rows"]

    def rx(key: str, r: dict) -> re.Pattern[str] | None:
        return re.compile(r[key]) if key in r else None
    return [KnownIssue(r["id"], r["summary"], r["fixed"], tuple(r["sources"]), r.get("from"),
                       r["to"], rx("message", r), rx("source_file", r), r.get("env"),
                       rx("env_value", r), r.get("workaround"), bool(r.get("env_differs")))
            for r in rows]
