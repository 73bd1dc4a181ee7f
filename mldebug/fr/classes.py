"""The fault class a flight-recorder analysis names (the fault matrix's vocabulary,
docs/faults.md): the ``class`` of `fr analyze`'s JSON verdict (mldebug.cli.envelope)."""

from __future__ import annotations

import json
from typing import Any


def class_of(doc: dict[str, Any]) -> str:
    """dead (the ranks without a dump ended while the others waited), outside (a rank never
    enqueued the collective, or lags behind), desync (the ranks' collectives differ), else
    healthy. ``doc``: the analysis' ``to_dict()``."""
    mismatches = doc.get("mismatches") or []
    kinds = {m.get("kind") for m in mismatches if isinstance(m, dict)}
    said = json.dumps(mismatches)
    if "did not hang" in said or "died rather than hang" in said:
        return "dead"
    if doc.get("never_enqueued") and kinds <= {"missing"}:
        return "outside"
    if kinds:
        return "desync"
    if doc.get("lagging"):
        return "outside"
    return "healthy"
