"""NCCL's own messages as data: every WARN format string of NCCL 2.12 .. today, its component,
a fix per component and causes for the common strings (catalogue.json, written by
scripts/nccl_catalogue.py from NVIDIA/nccl's source plus the hand-written rules in it).

``lookup(message)`` finds the format string a WARN message was printed from: each format
becomes an anchored regular expression (``%d`` -> digits, ``%s`` -> any text ...), compiled
the first time it is tried. Candidates are found by the format's first literal word (a dict)
and, for formats that start with a specifier, by their longest literal piece; the literal
pieces must occur in order before the regular expression runs, so a failing match costs a few
``str.find`` calls. Matching is per distinct WARN kind, never per log line.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("catalogue.json")
MAX_MESSAGE = 4096  # longer messages are matched on their start
_SPEC = re.compile(r"%[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|z|j|t|L|q)?"
                   r"([diouxXeEfgGcspnma%])")
_VALUE = {
    "d": r"[-+]?\d+", "i": r"[-+]?\d+", "u": r"\d+", "o": r"[0-7]+",
    "x": r"(?:0[xX])?[0-9a-fA-F]+", "X": r"(?:0[xX])?[0-9a-fA-F]+",
    "p": r"(?:0[xX][0-9a-fA-F]+|\(nil\)|0|[0-9a-fA-F]+)",
    "e": r"[-+0-9.eEnaif]+", "E": r"[-+0-9.eEnaif]+", "f": r"[-+0-9.eEnaif]+",
    "g": r"[-+0-9.eEnaif]+", "G": r"[-+0-9.eEnaif]+", "a": r"[-+0-9.xXpPa-fA-F]+",
    "c": r".", "s": r".*?", "m": r".*?", "%": r"%", "n": r"",
}
_WORD = re.compile(r"\S+")
_ERRNO_NUM = re.compile(r"\berrno:? (\d{1,3})\b|\berror:? (?:\w+ )?\(?(\d{1,3})\)?(?:\s|$)")
_CALL_TO = re.compile(r"Call to (\w{1,64})")


def _vkey(v: str) -> tuple[int, ...]:
    """'2.21.5+cuda12.4' -> (2, 21, 5)."""
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+", 1)[0])[:3])


def first_word(text: str) -> str:
    m = _WORD.match(text)
    return m.group(0) if m else ""


@dataclass
class Entry:
    """One format string of the catalogue."""

    format: str
    level: str
    files: list[str]
    versions: list[list[str]]
    component: str | None
    literals: list[str] = field(default_factory=list)  # the literal pieces, in order
    conditions: list[dict[str, Any]] = field(default_factory=list)  # what prints it, per version
    _regex: re.Pattern[str] | None = None

    @property
    def literal_len(self) -> int:
        return sum(len(s) for s in self.literals)

    def regex(self) -> re.Pattern[str]:
        if self._regex is None:
            out: list[str] = []
            pos = 0
            for m in _SPEC.finditer(self.format):
                lit = _lit(self.format[pos:m.start()])
                value = _VALUE.get(m.group(1), r".*?")
                if value == r".*?" and not lit and out and out[-1] == r".*?":
                    pos = m.end()  # '%s%s%s': one lazy run, not nested ones (backtracking)
                    continue
                out += [lit, value] if lit else [value]
                pos = m.end()
            out.append(_lit(self.format[pos:]))
            self._regex = re.compile("".join(out), re.S)
        return self._regex

    def matches(self, msg: str) -> bool:
        at = 0
        for lit in self.literals:  # cheap test first: the literal pieces in order
            at = msg.find(lit, at)
            if at < 0:
                return False
            at += len(lit)
        return self.regex().fullmatch(msg) is not None

    @property
    def version_text(self) -> str:
        return ", ".join(a if a == b else f"{a}-{b}" for a, b in self.versions)


def _lit(text: str) -> str:
    """A literal piece as a pattern; blanks match any run of blanks (the catalogue folds
    runs of blanks and line breaks, a log may cut or strip them)."""
    return r"\s*".join(re.escape(w) for w in text.split(" "))


def _literals(fmt: str) -> list[str]:
    return [p.strip() for p in _SPEC.split(fmt)[::2] if p.strip()]


@dataclass
class Classified:
    component: str
    title: str
    fix: str
    cause: str | None
    entry: Entry | None  # the format string matched, if any
    how: str = "format"  # what decided the component: format, values, source file, context
    condition: CondCause | None = None  # the cause decided by the condition in NCCL's source


@dataclass
class CondRule:
    """A cause keyed by the condition that prints a string (calls, function, test, macro) and
    the errno the line prints, not by the file it lives in (catalogue.json condition_causes)."""

    id: str
    title: str
    cause: str
    fix: str | None
    kind: str | None
    errno: tuple[str, ...]
    weak: bool  # keyed by the condition alone: a hand-written cause of the message wins
    match: dict[str, re.Pattern[str]]  # calls/function/test/macro/format/value -> regex


@dataclass
class CondCause:
    """One condition-level cause found for a message: the rule, the condition of NCCL's source
    it matched and the errno the line printed (or the condition tests)."""

    rule: CondRule
    condition: dict[str, Any]
    errno: str | None

    @property
    def text(self) -> str:
        """The cause, with the errno and the condition it was decided by."""
        return self.rule.cause

    @property
    def evidence(self) -> str:
        c = self.condition
        where = c.get("function", "?")
        what = ((f"unless ({c['test']})" if c.get("negated") else f"if ({c['test']})")
                if c.get("test")
                else f"on the '{c['label']}:' path" if c.get("label") else "")
        calls = c.get("calls") or []
        parts = [f"NCCL's {where}()" + (f" prints it {what}" if what else "")]
        if calls:
            parts.append("calls " + ", ".join(calls[:4]))
        if self.errno:
            parts.append(f"errno {self.errno}")
        if c.get("returns"):
            parts.append(f"returns {c['returns']}")
        versions = ", ".join(a if a == b else f"{a}-{b}" for a, b in c.get("versions", []))
        return "; ".join(parts) + (f" (NCCL {versions})" if versions else "")


# components that say little on their own: the WARN's source file or the setup line before
# it (which transport was being connected) decide instead
VAGUE = ("cuda", "socket", "proxy", "internal")
SETUP = ("ib-verbs", "roce-gid", "bootstrap", "shm", "p2p", "nvls", "collnet", "net-plugin",
         "cumem", "memreg")


class Catalogue:
    def __init__(self, data: dict[str, Any]) -> None:
        self.components: dict[str, dict[str, str]] = data.get("components", {})
        self.rules = [(r["component"], re.compile(r["file"]) if "file" in r else None,
                       re.compile(r["text"]) if "text" in r else None)
                      for r in data.get("rules", [])]
        self.causes = [(re.compile(c["match"]), c["cause"], c.get("fix"))
                       for c in data.get("causes", [])]
        self.tags: list[str] = data.get("tags", [])
        self.errno: dict[str, tuple[int, str]] = {k: (v[0], v[1])
                                                  for k, v in data.get("errno", {}).items()}
        # strerror texts, longest first ('No such device or address' before 'No such device')
        self._errno_text = sorted(((t, k) for k, (_, t) in self.errno.items()),
                                  key=lambda tk: -len(tk[0]))
        self._errno_num = {n: k for k, (n, _) in sorted(self.errno.items(), reverse=True)}
        self.cond_rules = [
            CondRule(c["id"], c["title"], c["cause"], c.get("fix"), c.get("kind"),
                     tuple(c.get("errno", ())),
                     not (c.get("errno") or c.get("value") or c.get("strong")),
                     {k: re.compile(c[k]) for k in ("calls", "function", "where", "test",
                                                    "macro", "format", "value") if k in c})
            for c in data.get("condition_causes", [])]
        self.entries = [Entry(s["format"], s["level"], s["files"], s["versions"],
                              s.get("component"), _literals(s["format"]),
                              s.get("conditions", []))
                        for s in data.get("strings", [])]
        self._by_word: dict[str, list[Entry]] = defaultdict(list)
        self._rest: list[tuple[str, Entry]] = []  # (longest literal, entry)
        for e in self.entries:
            if e.level != "WARN" or not e.literals:
                continue
            word = first_word(e.format)
            if word and "%" not in word:
                self._by_word[word].append(e)
            else:
                self._rest.append((max(e.literals, key=len), e))
        for lst in self._by_word.values():
            lst.sort(key=lambda e: -e.literal_len)
        self._rest.sort(key=lambda le: -le[1].literal_len)

    def classify(self, text: str, files: list[str] | tuple[str, ...] = (),
                 text_only: bool = False, file_only: bool = False) -> str | None:
        """The component of a format (with its source files) or of a bare message;
        ``text_only``: by the rules that read the text alone; ``file_only``: by the rules
        that read the source file."""
        for comp, file_re, text_re in self.rules:
            if file_only and file_re is None:
                continue
            if file_re is not None and (text_only or not any(file_re.search(f) for f in files)):
                continue
            if text_re is not None and not text_re.search(text):
                continue
            return comp
        return None

    def lookup(self, msg: str) -> Entry | None:
        """The WARN format string ``msg`` was printed from (the most literal one), or None."""
        msg = msg.strip()[:MAX_MESSAGE]
        best = self._lookup(msg)
        if best is None and msg[-1:] in ".;:,":
            # a full stop the person pasting added, or a later version's format that ends
            # without one: the same message
            best = self._lookup(msg[:-1].rstrip())
        return best

    def _lookup(self, msg: str) -> Entry | None:
        best: Entry | None = None
        for e in self._by_word.get(first_word(msg), ()):
            if e.matches(msg):
                best = e
                break
        for lit, e in self._rest:
            if best is not None and e.literal_len <= best.literal_len:
                break
            if lit in msg and e.matches(msg):
                best = e
                break
        return best

    def errno_of(self, msg: str) -> str | None:
        """The errno a message prints: glibc's strerror text, else 'errno N' / 'error N'."""
        msg = msg[:MAX_MESSAGE]
        # the first text printed ('returned 113(No route to host) errno 115(...)': the
        # result before the errno), the longest at one place ('No such device or address')
        best: tuple[int, int, str] | None = None
        for text, name in self._errno_text:
            at = msg.find(text)
            if at >= 0 and (best is None or (at, -len(text)) < best[:2]):
                best = (at, -len(text), name)
        if best is not None:
            return best[2]
        m = _ERRNO_NUM.search(msg)
        return self._errno_num.get(int(m.group(1) or m.group(2))) if m else None

    def condition_rules(self, entry: Entry, cond: dict[str, Any],
                        msg: str | None = None) -> list[CondRule]:
        """The condition causes whose condition part fits ``cond`` (errno not checked)."""
        calls = list(cond.get("calls", ())) + _CALL_TO.findall(entry.format)
        if msg is not None and "Call to %s" in entry.format:
            calls += _CALL_TO.findall(msg[:MAX_MESSAGE])  # SYSCHECK's #call, ibvwrap's name
        fields = {"function": [cond.get("function") or ""], "test": [cond.get("test") or ""],
                  "where": [cond.get("function") or "", *calls],
                  "macro": [cond.get("macro") or ""], "format": [entry.format],
                  "calls": calls or [""], "value": [msg[:MAX_MESSAGE] if msg else ""]}
        out = []
        for rule in self.cond_rules:
            # without a message (coverage), a rule's condition part alone is checked
            if all(any(pat.search(v) for v in fields[k]) for k, pat in rule.match.items()
                   if msg is not None or k != "value"):
                out.append(rule)
        return out

    def condition_cause(self, entry: Entry | None, msg: str,
                        version: str | None = None) -> CondCause | None:
        """The cause decided by the condition that printed ``msg`` and the errno it prints;
        ``version``: the NCCL version of the line, whose conditions are tried first."""
        if entry is None or not entry.conditions or not self.cond_rules:
            return None
        printed = self.errno_of(msg)
        conds = entry.conditions
        if version:
            k = _vkey(version)
            conds = sorted(conds, key=lambda c: not any(
                _vkey(a) <= k <= _vkey(b) for a, b in c.get("versions", [])))
        for cond in conds:
            if cond.get("negated") and printed in cond.get("errno", ()):
                continue  # printed only when the errno is none of these: not this condition
            # an errno the condition compares with '==' (not '!='), when the line prints none
            tested = [e for e in cond.get("errno", ()) if not cond.get("negated")
                      and re.search(r"==\s*" + e + r"\b", cond.get("test", ""))]
            err = printed or (tested[0] if len(tested) == 1 else None)
            for rule in self.condition_rules(entry, cond, msg):
                if rule.errno and err not in rule.errno:
                    continue
                return CondCause(rule, cond, err)
        return None

    def cause(self, msg: str) -> tuple[str, str | None] | None:
        for pat, cause, fix in self.causes:
            if pat.search(msg):
                return cause, fix
        return None

    def describe(self, msg: str, src: str | None = None, context: str | None = None,
                 version: str | None = None) -> Classified | None:
        """Component, fix and cause of one WARN message; None if nothing classifies it.
        ``src``: NCCL's 'file.cc:123' from the log line; ``context``: the INFO line the same
        process printed just before (what NCCL was setting up)."""
        entry = self.lookup(msg)
        comp = entry.component if entry is not None else None
        how = "format"
        own = self.classify(entry.format, text_only=True) if entry is not None else None
        if own is None:
            # 'Call to %s failed : %s': the values (ibv_reg_mr, connect ...) say more
            by_text = self.classify(msg, text_only=True)
            if by_text is not None and by_text != comp:
                comp, how = by_text, "values"
        if own is None or own in VAGUE:
            # 'Cuda failure %d '%s'' is printed all over NCCL: where, and what NCCL was
            # setting up just before, name the component
            if src and (comp is None or comp in VAGUE):
                path = src.rsplit(":", 1)[0].removeprefix("src/")
                by_file = self.classify(msg, [path], file_only=True)
                if by_file in SETUP:
                    comp, how = by_file, "source file"
            if context and (comp is None or comp in VAGUE):
                by_context = self.classify(context, text_only=True)
                if by_context in SETUP:
                    comp, how = by_context, "context"
        if comp is None or comp not in self.components:
            return None
        info = self.components[comp]
        c = self.cause(msg) or (self.cause(entry.format) if entry is not None else None)
        cause, fix = (c[0], c[1] or info["fix"]) if c else (None, info["fix"])
        cc = self.condition_cause(entry, msg, version)
        if cc is not None and cc.rule.weak and c:
            cc = None  # a generic condition: the hand-written cause says more
        if cc is not None:  # the condition in NCCL's source and the errno printed decide
            cause, fix = cc.text, cc.rule.fix or fix
        return Classified(comp, info["title"], fix, cause, entry, how, cc)


@lru_cache(maxsize=1)
def load() -> Catalogue:
    """The packaged catalogue (read once per process)."""
    return Catalogue(json.loads(PATH.read_text(encoding="utf-8")))
