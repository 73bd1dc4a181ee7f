"""Strip what launchers and loggers put in front of a program's own log line.

The same NCCL or Python line reaches a user behind many prefixes: ANSI colour codes,
timestamps (``[2025-06-06 09:52:01]``, ISO/RFC 3339 from ``kubectl logs --timestamps`` and
CRI files ``... stdout F``), CloudWatch ``| time |`` columns, torchrun ``[rank3]:`` /
``[default3]:``, ``[trainer3]:``, mpirun ``[1,4]<stdout>:``, Ray ``(pid=N, ip=A) `` and
``(RayWorkerWrapper pid=N) ``, ``srun -l`` ``3: ``, pdsh ``host: ``, docker compose
``name  | ``, accelerate ``stdout: ``, and a quoted ``> ``. ``split_prefix`` removes them
and mldebug's own ``[host:rank] `` (several may be stacked) and returns the innermost label
(a rank or host) it saw.

Every pattern is anchored and has no nested repetition, so a line costs time linear in
its length whatever it contains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_PREFIXES = 8  # stacked prefixes removed at most (a bound, not a real-world count)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]{0,200}\x07")

# (pattern, group holding the label or None, what the prefix says: rank / pid / host / time / "").
# Tried in order at the start of the line (as one compiled alternation: one C call per prefix).
_PATTERNS: list[tuple[str, str | None, str]] = [
    # [1,4]<stdout>: (Open MPI --tag-output): job 1, rank 4
    (r"\[\d+,(?P<l>\d+)\]<(?:stdout|stderr)>:\s?", "l", "rank"),
    # [rank3]: [default3]: [RANK 3]: [trainer3]: [trainer0|0]: (torchrun, custom launchers)
    (r"\[(?P<l>[A-Za-z_]{0,20} ?\d{1,7})(?:\|\d{1,7})?\]:\s?", "l", "rank"),
    # Ray: (pid=34272) (pid=21780, ip=10.221.0.5) (RayWorkerWrapper pid=285, ip=1.2.3.4)
    (r"\((?:[\w.-]{1,60} )?pid=(?P<l>\d{1,10})(?:, ip=(?P<ip>[\w.:-]{1,60}))?"
     r"(?:, [\w=.:-]{1,80}){0,4}\)\s", "l", "pid"),
    # ISO / RFC 3339 timestamps (kubectl --timestamps, CRI log files: "... stdout F ")
    (r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
     r"(?: (?:stdout|stderr) [FP])?\s+(?:\|\s+)?", None, "time"),
    # [2025-06-06 09:52:01] [2025-06-06 09:52:01,123] [12:00:01.5] [I 2024...] 【2025-09-25 14:27:49】
    (r"[\[【][^\]】\n]{0,40}\d\d:\d\d:\d\d[^\]】\n]{0,20}[\]】]\s?", None, "time"),
    # mldebug's own printflock / rank_print / install_excepthook: "[host:rank] " ("-" off torchrun)
    (r"\[(?P<h>[A-Za-z0-9][\w.-]{0,62}):(?P<l>\d{1,7}|-)\](?: |$)", "l", "hostrank"),
    # CloudWatch / table columns: "  | 2024-11-28T07:42:11.525Z | "
    (r"\s{0,8}\|\s+", None, ""),
    # docker compose: "bug_1  | "
    (r"(?P<l>[\w.-]{1,60}) {1,20}\|\s", "l", "host"),
    # mpirun/srun style "[3] " and "> " quoting
    (r"\[(?P<l>\d{1,7})\]\s(?=[^\s:]{1,200}:[^\s:]{1,40}:[^\s:]{1,40} \[)", "l", "rank"),
    # a job or container label in front of NCCL's own head (Kubeflow: "pytorch host:pid:tid [0] ")
    (r"[A-Za-z][\w.-]{0,60} (?=[^\s:\[\]]{1,200}:[^\s:]{1,40}:[^\s:]{1,40} \[\d)", None, ""),
    (r">\s?", None, ""),
    # accelerate test output
    (r"(?:stdout|stderr): ", None, ""),
    # srun -l "3: " and pdsh "host: " (a space after the colon: NCCL's host:pid:tid has none);
    # the name must hold a digit, '.' or '-' so that "RuntimeError: ..." stays a message
    # and "torch.OutOfMemoryError: ..." (a dotted exception name) too
    # (nor "pkg.mod.ClassName: ...": a dotted name whose last part is capitalised is a class)
    (r"(?![\w.-]{0,62}(?:Error|Exception|Warning|Interrupt|Exit): |mldebug[.:]|[\w.]{0,62}\.[A-Z]\w{0,62}: )"
     r"(?P<l>(?=[\w.-]{0,62}[\d.-])[A-Za-z0-9][\w.-]{0,62}): (?=\S)", "l", "host"),
]


def _combine() -> tuple[re.Pattern[str], dict[str, tuple[str | None, str | None, str]]]:
    """One alternation ``(?P<p0>...)|(?P<p1>...)``: ``m.lastgroup`` names the pattern that
    matched (the first, in order, as the loop over separate patterns did)."""
    parts = []
    table: dict[str, tuple[str | None, str | None, str]] = {}
    for i, (pat, group, kind) in enumerate(_PATTERNS):
        renamed = re.sub(r"\(\?P<(\w+)>", lambda m, i=i: f"(?P<{m[1]}{i}>", pat)  # type: ignore[misc]
        parts.append(f"(?P<p{i}>{renamed})")
        table[f"p{i}"] = (f"{group}{i}" if group else None, f"ip{i}" if "(?P<ip>" in pat else
                          (f"h{i}" if "(?P<h>" in pat else None), kind)
    return re.compile("|".join(parts)), table


_ANY, _KIND = _combine()
_LABEL = re.compile(r"(?:rank|default|RANK |trainer|worker)?\s?(\d+)")


@dataclass(frozen=True)
class Prefix:
    """What the prefixes of one line said, and the line after them."""

    rest: str
    label: str | None = None  # the innermost label: a rank number, a host, a Ray pid or ip
    rank: int | None = None  # from a rank prefix ([rank3]:, [1,3]<stderr>:, srun -l "3: ")
    host: str | None = None  # pdsh "host: ", docker compose name, Ray ip, mldebug's [host:rank]
    pid: int | None = None  # Ray (pid=N)
    time: str | None = None  # the text of the first timestamp prefix


def strip_prefix(line: str, keep_indent: bool = False
                 ) -> tuple[str, str | None, int | None, str | None, int | None, str | None]:
    """``(rest, label, rank, host, pid, time)``: ``parse_prefix`` without building an object
    (the per-line path of ``mldebug log``)."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    label: str | None = None
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    when: str | None = None
    raw = line
    rest = line.lstrip(" \t")
    match = _ANY.match
    for _ in range(MAX_PREFIXES):
        m = match(rest)
        if m is None or m.end() == 0:
            break
        group, extra, kind = _KIND[m.lastgroup]  # type: ignore[index]
        if kind == "time":
            if when is None:
                when = m.group(0).strip(" \t|[]【】")
        elif group is not None:
            value = m.group(group)
            ip = m.group(extra) if extra is not None and kind == "pid" else None
            label = ip or _label(value)
            if ip:
                host = host or ip
            if kind == "pid":
                pid = int(value)
            elif kind == "hostrank":
                host = host or (m.group(extra) if extra else None)
                if value.isdecimal():
                    rank = int(value) if rank is None else rank
                    label = value
                else:
                    label = host
            elif label.isdecimal() and kind in ("rank", "host"):
                rank = int(label) if rank is None else rank
            elif kind == "host":
                host = host or label
        raw = rest[m.end():]
        rest = raw.lstrip(" \t")
    return (raw if keep_indent else rest), label, rank, host, pid, when


def parse_prefix(line: str, *, keep_indent: bool = False) -> Prefix:
    """Strip every prefix of ``line`` and say what each one told (rank, host, pid, time).

    ``keep_indent`` keeps the white space after the last prefix (a traceback's ``  File``
    lines are told from its last line by their indentation)."""
    return Prefix(*strip_prefix(line, keep_indent))


def split_prefix(line: str) -> tuple[str | None, str]:
    """``(label, rest)``: the launcher/logger label (rank number or host) if any, the line after."""
    p = parse_prefix(line)
    return p.label, p.rest


def _label(value: str) -> str:
    """``rank3`` / ``default3`` / ``RANK 3`` -> ``3``; a host name stays as it is."""
    if value.isdecimal():
        return value
    m = _LABEL.fullmatch(value)
    return m.group(1) if m else value
