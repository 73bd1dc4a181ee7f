"""NanSentinel in a real 4-rank torchrun gloo DDP job (recipes/nan_sentinel.py): one launch
runs every case in turn; each test reads that job's output and its records.

- a NaN born in backward on rank 2 at step 3: rank, step, module, "backward", reproducible;
- an inf born in forward on rank 3 at step 4: "forward";
- a value corrupted once by a hook on rank 1 (exponent bits set): reproducible false;
- a replica whose weights were altered (rank 1, after step 2): named by the replica check;
- action="skip": every rank skips the same optimizer step and carries on, replicas equal;
- gradient accumulation (no_sync): the micro-batch where the NaN was born is named;
- every case ends on every rank with the same action, and the job ends (60 s process-group
  timeout, 420 s for the job): no rank hangs.
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
from jobs import kill_tree

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the one job: ~60-110 s loaded

REPO = Path(__file__).resolve().parent.parent
WORLD = 4
MODES = ("backward", "forward", "bitflip", "replica", "skip", "accum")


def run_job(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float
            ) -> subprocess.CompletedProcess[str]:
    """Run torchrun; past ``timeout`` kill it with every rank (they run in their own sessions)
    and fail: a rank that hangs is a failure, never a leak."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        pytest.fail(f"the job did not end within {timeout} s (a rank hangs):\n"
                    + out.decode(errors="replace")[-2000:] + err.decode(errors="replace")[-2000:])
    return subprocess.CompletedProcess(cmd, proc.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    tmp = tmp_path_factory.mktemp("sentinel")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", MLDEBUG_PRINT_LOCK=str(tmp / "print.lock"))
    proc = run_job(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(WORLD), str(REPO / "recipes" / "nan_sentinel.py"), "--dir", str(tmp / "rec"),
         "--modes", ",".join(MODES)], env, tmp, 420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr, tmp / "rec"


def results(out: str, mode: str) -> dict[int, str]:
    return {int(r): rest.strip() for r, rest in
            re.findall(rf"^RESULT mode={mode} rank=(\d+) (.*)$", out, re.M)}


def report(d: Path) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "mldebug", "numerics", "report", str(d), "--json"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def first(rep: dict[str, Any]) -> dict[str, Any]:
    return {k: rep["first"][k] for k in ("rank", "step", "module", "phase", "reproducible")}


def same_action(out: str, mode: str, expected: str) -> None:
    got = results(out, mode)
    assert got == dict.fromkeys(range(WORLD), expected), (mode, got)


def test_nan_born_in_backward_on_one_rank(job: tuple[str, Path]) -> None:
    out, rec = job
    same_action(out, "backward", "step=3 action=raise")
    rep = report(rec / "backward")
    assert first(rep) == {"rank": 2, "step": 3, "module": "layers.3.gate", "phase": "backward",
                          "reproducible": True}
    assert rep["verdict"]["summary"].startswith("first non-finite: rank 2 (")
    assert "backward of layers.3.gate (Gate)" in rep["verdict"]["summary"]
    assert "reproducible on replay, so data or model, not hardware" in rep["verdict"]["summary"]
    assert rep["verdict"]["culprits"] == [2] and rep["verdict_text"] == rep["verdict"]["summary"]
    assert rep["ranks"] == [0, 1, 2, 3] and rep["trips"] == 1
    assert [f["code"] for f in rep["findings"]] == ["numerics-nonfinite-reproducible"]


def test_inf_born_in_forward_on_another_rank(job: tuple[str, Path]) -> None:
    out, rec = job
    same_action(out, "forward", "step=4 action=raise")
    rep = report(rec / "forward")
    assert first(rep) == {"rank": 3, "step": 4, "module": "layers.1.act", "phase": "forward",
                          "reproducible": True}
    assert rep["first"]["tensor"] == "output" and rep["first"]["inputs_finite"] is True


def test_a_value_corrupted_once_is_not_reproducible(job: tuple[str, Path]) -> None:
    out, rec = job
    same_action(out, "bitflip", "step=2 action=raise")
    rep = report(rec / "bitflip")
    f = first(rep)
    assert (f["rank"], f["step"], f["reproducible"], f["phase"]) == (1, 2, False, None)
    assert "silent data corruption" in rep["verdict"]["summary"]
    assert [x["code"] for x in rep["findings"]] == ["numerics-nonfinite-not-reproducible"]


def test_a_replica_with_altered_weights_is_named(job: tuple[str, Path]) -> None:
    out, rec = job
    same_action(out, "replica", "step=2 action=raise-replica")
    rep = report(rec / "replica")
    assert rep["first"] is None
    assert rep["replica"]["rank"] == 1 and rep["replica"]["step"] == 2
    assert rep["replica"]["differing"] == [1]
    assert rep["replica"]["param"] == "layers.0.fc.weight"
    assert "numerics-replica-diverged" in [x["code"] for x in rep["findings"]]


def test_skip_skips_the_same_step_everywhere_and_training_goes_on(job: tuple[str, Path]) -> None:
    out, rec = job
    same_action(out, "skip", "FINISHED steps=6 skipped=1 differing=[]")
    rep = report(rec / "skip")
    assert first(rep) == {"rank": 0, "step": 1, "module": "layers.3.gate", "phase": "backward",
                          "reproducible": True}
    lines = [json.loads(ln) for f in (rec / "skip").glob("*.jsonl")
             for ln in f.read_text().splitlines()]
    assert sorted((r["rank"], r["action"]) for r in lines) == [(r, "skip") for r in range(WORLD)]


def test_gradient_accumulation_names_the_micro_batch(job: tuple[str, Path]) -> None:
    out, rec = job
    same_action(out, "accum", "step=2 action=raise")
    rep = report(rec / "accum")
    assert first(rep)["rank"] == 3 and rep["first"]["micro_batch"] == 0
    assert rep["first"]["phase"] == "backward"


def test_records_are_private_and_every_rank_wrote_one(job: tuple[str, Path]) -> None:
    _, rec = job
    for mode in MODES:
        d = rec / mode
        assert d.stat().st_mode & 0o777 == 0o700
        files = sorted(d.glob("*.jsonl"))
        assert len(files) == WORLD, (mode, files)
        assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)


def test_the_overhead_benchmark_runs_end_to_end() -> None:
    """benchmarks/bench_sentinel.py (one short round, both workloads, 2 ranks): the figures in
    docs/benchmarks.md come from it, so it must not rot. No timing is asserted."""
    pytest.importorskip("transformers")
    proc = run_job(
        [sys.executable, str(REPO / "benchmarks" / "bench_sentinel.py"), "--rounds", "1",
         "--steps", "1"], dict(os.environ, PYTHONPATH=str(REPO)), REPO, 420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in ("mlp", "llama"):
        assert re.search(rf"^{name} +params=[\d,]+ device=cpu world=2", proc.stdout, re.M), \
            proc.stdout
    assert len(re.findall(r"ratio on/off: median \d+\.\d+x", proc.stdout)) == 2, proc.stdout
    assert len(re.findall(r"replica hash: local +\d+\.\d us/call", proc.stdout)) == 2
