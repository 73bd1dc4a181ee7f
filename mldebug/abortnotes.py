"""Read the notes ``watchdog(on_stall="dump+abort")``'s evidence barrier leaves in
``DIR/abort/*.exit`` (written by ``mldebug.capture.evidence``): which ranks had no dump when a
rank aborted, and why. Shared by ``hang analyze`` and ``trace show``; read bounded, malformed
notes skipped (the directory may be writable by others)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mldebug.privdir import read_bounded
from mldebug.text import sanitize

NOTE_FORMAT = "mldebug.capture.abort/1"
MAX_NOTES = 4096
MAX_NOTE = 1 << 20


def missing_notes(root: Path) -> list[tuple[int | None, int, str]]:
    """(rank, pid, why) for each rank dump+abort's exit notes under ``root/abort`` name as
    having no dump, once each."""
    d = root / "abort"
    if not d.is_dir():
        return []
    seen: dict[tuple[Any, int], str] = {}
    for f in sorted(d.glob("*.exit"))[:MAX_NOTES]:
        try:
            doc = json.loads(read_bounded(f, MAX_NOTE))
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(doc, dict) or doc.get("format") != NOTE_FORMAT:
            continue
        missing = doc.get("missing")
        for m in missing if isinstance(missing, list) else ():
            if (isinstance(m, dict) and isinstance(m.get("pid"), int)
                    and (m.get("rank") is None or isinstance(m.get("rank"), int))):
                seen.setdefault((m.get("rank"), m["pid"]),
                                sanitize(f"{str(m.get('why'))[:200]} (rank "
                                         f"{str(doc.get('rank'))[:20]} waited "
                                         f"{str(doc.get('waited_s'))[:20]}s for it before its "
                                         "own abort)"))
    return [(r, pid, why) for (r, pid), why in seen.items()]

