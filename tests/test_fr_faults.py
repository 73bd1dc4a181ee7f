"""fr analyze on real dumps from the fault matrix (benchmarks/faults/job.py, torch 2.13 gloo,
4 ranks; tests/fixtures/fr/faults/README.md names each case and its injected culprit)."""

from __future__ import annotations

from pathlib import Path

from mldebug.fr.analyze import analyze
from mldebug.fr.loader import load

FIX = Path(__file__).parent / "fixtures" / "fr" / "faults"


def run(case: str):
    return analyze(load([FIX / case]))


def verdict_class(a) -> str:
    """The class the matrix's fr route reads from --json (benchmarks/faults/runner.route_fr)."""
    kinds = {m.kind for m in a.mismatches}
    if a.never_enqueued and kinds <= {"missing"}:
        return "outside"
    if kinds:
        return "desync"
    return "outside" if a.lagging else "healthy"


def test_subgroup_skip_names_the_rank_that_skipped_its_pair_collective():
    # rank 3 skipped group 2's all_reduce #4 and waits in the world's #4; its partner rank 2
    # waits alone in group 2's #4 and so never reaches the world's #4
    a = run("subgroup_skip")
    assert a.culprits == [3]
    assert verdict_class(a) == "desync"
    world = next(m for m in a.mismatches if m.pg == "0")
    pair = next(m for m in a.mismatches if m.pg == "2")
    assert world.kind == "missing" and world.culprit_ranks == [] and world.blocked_elsewhere == [2]
    assert "wait in group 2 #4" in world.reasoning
    assert pair.kind == "skipped" and pair.culprit_ranks == [3]
    assert "went on into group 0 #4" in pair.reasoning
    assert a.never_enqueued == []
    d = a.to_dict()
    assert d["mismatches"][0]["blocked_elsewhere"] == [2]
    assert any(f.code == "fr-skipped" for f in a.findings)


def test_a_rank_stuck_outside_any_collective_stays_missing():
    # thread_lock: rank 2 waits for a lock another of its threads holds; the others wait in #10
    a = run("thread_lock")
    assert a.culprits == [2] and a.never_enqueued == [2]
    assert verdict_class(a) == "outside"
    (m,) = a.mismatches
    assert m.kind == "missing" and m.blocked_elsewhere == []
