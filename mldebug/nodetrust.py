"""A node's answer describes that node only.

Every node document arrives over pdsh from a machine that may be hostile or misconfigured.
``check_host`` keeps the answer filed under the host we asked (never the host the document
claims: a node cannot speak for another), ``duplicate_ranks`` flags one rank answered from two
hosts instead of merging them, and ``mldebug.paths.name_part`` makes any host, rank or pid safe
inside a file name.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from mldebug.findings import Finding, Severity
from mldebug.text import sanitize


def _short(host: str) -> str:
    return host.split(".", 1)[0].lower()


CLAIM = "answered as host "  # how check_host's line starts: a note, the node did answer


def check_host(asked: str, doc: Mapping[str, Any]) -> str | None:
    """None when ``doc`` names no host, or the host asked (its short name alike); otherwise
    one line saying what it claimed - the answer stays filed under ``asked``."""
    claimed = doc.get("host")
    if claimed is None or claimed == asked:
        return None
    if isinstance(claimed, str) and _short(claimed) == _short(asked):
        return None
    return (f"{CLAIM}{sanitize(repr(claimed), limit=80)}, not as {asked}: filed under "
            f"{asked}, the host asked")


def duplicate_ranks(procs: Iterable[tuple[str, int | None, str, int]]
                    ) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """``(job, rank, host, pid)`` rows -> the ranks of a job that answered from more than one
    host, with every (host, pid) that claimed them."""
    seen: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    for job, rank, host, pid in procs:
        if rank is not None:
            seen[(job, rank)].append((host, pid))
    return {k: v for k, v in seen.items() if len({h for h, _ in v}) > 1}


def duplicate_rank_finding(dups: Mapping[tuple[str, int], list[tuple[str, int]]]
                           ) -> Finding | None:
    if not dups:
        return None
    lines = [f"rank {rank}{f' of {job}' if job else ''}: "
             + ", ".join(f"{sanitize(h)} pid {p}" for h, p in claims)
             for (job, rank), claims in sorted(dups.items(), key=lambda kv: kv[0][1])[:10]]
    return Finding(
        Severity.WARNING,
        f"{len(dups)} rank{'s' if len(dups) != 1 else ''} answered from more than one host; "
        "kept apart, not merged",
        "\n".join(lines),
        "Two jobs share a rendezvous, or a node answers for another: check the job's hosts "
        "(--job KEY narrows to one job).", "duplicate-ranks",
        tuple(sorted({h for claims in dups.values() for h, _ in claims})))
