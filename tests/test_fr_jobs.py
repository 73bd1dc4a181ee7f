"""Real gloo jobs under torchrun: dumps by `mldebug fr trigger` while hung, and on failure.

The three recipes run at the same time (one module fixture) to keep the wall time near one
collective timeout: (a) rank 0 issues an extra all_reduce, (b) one rank all_reduces another
size, (c) one rank skips a collective and the others time out. Each is triggered through the
real CLI while hung, then left to time out so every rank's on-failure dump (uncaught
RuntimeError, or SIGTERM from torchrun) can be analysed too. torchfrtrace runs on the same
dumps for the side-by-side checks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import REPO
from jobs import kill_tree

from mldebug.fr.analyze import analyze
from mldebug.fr.collect import trigger_local
from mldebug.fr.loader import load
from mldebug.safeload import safe_loads

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

TIMEOUT_S = 20  # the recipes' collective timeout (the triggers take a few seconds)


@dataclass
class Job:
    name: str
    recipe: str
    nproc: int
    dir: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    trigger: dict = field(default_factory=dict)
    trigger_rc: int = -1


def _start(job: Job) -> None:
    env = dict(os.environ)
    env.update(MLDEBUG_FR="1", MLDEBUG_FR_DIR=str(job.dir), MLDEBUG_FR_RAW="1",
               PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    with open(job.log, "wb") as log:
        job.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc_per_node={job.nproc}", str(REPO / "recipes" / job.recipe),
             "--timeout", str(TIMEOUT_S)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=env,
            start_new_session=True)


def _ready(job: Job) -> bool:
    return job.log.read_text(errors="replace").count(" ready") >= job.nproc


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("frjobs")
    specs = [("extra", "collective_mismatch.py", 3), ("size", "fr_size_mismatch.py", 3),
             ("skip", "fr_skipped_collective.py", 3)]
    all_jobs = {n: Job(n, r, p, base / n / "d", base / f"{n}.log") for n, r, p in specs}
    for job in all_jobs.values():
        job.dir.parent.mkdir(parents=True)
        _start(job)
    try:
        deadline = time.monotonic() + 90
        for job in all_jobs.values():
            while not _ready(job):
                assert job.proc is not None
                if job.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{job.name} job did not start:\n{job.log.read_text()[-3000:]}")
                time.sleep(0.3)
        time.sleep(1.5)  # let every rank enter the collective it hangs in
        env = dict(os.environ, PYTHONPATH=str(REPO))
        triggers = {n: subprocess.Popen(
            [sys.executable, "-m", "mldebug", "fr", "trigger", "--dir", str(job.dir), "--out",
             str(job.dir.parent / "trig"), "--timeout", "20", "--analyze", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
            for n, job in all_jobs.items() if n != "skip"}  # at once: jobs time out soon
        # the skip job through the Python API `mldebug hang` uses
        skip = all_jobs["skip"]
        files = trigger_local(skip.dir.parent / "trig", timeout=20, dump_dir=skip.dir)
        skip.trigger_rc = 0 if files else 1
        skip.trigger = {"nodes": [{"files": [str(f) for f in files], "errors": []}],
                        "analysis": analyze(load(files)).to_dict()}
        for n, t in triggers.items():
            stdout, stderr = t.communicate(timeout=90)
            all_jobs[n].trigger_rc = t.returncode
            all_jobs[n].trigger = json.loads(stdout) if stdout.strip() else {"stderr": stderr}
        for job in all_jobs.values():
            assert job.proc is not None
            job.proc.wait(timeout=TIMEOUT_S * 3 + 60)
        yield all_jobs
    finally:
        for job in all_jobs.values():
            if job.proc is not None:
                kill_tree(job.proc)  # its ranks too, if any is left


def _mismatch(doc: dict) -> dict:
    assert doc["mismatches"], doc
    return doc["mismatches"][0]


RECIPE_LINE = {
    "extra": ("collective_mismatch.py", "dist.all_reduce(t)  # extra"),
    "size": ("fr_size_mismatch.py", "dist.all_reduce(t)"),
    "skip": ("fr_skipped_collective.py", "dist.all_reduce(t)"),
}


def _line_of(recipe: str, text: str) -> int:
    lines = (REPO / "recipes" / recipe).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(text))


@pytest.mark.parametrize("name,kind,seq,culprit", [
    ("extra", "type", 2, [0]), ("size", "size", 2, [2]), ("skip", "missing", 2, [2])])
def test_trigger_while_hung_names_the_culprit(jobs, name, kind, seq, culprit):
    job = jobs[name]
    assert job.trigger_rc == 0, job.trigger
    (node,) = job.trigger["nodes"]
    assert len(node["files"]) == job.nproc and not node["errors"], node
    m = _mismatch(job.trigger["analysis"])
    assert (m["kind"], m["seq"], m["culprit_ranks"], m["pg"]) == (kind, seq, culprit, "0"), m
    recipe, text = RECIPE_LINE[name]
    site = f"{recipe}:{_line_of(recipe, text)}"
    culprit_side = [c for c in m["call_sites"] if set(c["ranks"]) & set(culprit)]
    sites = culprit_side or m["call_sites"]  # 'missing': the waiting ranks' call
    assert any(site in c["frames"][0] for c in sites), (site, m["call_sites"])
    for f in node["files"]:
        assert safe_loads(Path(f).read_bytes())["mldebug"]["reason"] == "triggered"


@pytest.mark.parametrize("name,culprit", [("extra", [0]), ("size", [2]), ("skip", [2])])
def test_on_failure_dumps_exist_on_every_rank_and_agree(jobs, name, culprit):
    job = jobs[name]
    files = sorted(job.dir.glob("fr_rank*"))
    log = job.log.read_text(errors="replace")
    assert [f.name for f in files] == [f"fr_rank{r}" for r in range(job.nproc)], log[-3000:]
    reasons = {safe_loads(f.read_bytes())["mldebug"]["reason"].split(":")[0] for f in files}
    assert reasons <= {"uncaught RuntimeError", "uncaught DistBackendError", "SIGTERM"}, reasons
    a = analyze(load([job.dir]))
    assert a.culprits == culprit, a.to_dict()
    # the survivors alone (the culprit's dump removed) still point at it
    if name == "skip":
        alone = job.dir.parent / "survivors"
        alone.mkdir(exist_ok=True)
        for f in files:
            if f.name != "fr_rank2":
                shutil.copy(f, alone / f.name)
        b = analyze(load([alone]))
        assert b.missing_ranks == [2] and b.culprits == [2]


def _torchfrtrace(dumps: list[Path], tmp: Path) -> subprocess.CompletedProcess[str]:
    tmp.mkdir()
    for f in dumps:
        shutil.copy(f, tmp / f.name)
    return subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                           str(tmp), "-p", "fr_rank"], capture_output=True, text=True, timeout=120)


def _first_rank(directory: Path) -> int:
    """torchfrtrace compares everything against the first file os.walk lists."""
    first = next(iter(os.walk(directory)))[2][0]
    return int(re.search(r"(\d+)$", first).group(1))  # type: ignore[union-attr]


def _their_culprits(out: str) -> list[int]:
    return sorted({int(x) for x in re.findall(r"Culprit rank (\d+)", out)})


def test_side_by_side_with_torchfrtrace(jobs, tmp_path):
    """Where torchfrtrace runs (our dumps carry pg_config), compare culprits; on torch's raw
    gloo dumps it stops with a KeyError and ours still answers.

    torchfrtrace assumes the first rank it reads is right: when that rank is the culprit it
    names every other rank instead; ours takes the minority by vote.
    """
    for name, culprit in (("size", 2), ("extra", 0)):
        files = sorted(jobs[name].dir.glob("fr_rank*"))
        r = _torchfrtrace(files, tmp_path / name)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-2000:]
        ours = analyze(load([jobs[name].dir])).culprits
        assert ours == [culprit]
        first = _first_rank(tmp_path / name)
        expected = [culprit] if first != culprit else sorted(set(range(3)) - {culprit})
        assert _their_culprits(out) == expected, (first, out[-2000:])

    skip = _torchfrtrace(sorted(jobs["skip"].dir.glob("fr_rank*")), tmp_path / "skip")
    out = skip.stdout + skip.stderr
    missing = re.search(r"missing ranks: \{([\d, ]+)\}", out)
    assert missing, out[-2000:]
    assert [int(x) for x in missing.group(1).split(",")] == analyze(load([jobs["skip"].dir])).culprits

    for name, culprit in (("extra", [0]), ("size", [2]), ("skip", [2])):
        raw = sorted((jobs[name].dir / "raw").glob("fr_rank*"))
        assert len(raw) == 3
        assert "rank" not in safe_loads(raw[0].read_bytes())
        r = _torchfrtrace(raw, tmp_path / f"raw-{name}")
        assert r.returncode != 0 and "KeyError" in r.stderr, r.stderr[-1000:]
        assert analyze(load(raw)).culprits == culprit
