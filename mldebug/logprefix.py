"""Strip what launchers and loggers put in front of a program's own log line.

The same NCCL or Python line reaches a user behind many prefixes: ANSI colour codes,
timestamps (``[2025-06-06 09:52:01]``, ISO/RFC 3339 from ``kubectl logs --timestamps`` and
CRI files ``... stdout F``), CloudWatch ``| time |`` columns, torchrun ``[rank3]:`` /
``[default3]:``, ``[trainer3]:``, mpirun ``[1,4]<stdout>:``, Ray ``(pid=N, ip=A) `` and
``(RayWorkerWrapper pid=N) ``, ``srun -l`` ``3: ``, pdsh ``host: ``, docker compose
``name  | ``, accelerate ``stdout: ``, and a quoted ``> ``. ``split_prefix`` removes them
(several may be stacked) and returns the innermost label (a rank or host) it saw.

Every pattern is anchored and has no nested repetition, so a line costs time linear in
its length whatever it contains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_PREFIXES = 8  # stacked prefixes removed at most (a bound, not a real-world count)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]{0,200}\x07")

# (pattern, group holding the label or None, what the prefix says: rank / pid / host / time / "").
# Tried in order at the start of the line.
_PATTERNS: list[tuple[re.Pattern[str], str | None, str]] = [
    # [1,4]<stdout>: (Open MPI --tag-output): job 1, rank 4
    (re.compile(r"\[\d+,(?P<l>\d+)\]<(?:stdout|stderr)>:\s?"), "l", "rank"),
    # [rank3]: [default3]: [RANK 3]: [trainer3]: [trainer0|0]: (torchrun, custom launchers)
    (re.compile(r"\[(?P<l>[A-Za-z_]{0,20} ?\d{1,7})(?:\|\d{1,7})?\]:\s?"), "l", "rank"),
    # Ray: (pid=34272) (pid=21780, ip=10.221.0.5) (RayWorkerWrapper pid=285, ip=1.2.3.4)
    (re.compile(r"\((?:[\w.-]{1,60} )?pid=(?P<l>\d{1,10})(?:, ip=(?P<ip>[\w.:-]{1,60}))?"
                r"(?:, [\w=.:-]{1,80}){0,4}\)\s"), "l", "pid"),
    # ISO / RFC 3339 timestamps (kubectl --timestamps, CRI log files: "... stdout F ")
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
                r"(?: (?:stdout|stderr) [FP])?\s+(?:\|\s+)?"), None, "time"),
    # [2025-06-06 09:52:01] [2025-06-06 09:52:01,123] [12:00:01.5] [I 2024...] 【2025-09-25 14:27:49】
    (re.compile(r"[\[【][^\]】\n]{0,40}\d\d:\d\d:\d\d[^\]】\n]{0,20}[\]】]\s?"), None, "time"),
    # CloudWatch / table columns: "  | 2024-11-28T07:42:11.525Z | "
    (re.compile(r"\s{0,8}\|\s+"), None, ""),
    # docker compose: "bug_1  | "
    (re.compile(r"(?P<l>[\w.-]{1,60}) {1,20}\|\s"), "l", "host"),
    # mpirun/srun style "[3] " and "> " quoting
    (re.compile(r"\[(?P<l>\d{1,7})\]\s(?=[^\s:]{1,200}:[^\s:]{1,40}:[^\s:]{1,40} \[)"), "l", "rank"),
    (re.compile(r">\s?"), None, ""),
    # accelerate test output
    (re.compile(r"(?:stdout|stderr): "), None, ""),
    # srun -l "3: " and pdsh "host: " (a space after the colon: NCCL's host:pid:tid has none);
    # the name must hold a digit, '.' or '-' so that "RuntimeError: ..." stays a message
    # and "torch.OutOfMemoryError: ..." (a dotted exception name) too
    (re.compile(r"(?![\w.-]{0,62}(?:Error|Exception|Warning|Interrupt|Exit): )"
                r"(?P<l>(?=[\w.-]{0,62}[\d.-])[A-Za-z0-9][\w.-]{0,62}): (?=\S)"), "l", "host"),
]


@dataclass(frozen=True)
class Prefix:
    """What the prefixes of one line said, and the line after them."""

    rest: str
    label: str | None = None  # the innermost label: a rank number, a host, a Ray pid or ip
    rank: int | None = None  # from a rank prefix ([rank3]:, [1,3]<stderr>:, srun -l "3: ")
    host: str | None = None  # pdsh "host: ", docker compose name, Ray ip
    pid: int | None = None  # Ray (pid=N)
    time: str | None = None  # the text of the first timestamp prefix


def parse_prefix(line: str, *, keep_indent: bool = False) -> Prefix:
    """Strip every prefix of ``line`` and say what each one told (rank, host, pid, time).

    ``keep_indent`` keeps the white space after the last prefix (a traceback's ``  File``
    lines are told from its last line by their indentation)."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    label: str | None = None
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    when: str | None = None
    raw = line
    rest = line.lstrip(" \t")
    for _ in range(MAX_PREFIXES):
        for pattern, group, kind in _PATTERNS:
            m = pattern.match(rest)
            if m is None or m.end() == 0:
                continue
            if kind == "time" and when is None:
                when = m.group(0).strip(" \t|[]【】")
            if group is not None:
                value = m.group(group)
                ip = m.groupdict().get("ip")
                label = ip or _label(value)
                if ip:
                    host = host or ip
                if kind == "pid":
                    pid = int(value)
                elif label.isdigit() and kind in ("rank", "host"):
                    rank = int(label) if rank is None else rank
                elif kind == "host":
                    host = host or label
            raw = rest[m.end():]
            rest = raw.lstrip(" \t")
            break
        else:
            break
    return Prefix(raw if keep_indent else rest, label, rank, host, pid, when)


def split_prefix(line: str) -> tuple[str | None, str]:
    """``(label, rest)``: the launcher/logger label (rank number or host) if any, the line after."""
    p = parse_prefix(line)
    return p.label, p.rest


def _label(value: str) -> str:
    """``rank3`` / ``default3`` / ``RANK 3`` -> ``3``; a host name stays as it is."""
    m = re.fullmatch(r"(?:rank|default|RANK |trainer|worker)?\s?(\d+)", value)
    return m.group(1) if m else value
