"""#42 item 2: what torchrun's "Root Cause (first observed failure)" is beside the verdict.

torchrun names the first rank to *exit*; `mldebug why` says whether it agrees, is a
consequence (a watchdog's SIGABRT, the agent's SIGTERM, a rank whose own lines only react to
a peer) with the real failure kept first in the chain, or is contradicted by the evidence.
Real logs: the fault matrix's torchrun jobs (tests/fixtures/log/faults, culprits in
benchmarks/faults/catalogue.py), our recipe's stuck rank, and a public thread's watchdog
aborts (tests/fixtures/why/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envelope_check import check_envelope

from mldebug.cli import main
from mldebug.log.analyze import analyze
from mldebug.log.collect import load
from mldebug.log.rootcause import RootCause, meaning, root_cause
from mldebug.why.join import join
from mldebug.why.model import DIRECT, HEALTHY, Evidence, LauncherClaim, Source

FIX = Path(__file__).parent / "fixtures"
FAULTS = FIX / "log" / "faults"
PICOTRON = FIX / "why" / "rootcause" / "picotron-6-watchdog-abort.log"


def why_json(capsys: pytest.CaptureFixture[str], *paths: Path) -> dict:
    rc = main(["why", *map(str, paths), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    check_envelope(doc, "why")
    return doc


def parsed(path: Path):
    return analyze(load([str(path)])).parsed


def test_the_root_cause_entry_is_read_with_its_signal():
    rc = root_cause(parsed(FAULTS / "sigkill.log"))
    assert rc is not None
    assert (rc.launcher, rc.rank, rc.exitcode, rc.signal) == ("torchrun", 3, -9, "SIGKILL")
    assert rc.said() == "torchrun's Root Cause names rank 3 (exit code -9, SIGKILL)"
    assert root_cause(parsed(FAULTS / "scheduler-sigterm.log")) is None  # no table printed


# (fault log, the injected culprit, what torchrun's Root Cause is beside it)
CASES = [
    ("skip-collective.log", [3], "consequence"),  # rank 1: its own lines only time out
    ("thread-lock.log", [2], "consequence"),
    ("exit0.log", [1], "consequence"),  # rank 0: "Connection closed by peer"
    ("shape-mismatch.log", [1], "consequence"),  # rank 0 -6: gloo's abort
    ("sigkill.log", [3], "agrees"),
    ("sigsegv.log", [2], "agrees"),
    ("dataloader-crash.log", [3], "agrees"),
]


@pytest.mark.parametrize("name,culprits,status", CASES)
def test_the_root_cause_is_named_for_what_it_is(capsys, name, culprits, status):
    doc = why_json(capsys, FAULTS / name)
    assert doc["verdict"]["culprits"] == culprits
    said = doc["launcher"]
    assert said["status"] == status, said
    texts = [c["text"] for c in doc["chain"]]
    assert said["text"] in texts[-1] or any(said["text"] in t for t in texts)
    if status == "consequence":
        # the real failure stays first; the launcher's claim comes after it and names it
        assert "Root Cause" not in texts[0]
        assert f"the real failure is rank {culprits[0]}'s" in said["text"]
        assert said["rank"] not in culprits


def test_our_stuck_rank_recipe_the_root_cause_names_a_waiter(capsys):
    # README: rank 3 sleeps outside any collective; torchrun's "Root Cause" names rank 0
    doc = why_json(capsys, FIX / "log" / "torch213-gloo-rank-stuck.log")
    assert doc["verdict"]["culprits"] == [3]
    assert (doc["launcher"]["rank"], doc["launcher"]["status"]) == (0, "consequence")
    assert "Timed out waiting" in doc["launcher"]["meaning"]


def test_the_text_report_shows_the_correction_after_the_real_failure(capsys):
    assert main(["why", str(FAULTS / "thread-lock.log")]) == 0
    out = capsys.readouterr().out.splitlines()
    first = next(i for i, s in enumerate(out) if s.startswith("  1. "))
    said = next(i for i, s in enumerate(out) if "torchrun's Root Cause names rank 0" in s)
    assert said > first and "a consequence, not the cause" in out[said]
    assert "rank 2 never reached the collective" in out[first]


def test_watchdog_sigabrts_are_not_crashes_public_thread(capsys):
    # picotron_tutorial#6: every table entry is SIGABRT after NCCL watchdog timeouts
    assert main(["log", str(PICOTRON), "--json"]) == 0
    log_doc = json.loads(capsys.readouterr().out)
    assert log_doc["verdict"]["code"] != "log-crash"
    doc = why_json(capsys, PICOTRON)
    assert doc["launcher"]["signal"] == "SIGABRT" and doc["launcher"]["rank"] == 0
    assert "watchdog" in doc["launcher"]["meaning"]
    assert "crashed" not in doc["verdict"]["summary"]


def _torch2x_watchdog_log(tmp_path: Path, world: int, root: int) -> Path:
    """The same class written as newer torch prints it: every rank's `[rankN]:` watchdog
    timeout in one ALLREDUCE, then torchrun's table with every rank SIGABRT."""
    lines = []
    for r in range(world):
        lines.append(f"[rank{r}]:[E1203 10:00:0{r}.1 ProcessGroupNCCL.cpp:616] [Rank {r}] "
                     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, "
                     "OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran "
                     "for 600031 milliseconds before timing out.")
        lines.append(f"[rank{r}]:[E1203 10:00:0{r}.2 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG "
                     f"GUID 0(default_pg) Rank {r}] Exception (either an error or timeout) "
                     "detected by watchdog at work: 42, last enqueued NCCL work: 42, last "
                     "completed NCCL work: 41.")
    lines += ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
              "=" * 60, "train.py FAILED", "-" * 60, "Failures:"]

    def entry(r: int) -> list[str]:
        return [f"[{r}]:", "  time      : 2026-12-03_10:00:09", "  host      : gpu-node-17",
                f"  rank      : {r} (local_rank: {r % 8})", f"  exitcode  : -6 (pid: {900 + r})",
                "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {900 + r}"]

    for r in range(world):
        if r != root:
            lines += entry(r)
    lines += ["-" * 60, "Root Cause (first observed failure):", *entry(root), "=" * 60]
    p = tmp_path / "job.log"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("world,root", [(4, 0), (16, 11)])
