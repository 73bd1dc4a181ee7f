"""Findings of a ``mldebug hang --signal`` collection: which route produced each rank's stack
and which ranks have no handler. Pure over the node documents; ``render`` prints them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from mldebug.findings import Finding, Severity, findings_to_json, render_findings
from mldebug.hang.signal_node import NO_HANDLER
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console

    from mldebug.fanout import NodeResult


def _who(procs: list[tuple[str, dict[str, Any]]]) -> str:
    ranks = [(p.get("identity") or {}).get("rank") for _, p in procs]
    known = [r for r in ranks if isinstance(r, int)]
    text = f"rank{'s' if len(known) != 1 else ''} {fold_ints(known)}" if known else ""
    unknown = len(ranks) - len(known)
    if unknown:
        shown = ", ".join(f"{h}:{p['pid']}" for h, p in procs if not isinstance(
            (p.get("identity") or {}).get("rank"), int))[:200]
        text = (text + " and " if text else "") + f"process{'es' if unknown > 1 else ''} {shown}"
    return text


def signal_findings(results: Sequence[NodeResult],
                    held: Collection[tuple[str, int]] | None = None) -> list[Finding]:
    """``held``: the (host, pid) of the ranks the report holds; a rank that answered but whose
    stacks the analysis could not use (its node's document was refused) is not said to have
    answered, so these findings never name more ranks than the header counts."""
    by_route: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    no_handler: list[tuple[str, dict[str, Any]]] = []
    for r in results:
        doc = r.data or {}
        host = str(doc.get("host") or r.host)
        for p in doc.get("processes") or ():
            if p.get("error") == NO_HANDLER:
                no_handler.append((host, p))
            elif p.get("route") and (held is None or (r.host, p.get("pid")) in held):
                by_route[str(p["route"])].append((host, p))
    hosts = lambda procs: tuple(sorted({h for h, _ in procs}))  # noqa: E731
    out: list[Finding] = []
    if no_handler:
        out.append(Finding(
            Severity.WARNING, f"{_who(no_handler)}: no dump handler, not signalled",
            detail="An uncaught SIGUSR1 would kill a rank, so only ranks whose handler is seen "
                   "in /proc/PID/status are asked.",
            fix="Add mldebug.watchdog() (or mldebug.install_dump_handler()) to the training "
                "script, or run mldebug hang without --signal (py-spy, needs ptrace).",
            code="capture-no-handler", hosts=hosts(no_handler)))
    if by_route.get("faulthandler"):
        procs = by_route["faulthandler"]
        out.append(Finding(
            Severity.INFO, f"{_who(procs)} answered through the C-level faulthandler",
            detail="The Python route did not answer in time: a thread probably holds the GIL "
                   "in a C call. These stacks have no thread names or locals.",
            fix="Look at the innermost frame of the main thread on these ranks: a C call that "
                "does not release the GIL blocks every Python thread of the process.",
            code="capture-route-faulthandler", hosts=hosts(procs)))
    if by_route.get("python"):
        procs = by_route["python"]
        out.append(Finding(Severity.INFO, f"{_who(procs)} answered through the Python route",
                           fix="", code="capture-route-python", hosts=hosts(procs)))
    return out


def to_dict(results: Sequence[NodeResult],
            held: Collection[tuple[str, int]] | None = None) -> dict[str, Any]:
    return {"mode": "signal", "findings": findings_to_json(signal_findings(results, held))}


def render(results: Sequence[NodeResult], console: Console,
           held: Collection[tuple[str, int]] | None = None) -> None:
    console.print()
    render_findings(signal_findings(results, held), console, empty="")
