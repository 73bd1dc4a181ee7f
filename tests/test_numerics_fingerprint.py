"""The sentinel's per-step collective fingerprint.

- pure: the hash over entries, the comparison of the ranks' sequences, the report's reading of
  hostile "collectives" records;
- the wrappers in one process (a world-1 gloo group): what a step's collectives record, a
  nested call counted once, nothing recorded outside a step, uninstall restores torch's
  functions;
- real 4-rank torchrun gloo DDP jobs (recipes/numerics_faults.py): rank 2 all-reduces its loss
  metric with MAX where the others use SUM at step 3 - gloo completes that silently with
  wrong values on every rank (checked here) - and every rank raises CollectivesDiffer naming
  collective #1 of step 3 and rank 2; a healthy run finishes with no finding; a NaN born in
  backward is still named with the fingerprint on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from envelope_check import check_envelope

from mldebug.numerics import collectives, records

REPO = Path(__file__).resolve().parent.parent


# ---- pure -----------------------------------------------------------------------------------

def E(op: str = "all_reduce", red: str = "SUM", shape: list[int] | None = None) -> list[Any]:
    return [op, red, "world", shape if shape is not None else [8], "float32"]


def test_the_hash_depends_on_every_field_and_on_the_order() -> None:
    def h(seq: list[list[Any]]) -> int:
        v = 0
        for e in seq:
            v = collectives.fold(v, e)
        return v

    base = h([E(), E("all_gather_single", "", [4])])
    assert base == h([E(), E("all_gather_single", "", [4])])  # deterministic (no hash())
    for other in ([E(red="MAX"), E("all_gather_single", "", [4])],
                  [E(shape=[7]), E("all_gather_single", "", [4])],
                  [E("all_gather_single", "", [4]), E()],
                  [["all_reduce", "SUM", "world", [8], "bfloat16"], E("all_gather_single", "",
                                                                        [4])],
                  [["all_reduce", "SUM", "g2", [8], "float32"], E("all_gather_single", "",
                                                                  [4])]):
        assert h(other) != base
    assert 0 <= base < 1 << 61


def test_compare_names_the_first_differing_collective_and_the_minority() -> None:
    same = [E(), E("broadcast", "", [3])]
    res = collectives.compare({0: same, 1: same, 2: [E(), E("broadcast", "", [2])], 3: same})
    assert res["index"] == 1 and res["differing"] == [2]
    assert res["expected"] == E("broadcast", "", [3]) and res["expected_ranks"] == 3
    assert res["entries"] == {"2": E("broadcast", "", [2])}
    # a rank that made one collective fewer: its entry there is None ("nothing")
    res = collectives.compare({0: same, 1: same[:1]})
    assert res["index"] == 1 and res["entries"] == {"1": None}  # tie: the lowest rank's wins
    assert collectives.describe(None) == "nothing"
    # equal kept entries: the difference lies beyond them
    assert collectives.compare({0: same, 1: same})["index"] is None
    assert collectives.describe(E(red="MAX")) == "all_reduce(MAX, world, [8] float32)"


def write(d: Path, rank: int, rec: dict[str, Any]) -> None:
    d.mkdir(exist_ok=True, mode=0o700)
    records.append_record(records.record_path(d, "node1", rank), rec)


def coll(rank: int, **kw: Any) -> dict[str, Any]:
    return {"v": 1, "kind": "collectives", "rank": rank, "world_size": 2, "host": "node1",
            "step": 5, "micro_batch": 0, "index": 0, "expected": E(), "expected_ranks": 1,
            "differing": [1], "entries": {"1": E(red="MAX")}, "action": "raise", **kw}


def test_the_report_reads_collectives_records_and_refuses_bad_entries(tmp_path: Path) -> None:
    d = tmp_path / "rec"
    write(d, 0, coll(0))
    write(d, 1, coll(1))
    rep = records.analyze(records.load_records(d))
    assert rep.verdict.startswith("collective mismatch at step 5: collective #1 since the "
                                  "previous check is all_reduce(MAX, world, [8] float32) on "
                                  "rank(s) 1")
    assert rep.collectives is not None and rep.collectives["differing"] == [1]
    assert rep.findings[0].code == "numerics-collectives-differ"
    # hostile: entries of the wrong shape are dropped, not rendered; huge/negative ranks refused
    bad = tmp_path / "bad"
    write(bad, 0, coll(0, entries={"1": ["x" * 10_000, 1, 2, "deep", []], "2": [[[[]]]]},
                       expected={"a": 1}, differing=[-1, True, 1 << 40, 3], index="7"))
    rep = records.analyze(records.load_records(bad))
    c = rep.collectives
    assert c is not None
    assert c["entries"] == {"1": None, "2": None} and c["expected"] is None
    assert c["differing"] == [3] and c["index"] is None
    assert "rank(s) 3 made a different sequence" in rep.verdict


# ---- the wrappers, one process ----------------------------------------------------------------

def test_the_wrappers_record_a_steps_collectives_once_each(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from mldebug.numerics import fingerprint

    orig = dist.all_reduce
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        fingerprint.install()
        fingerprint.install()  # idempotent
        assert dist.all_reduce is not orig and dist.all_reduce.__mldebug_fingerprint__ is orig
        assert dist.distributed_c10d.all_reduce is dist.all_reduce
        sc = fingerprint.StepCollectives()
        dist.all_reduce(torch.ones(3))  # no step open: not recorded
        fingerprint.activate(sc)
        try:
            dist.all_reduce(torch.ones(2, 3), op=dist.ReduceOp.MAX)
            dist.all_reduce(torch.ones(4, dtype=torch.float64), dist.ReduceOp.SUM)
            out = torch.empty(4)
            dist.all_gather_into_tensor(out, torch.ones(4))
            objs: list[Any] = [None]
            dist.all_gather_object(objs, {"a": 1})  # its inner collectives count
            dist.barrier()
        finally:
            fingerprint.activate(None)
        assert sc.entries[:3] == [["all_reduce", "MAX", "world", [2, 3], "float32"],
                                  ["all_reduce", "SUM", "world", [4], "float64"],
                                  ["all_gather_into_tensor", "", "world", [4], "float32"]]
        assert sc.entries[-1] == ["barrier", "", "world", [], ""]
        n = sc.count
        assert n == len(sc.entries) >= 5
        before = sc.value()
        sub = dist.new_group([0])
        fingerprint.activate(sc)
        dist.all_reduce(torch.ones(1), group=sub)
        fingerprint.activate(None)
        assert sc.entries[-1] == ["all_reduce", "SUM", "g1", [1], "float32"]
        assert sc.value() != before
    finally:
        fingerprint.uninstall()
        dist.destroy_process_group()
    assert dist.all_reduce is orig and dist.distributed_c10d.all_reduce is orig


# ---- real torchrun jobs ------------------------------------------------------------------------

def torchrun(tmp: Path, *args: str, n: int = 4) -> tuple[str, Path]:
    from jobs import kill_tree

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    rec = tmp / "rec"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(n), str(REPO / "recipes" / "numerics_faults.py"), "--dir", str(rec), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp,
        stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        pytest.fail("the job did not end within 240 s (a rank hangs)")
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text, rec


def report(d: Path) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "mldebug", "numerics", "report", str(d), "--json"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def results(out: str) -> dict[int, str]:
    return {int(r): s.strip() for r, s in re.findall(r"^RESULT rank=(\d+) (.*)$", out, re.M)}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gloo_completes_a_max_vs_sum_all_reduce_silently_with_wrong_values(
        tmp_path: Path) -> None:
    """Why the fingerprint exists: no error, no hang, and a value no rank asked for."""
    pytest.importorskip("torch")
    prog = tmp_path / "mix.py"
    prog.write_text(
        "import datetime, os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=30))\n"
        "r = dist.get_rank()\n"
        "t = torch.full((8,), float(r + 1))\n"
        "dist.all_reduce(t, op=dist.ReduceOp.MAX if r == 2 else dist.ReduceOp.SUM)\n"
        "os.write(1, f'GOT rank={r} {t.tolist()}\\n'.encode())\n"
        "dist.barrier(); dist.destroy_process_group(); os._exit(0)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "4", str(prog)], capture_output=True, text=True,
                       env=env, timeout=240, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    got = {int(r): v for r, v in re.findall(r"^GOT rank=(\d) (.*)$", p.stdout, re.M)}
    assert len(got) == 4
    # SUM would be 10 everywhere, MAX 4: gloo gives neither on some rank, and says nothing
    assert any(v != str([10.0] * 8) for v in got.values())
    assert "error" not in p.stderr.lower()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_max_vs_sum_mismatch_on_rank_2_is_named_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out, rec = torchrun(tmp_path, "--fault", "mismatch", "--rank", "2", "--step", "3")
    res = results(out)
    assert res == {r: "step=3 action=raise kind=collectives" for r in range(4)}, out[-3000:]
    assert "collective #1 since the previous check is all_reduce(SUM, world, [] float32) on " \
           "3 rank(s) but all_reduce(MAX, world, [] float32) on rank(s) 2" in out
    doc = report(rec)
    v = check_envelope(doc, "numerics.report")
    assert (v["kind"], v["culprits"], v["class"]) == ("culprits", [2], "desync")
    c = doc["collectives"]
    assert (c["step"], c["index"], c["differing"]) == (3, 0, [2])
    assert c["entries"] == {"2": ["all_reduce", "MAX", "world", [], "float32"]}
    assert c["ranks_recorded"] == [0, 1, 2, 3]
    # every rank's own sequence checked at that step: the metric alone (DDP's one bucket
    # carried the check, the sentinel's own traffic is not counted)
    mine = [json.loads(ln) for ln in next(rec.glob("*rank0.jsonl")).read_text().splitlines()]
    assert mine[0]["mine"] == [["all_reduce", "SUM", "world", [], "float32"]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_healthy_job_finishes_with_no_finding_and_a_backward_nan_is_still_named(
        tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "a").mkdir()
    out, rec = torchrun(tmp_path / "a", "--fault", "none")
    assert results(out) == {r: "FINISHED" for r in range(4)}, out[-3000:]
    doc = report(rec)
    assert doc["verdict"]["kind"] == "ok" and doc["collectives"] is None
    assert not [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    (tmp_path / "b").mkdir()
    out, rec = torchrun(tmp_path / "b", "--fault", "backward", "--rank", "1", "--step", "2")
    assert results(out) == {r: "step=2 action=raise kind=nonfinite" for r in range(4)}
    doc = report(rec)
    assert doc["collectives"] is None
    assert {k: doc["first"][k] for k in ("rank", "step", "module", "phase", "reproducible")} == \
        {"rank": 1, "step": 2, "module": "layers.3.gate", "phase": "backward",
         "reproducible": True}
