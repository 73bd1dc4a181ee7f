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

MAX_PREFIXES = 8  # stacked prefixes removed at most (a bound, not a real-world count)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]{0,200}\x07")

# (pattern, group holding the label or None). Tried in order at the start of the line.
_PATTERNS: list[tuple[re.Pattern[str], str | None]] = [
    # [1,4]<stdout>: (Open MPI --tag-output): job 1, rank 4
    (re.compile(r"\[\d+,(?P<l>\d+)\]<(?:stdout|stderr)>:\s?"), "l"),
    # [rank3]: [default3]: [RANK 3]: [trainer3]: [trainer0|0]: (torchrun, custom launchers)
    (re.compile(r"\[(?P<l>[A-Za-z_]{0,20} ?\d{1,7})(?:\|\d{1,7})?\]:\s?"), "l"),
    # Ray: (pid=34272) (pid=21780, ip=10.221.0.5) (RayWorkerWrapper pid=285, ip=1.2.3.4)
    (re.compile(r"\((?:[\w.-]{1,60} )?pid=(?P<l>\d{1,10})(?:, ip=(?P<ip>[\w.:-]{1,60}))?"
                r"(?:, [\w=.:-]{1,80}){0,4}\)\s"), "l"),
    # ISO / RFC 3339 timestamps (kubectl --timestamps, CRI log files: "... stdout F ")
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
                r"(?: (?:stdout|stderr) [FP])?\s+(?:\|\s+)?"), None),
    # [2025-06-06 09:52:01] [2025-06-06 09:52:01,123] [12:00:01.5] [I 2024...]
    (re.compile(r"\[[^\]\n]{0,40}\d\d:\d\d:\d\d[^\]\n]{0,20}\]\s?"), None),
    # CloudWatch / table columns: "  | 2024-11-28T07:42:11.525Z | "
    (re.compile(r"\s{0,8}\|\s+"), None),
    # docker compose: "bug_1  | "
    (re.compile(r"(?P<l>[\w.-]{1,60}) {1,20}\|\s"), "l"),
    # mpirun/srun style "[3] " and "> " quoting
    (re.compile(r"\[(?P<l>\d{1,7})\]\s(?=[^\s:]{1,200}:[^\s:]{1,40}:[^\s:]{1,40} \[)"), "l"),
    (re.compile(r">\s?"), None),
    # accelerate test output
    (re.compile(r"(?:stdout|stderr): "), None),
    # srun -l "3: " and pdsh "host: " (a space after the colon: NCCL's host:pid:tid has none);
    # the name must hold a digit, '.' or '-' so that "RuntimeError: ..." stays a message
    (re.compile(r"(?P<l>(?=[\w.-]{0,62}[\d.-])[A-Za-z0-9][\w.-]{0,62}): (?=\S)"), "l"),
]


def split_prefix(line: str) -> tuple[str | None, str]:
    """``(label, rest)``: the launcher/logger label (rank number or host) if any, the line after."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    label: str | None = None
    rest = line.lstrip(" \t")
    for _ in range(MAX_PREFIXES):
        for pattern, group in _PATTERNS:
            m = pattern.match(rest)
            if m is None or m.end() == 0:
                continue
            if group is not None:
                value = m.group(group)
                ip = m.groupdict().get("ip")
                label = ip or _label(value)
            rest = rest[m.end():].lstrip(" \t")
            break
        else:
            break
    return label, rest


def _label(value: str) -> str:
    """``rank3`` / ``default3`` / ``RANK 3`` -> ``3``; a host name stays as it is."""
    m = re.fullmatch(r"(?:rank|default|RANK |trainer|worker)?\s?(\d+)", value)
    return m.group(1) if m else value
