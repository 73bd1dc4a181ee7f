"""``mldebug hang --fr``: the flight recorder of the same ranks beside the stacks.

Triggers a flight-recorder dump on every rank that called ``mldebug.fr.enable()``, analyses
the dumps across ranks, and renders that analysis after the hang report.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mldebug.fanout import Target

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class FlightRecord:
    doc: dict[str, Any]  # the trigger result (and the analysis) for --json
    analysis: Any = None  # mldebug.fr.analyze's result, None when no rank answered

    def to_dict(self) -> dict[str, Any]:
        return self.doc


def collect(target: Target, out: Path | None, timeout: float,
            fanout_kw: dict[str, Any]) -> FlightRecord:
    """Trigger flight-recorder dumps on the same nodes and analyse them across ranks."""
    from mldebug.fr.analyze import analyze as fr_analyze
    from mldebug.fr.collect import trigger
    from mldebug.fr.loader import load_files

    where = out / "fr" if out else Path(tempfile.mkdtemp(prefix="mldebug-hang-fr-"))
    result = trigger(target, where, None, timeout=timeout, **fanout_kw)
    doc: dict[str, Any] = result.to_dict()
    analysis = None
    if result.files:
        analysis = fr_analyze(load_files(result.files))
        doc["analysis"] = analysis.to_dict()
    else:
        doc["analysis"] = None
        doc["hint"] = ("no rank answered: only ranks that called mldebug.fr.enable() can dump "
                       "on demand (docs/fr.md)")
    return FlightRecord(doc, analysis)


def render(record: FlightRecord, console: Console) -> None:
    doc = record.doc
    console.print()
    console.print(f"Flight recorder: {len(doc['files'])} dump(s) in {doc['out_dir']}/",
                  soft_wrap=True)
    if record.analysis is None:
        console.print(f"  {doc.get('hint')}", soft_wrap=True)
        return
    from mldebug.fr.report import render as fr_render

    fr_render(record.analysis, console)
