"""A validator written from the documented fields of the Trace Event Format (Chrome's
"Trace Event Format" document, the JSON Object Format that chrome://tracing and Perfetto
read; mirrored at https://wix-incubator.github.io/trace-event-lib/ per event type):

- the object holds ``traceEvents`` (a list); ``displayTimeUnit`` is "ms" or "ns";
  ``otherData`` is an object;
- every event has ``name`` (string), ``ph`` (one character), ``pid`` and ``tid`` (numbers or
  strings); every event but metadata has ``ts`` (microseconds, a number);
- "X" (complete) events have ``dur`` (a number >= 0);
- "M" (metadata) events are one of process_name / process_labels / process_sort_index /
  thread_name / thread_sort_index with the documented ``args`` key (``name``, ``labels``,
  ``sort_index``);
- flow events "s" / "t" / "f" have ``id`` and ``cat`` and ``name`` (the three identify a
  flow), start with one "s" and end with one "f"; a flow event binds to the slice that
  encloses its ``ts`` on the same pid/tid ("bp": "e" on steps and ends), so that slice must
  exist; ``bp`` when present is "e".
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

PHASES = set("BEXIiCbnestfPOND(M)") - {"(", ")"}
META_ARG = {"process_name": "name", "process_labels": "labels",
            "process_sort_index": "sort_index", "thread_name": "name",
            "thread_sort_index": "sort_index"}


def validate(doc: Any) -> None:
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), "traceEvents"
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    assert isinstance(doc.get("otherData", {}), dict)
    slices: dict[tuple[Any, Any], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[tuple[str, str, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        assert isinstance(e, dict), e
        assert isinstance(e.get("name"), str), e
        ph = e.get("ph")
        assert isinstance(ph, str) and len(ph) == 1 and ph in PHASES, e
        for k in ("pid", "tid"):
            assert isinstance(e.get(k), (int, str)) and not isinstance(e.get(k), bool), e
        if ph == "M":
            assert e["name"] in META_ARG and META_ARG[e["name"]] in e.get("args", {}), e
            continue
        assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
        if "args" in e:
            assert isinstance(e["args"], dict), e
        if ph == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        if ph in "stf":
            assert "id" in e and isinstance(e.get("cat"), str), e
            assert e.get("bp", "e") == "e", e
            flows[(e["cat"], e["name"], e["id"])].append(e)
    for key, evs in flows.items():
        phs = [e["ph"] for e in sorted(evs, key=lambda e: e["ts"])]
        assert phs.count("s") == 1 and phs.count("f") == 1 and phs[0] == "s", (key, phs)
        for e in evs:
            assert any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])]), \
                f"flow event without an enclosing slice: {e}"
