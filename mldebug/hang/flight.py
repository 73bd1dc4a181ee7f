"""``mldebug hang --fr``: the flight recorder of the same ranks beside the stacks.

Triggers a flight-recorder dump on every rank that called ``mldebug.fr.enable()``, analyses
the dumps across ranks, and renders that analysis after the hang report.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mldebug.fanout import FanoutOptions

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class FlightRecord:
    doc: dict[str, Any]  # the trigger result (and the analysis) for --json
    analysis: Any = None  # mldebug.fr.analyze's result, None when no rank answered

    def to_dict(self) -> dict[str, Any]:
        return self.doc


def collect(target: FanoutOptions, out: Path | None, timeout: float, *,
            fr_dir: str | None = None, pids: list[int] | None = None) -> FlightRecord:
    """Trigger the flight recorders of the job's rank processes (``pids``) on the same nodes -
    in ``fr_dir`` and in every directory their environments name - and analyse the dumps."""
    from mldebug.fr.collect import for_hang

    where = out / "fr" if out else Path(tempfile.mkdtemp(prefix="mldebug-hang-fr-"))
    doc, analysis = for_hang(target, where, timeout, fr_dir, pids)
    if out is None and not doc.get("files"):
        try:
            os.rmdir(where)  # the empty directory made here: nothing came back to keep
            doc["out_dir"] = None
        except OSError:
            pass
    return FlightRecord(doc, analysis)


def render(record: FlightRecord, console: Console) -> None:
    doc = record.doc
    console.print()
    if doc.get("out_dir"):
        console.print(f"Flight recorder: {len(doc['files'])} dump(s) in {doc['out_dir']}/",
                      soft_wrap=True)
    else:
        console.print("Flight recorder: no dump came back", soft_wrap=True)
    if record.analysis is None:
        console.print(f"  {doc.get('hint')}", soft_wrap=True)
        return
    from mldebug.fr.report import render as fr_render

    fr_render(record.analysis, console)