def test_watchdog_aborts_written_differently_name_no_crash(capsys, tmp_path, world, root):
    doc = why_json(capsys, _torch2x_watchdog_log(tmp_path, world, root))
    v = doc["verdict"]
    assert v["culprits"] == [] and v["code"] != "log-crash"
    said = doc["launcher"]
    assert (said["rank"], said["signal"], said["status"]) == (root, "SIGABRT", "consequence")
    assert "the cause is not that rank's" in said["text"]


def _claim(rc: RootCause) -> LauncherClaim:
    what, consequence = meaning(rc)
    return LauncherClaim(rc.said(), rc.rank, what, consequence, rc.to_dict())


def _ev(reader: str, culprits: tuple[int, ...], basis: str, launcher=None) -> Evidence:
    return Evidence(Source(f"/j/{reader}", reader), (0, 1, 2, 3), culprits,
                    "healthy" if basis == HEALTHY else "exception", "fact", "high",
                    f"{reader}-code", basis, launcher=launcher)


def test_join_pure_sigterm_on_a_healthy_job_is_no_fault():
    rc = RootCause("torchrun", 2, -15, "SIGTERM", "h", None, "")
    v = join([_ev("log", (), HEALTHY, _claim(rc))])
    assert v.kind == "ok" and v.correction["status"] == "no-fault"
    assert v.culprits == []  # the launcher never votes


def test_join_pure_a_launcher_claim_against_stronger_evidence_is_contradicted():
    rc = RootCause("torchrun", 0, 1, None, "h", None, "ValueError: bad batch")
    assert meaning(rc) == ("it raised: ValueError: bad batch", False)
    v = join([_ev("log", (2,), DIRECT, _claim(rc))])
    assert v.culprits == [2] and v.correction["status"] == "contradicted"
    assert v.chain[0].text.endswith("fact") and "Root Cause" in v.chain[1].text


@pytest.mark.parametrize("code,sig,consequence", [
    (-6, "SIGABRT", True), (-15, "SIGTERM", True), (-9, "SIGKILL", False),
    (-11, "SIGSEGV", False), (1, None, False)])
def test_exit_codes_mean_what_torch_says(code, sig, consequence):
    rc = RootCause("torchrun", 1, code, None, None, None, "")
    from mldebug.log.rootcause import signal_of

    assert signal_of(code) == sig
    rc = RootCause("torchrun", 1, code, signal_of(code), None, None, "")
    assert meaning(rc)[1] is consequence
