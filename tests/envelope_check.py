"""The JSON envelope every command's --json follows (docs/json.md, mldebug.cli.envelope): one
checker, called on real output by tests/test_json_envelope.py and by the tests that already
run the slow commands (make-tiny, dist-test, numerics report, trace show...)."""

from __future__ import annotations

import re
from typing import Any

from mldebug.cli.envelope import CONFIDENCE, VERDICT_KEYS, schema_of

FINDING_KEYS = {"severity", "title", "detail", "fix", "code", "hosts"}


def _resolve(doc: dict[str, Any], path: str) -> bool:
    """Whether a deprecated field path ('verdict.title', 'culprit_ranks') is in ``doc``."""
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False
        cur = cur[part]
    return True


def check_envelope(doc: Any, key: str, *, decides: bool | None = None) -> dict[str, Any]:
    """Assert ``doc`` is an envelope of command key ``key`` ("fr.analyze", "log"); returns
    its verdict (or {}). ``decides``: whether a verdict must (True) or must not (False) be
    there; None: the command's own rule (mldebug.cli.envelope.DECIDERS)."""
    from mldebug.cli.envelope import DECIDERS

    assert isinstance(doc, dict), type(doc)
    command, _, sub = key.partition(".")
    assert doc["schema"] == schema_of(command, sub or None), (doc["schema"], key)
    assert re.fullmatch(r"mldebug\.[a-z-]+(\.[a-z]+)?/[1-9][0-9]*", doc["schema"])
    keys = list(doc)
    head = ["schema", "verdict", "findings"] if "verdict" in doc else ["schema", "findings"]
    assert keys[:len(head)] == head, keys[:6]
    assert isinstance(doc["findings"], list)
    for f in doc["findings"]:
        assert FINDING_KEYS <= set(f), f
        assert f["severity"] in ("error", "warning", "hint", "info") and f["title"]
    if decides is None:
        decides = key in DECIDERS and not (key.startswith("fr.") and "culprit_ranks" not in doc
                                           and "analysis" not in doc)
    assert ("verdict" in doc) == decides, (key, doc.get("verdict"))
    for old, new in (doc.get("deprecated") or {}).items():
        assert _resolve(doc, old), f"deprecated {old!r} is not in the document"
        assert isinstance(new, str) and new
    if not decides:
        return {}
    v = doc["verdict"]
    assert set(VERDICT_KEYS) <= set(v), v
    assert isinstance(v["kind"], str) and v["kind"]
    assert isinstance(v["summary"], str) and v["summary"]
    assert isinstance(v["culprits"], list) and all(isinstance(r, int) for r in v["culprits"])
    assert v["culprits"] == sorted(set(v["culprits"]))
    assert v["class"] is None or isinstance(v["class"], str)
    assert v["confidence"] is None or v["confidence"] in CONFIDENCE
    assert isinstance(v["code"], str)
    return v
