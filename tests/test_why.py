"""mldebug why (#42 stage 1) on the real fixtures: one reader alone gives that reader's culprit,
a log and the FR dumps of the same fault class join into one chain, a healthy job gets no
suspect, a hostile directory is read with notes, --json is the shared envelope."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from envelope_check import check_envelope

from mldebug.cli import main
from mldebug.why.join import join
from mldebug.why.model import DIRECT, HEALTHY, INFERRED, Evidence, Source

FIX = Path(__file__).parent / "fixtures"
LOGS = FIX / "log" / "faults"
DUMPS = FIX / "fr" / "faults"
REPO = Path(__file__).parent.parent


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def why_json(capsys: pytest.CaptureFixture[str], *paths: Path | str) -> dict:
    rc, out, err = _cli(["why", *map(str, paths), "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    check_envelope(doc, "why")
    return doc


@pytest.mark.parametrize("log", [
    LOGS / "thread-lock.log", LOGS / "sigkill.log", LOGS / "dataloader-crash.log",
    LOGS / "wrong-broadcast-src.log", FIX / "log" / "torch213-gloo-rank-raises.log",
    FIX / "log" / "vllm-6042-illegal-memory-access.log"])
def test_a_log_alone_gives_the_culprit_mldebug_log_gives(capsys, log):
    from mldebug.log.analyze import analyze
    from mldebug.log.collect import load

    doc = why_json(capsys, log)
    assert doc["verdict"]["culprits"] == analyze(load([str(log)])).culprits
    assert [s["reader"] for s in doc["sources"]] == ["log"]


@pytest.mark.parametrize("case", sorted(p.name for p in DUMPS.iterdir() if p.is_dir()))
def test_fr_dumps_alone_give_the_culprit_fr_analyze_gives(capsys, case):
    from mldebug.fr.analyze import analyze
    from mldebug.fr.loader import load

    doc = why_json(capsys, DUMPS / case)
    assert doc["verdict"]["culprits"] == analyze(load([DUMPS / case])).culprits
    assert doc["sources"][0]["reader"] == "fr" and doc["verdict"]["kind"] == "culprits"


def test_a_log_and_the_dumps_of_the_same_class_join_into_one_chain(capsys):
    # thread_lock: rank 2 waits for a lock outside any collective; log: silent rank 2,
    # fr: rank 2 never enqueued #10
    doc = why_json(capsys, LOGS / "thread-lock.log", DUMPS / "thread_lock")
    v = doc["verdict"]
    assert (v["culprits"], v["class"], v["confidence"]) == ([2], "outside", "high")
    assert {c["reader"] for c in doc["chain"]} == {"log", "fr"}
    assert doc["chain"][0]["text"].endswith("rank 2 never enqueued all_reduce #10 of pg 0")
    assert "ranks 0-1,3 wait in all_reduce" in doc["chain"][1]["text"]
    assert any("(agrees: rank 2)" in c["text"] for c in doc["chain"])
    assert sorted(s["reader"] for s in doc["sources"]) == ["fr", "log"]


def test_conflicting_sources_are_shown_side_by_side_with_the_winner(capsys):
    # subgroup_skip: the log names rank 2 (silent: it waits alone in its pair group); the
    # dumps show rank 3 skipped that pair's all_reduce. The dump's record wins.
    doc = why_json(capsys, LOGS / "subgroup-skip.log", DUMPS / "subgroup_skip")
    assert doc["verdict"]["culprits"] == [3]
    (conflict,) = [c for c in doc["chain"] if "conflicts" in c["text"]]
    assert conflict["reader"] == "log"
    assert "fr wins: a rank's own record beats an inference" in conflict["text"]


def test_a_rank_without_a_dump_is_evidence_never_a_silent_gap(capsys):
    # shape_mismatch: gloo aborted ranks 0 and 1 before they could dump; the log names rank 1
    doc = why_json(capsys, LOGS / "shape-mismatch.log", DUMPS / "shape_mismatch")
    assert doc["verdict"]["culprits"] == [1]
    assert any("ranks 0-1 left no flight-recorder dump" in c["text"]
               and "prime suspect" in c["text"] for c in doc["chain"])
    doc = why_json(capsys, DUMPS / "exit0_r8")  # 8 ranks, rank 5 exited and left no dump
    assert doc["verdict"]["culprits"] == [5]
    assert any(c["text"].startswith("rank 5 left no flight-recorder dump")
               for c in doc["chain"])


def test_saved_stack_dumps_give_hang_analyzes_culprit(capsys):
    doc = why_json(capsys, FIX / "hang" / "collective_mismatch")
    assert doc["verdict"]["culprits"] == [0] and doc["sources"][0]["reader"] == "hang"


def test_sentinel_records_are_sniffed_by_content(capsys, tmp_path):
    # one record per line, in mldebug.numerics.records' documented format; any file name
    rec = {"v": 1, "kind": "nonfinite", "rank": 2, "world_size": 4, "host": "n1", "pid": 7,
           "time": 1.0, "step": 7, "micro_batch": 0, "origin": True, "origins": [2]}
    (tmp_path / "records.txt").write_text(json.dumps(rec) + "\n")
    doc = why_json(capsys, tmp_path)
    assert doc["verdict"]["culprits"] == [2] and doc["sources"][0]["reader"] == "numerics"


def test_a_healthy_job_gets_no_suspect(capsys, tmp_path):
    f = tmp_path / "ok.log"
    f.write_text("[rank0]: step 1 loss 0.5\n[rank1]: step 1 loss 0.5\n")
    v = why_json(capsys, f)["verdict"]
    assert (v["kind"], v["culprits"], v["class"]) == ("ok", [], "healthy")
    # the whole job SIGTERMed from outside (the fault matrix's healthy class): no suspect
    v = why_json(capsys, LOGS / "scheduler-sigterm.log")["verdict"]
    assert v["culprits"] == [] and v["kind"] == "ok"


def test_junk_symlinks_and_fifos_in_a_directory_are_noted(capsys, tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(LOGS / "sigkill.log", d / "job.log")
    (d / "junk.bin").write_bytes(bytes(range(256)) * 64)
    (d / "empty").write_bytes(b"")
    os.symlink("/etc/passwd", d / "link.log")
    os.mkfifo(d / "pipe")
    rc, out, err = _cli(["why", str(d)], capsys)
    assert rc == 0, err
    assert out.startswith("why: rank 3:")
    assert f"{d / 'link.log'}: a symlink (not followed); skipped" in out
    assert f"{d / 'pipe'}: a FIFO; skipped" in out
    assert f"{d / 'empty'}: empty; skipped" in out
    assert "junk.bin: binary data" in out
    doc = why_json(capsys, d)
    assert len(doc["notes"]) == 4 and doc["verdict"]["culprits"] == [3]


def test_bad_inputs_are_one_line_with_the_fix(capsys, tmp_path):
    rc, out, err = _cli(["why", str(tmp_path / "nope")], capsys)
    assert rc == 2 and "no such file or directory" in err and "Traceback" not in err
    (tmp_path / "junk.bin").write_bytes(b"\x7fELF" + bytes(4000))
    rc, out, err = _cli(["why", str(tmp_path)], capsys)
    assert rc == 1 and "could be read" in err and "Pass the job's" in err
    assert "Traceback" not in err


def test_the_join_is_pure_and_a_generic_claim_loses_to_a_specific_one():
    log = Source("job.log", "log")
    fr = Source("dumps/", "fr", 3)
    every = Evidence(log, (0, 1, 2, 3), (), "network", "every rank timed out", "low",
                     "log-all-waiting", "generic")
    v = join([every, Evidence(fr, (0, 1, 3), (2,), "outside", "rank 2 never enqueued #9",
                              "high", "fr-missing", DIRECT, per_rank=True)])
    assert v.culprits == [2] and v.code == "fr-missing"
    assert v.chain[0].text == "fr dumps/: rank 2 never enqueued #9"
    assert any("(names no rank)" in c.text for c in v.chain)
    # no claim names a rank, but a per-rank source lacks one the log saw: the suspect
    v = join([every, Evidence(fr, (0, 1, 3), (), None, "the dumps agree", None, "", "generic",
                              per_rank=True)])
    assert v.culprits == [2] and v.code == "why-no-evidence" and v.confidence == "medium"
    # every source healthy: no suspect, even with a dump missing
    ok = Evidence(log, (0, 1), (), "healthy", "no failure found", None, "log-nothing", HEALTHY)
    v = join([ok, Evidence(fr, (0,), (), "healthy", "same collectives", "high", "",
                           HEALTHY, per_rank=True)])
    assert v.kind == "ok" and v.culprits == []
    # a DIRECT claim about ranks outside its own scope is an inference
    far = Evidence(fr, (0, 1), (3,), "dead", "rank 3 never enqueued", "high", "fr-missing",
                   DIRECT)
    near = Evidence(log, (0, 1, 2, 3), (2,), "exception", "rank 2 raised", "high",
                    "log-first-failure-exception", DIRECT)
    v = join([far, near])
    assert v.culprits == [2] and v.winner is not None and v.winner.basis == DIRECT
    assert v.confidence == "high"  # the loser was an inference: no cap
    assert join([]).kind == "undecided"
    assert INFERRED == "inferred"


def test_why_on_dumps_and_logs_never_imports_torch():
    code = ("import sys; from mldebug.cli import main; "
            f"rc = main(['why', {str(LOGS / 'thread-lock.log')!r}, {str(DUMPS / 'thread_lock')!r}]); "
            "assert rc == 0; assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


# --- #42 item 4: elastic error files and --log-dir restarts (tests/fixtures/why/README.md) ---
WHY = FIX / "why"
RECORD = next((WHY / "logdir_record").iterdir())  # the run directory
RESTARTS = next((WHY / "logdir_restarts").iterdir())


def test_an_elastic_error_file_alone_names_the_rank_and_the_user_frame(capsys):
    doc = why_json(capsys, RECORD / "attempt_0" / "1" / "error.json")
    v = doc["verdict"]
    assert (v["culprits"], v["class"], v["code"]) == ([1], "exception", "elastic-error-file")
    assert v["confidence"] == "medium"  # one file: nothing to weigh it against
    fact = doc["evidence"][0]["fact"]
    # the innermost user frame (not errors/__init__.py's wrapper), the time torch recorded
    assert fact == ("rank 1 raised RuntimeError: rank 1: loss is nan at step 3 (train.py:12 "
                    "in step; its error file, 2026-12-04 20:54:11 UTC)")
    assert doc["sources"][0] | {"path": ""} == {
        "path": "", "reader": "elastic", "files": 1, "what": "error files of rank 1",
        "attempt": 0}
    assert doc["notes"] == []


def test_both_shapes_parse_and_an_unknown_rank_is_said(tmp_path):
    from mldebug.why.elastic import parse

    f = tmp_path / "rank3.json"  # TORCHELASTIC_ERROR_FILE named by the user: rank from the name
    e = parse(b'{"message": "RuntimeError: boom", "timestamp": 17}', f)
    assert not isinstance(e, str)
    assert (e.rank, e.rank_from, e.exception, e.timestamp, e.frame) == (
        3, "name", "RuntimeError: boom", 17, None)
    stack = ('Traceback (most recent call last):\n  File "/opt/conda/lib/python3.11/site-'
             'packages/torch/x.py", line 3, in w\n  File "/job/mldebug/numerics/sentinel.py", '
             'line 9, in check\n  File "/job/model.py", line 40, in fwd\n  File "/opt/conda/'
             'lib/python3.11/site-packages/torch/nn/y.py", line 2, in f\nValueError: bad\n')
    e = parse(json.dumps({"message": {"message": "ValueError: bad", "extraInfo": {
        "py_callstack": stack, "timestamp": "5"}, "errorCode": 1}}).encode(),
        tmp_path / "err.json")
    assert not isinstance(e, str)
    assert (e.rank, e.frame, e.timestamp, e.who) == (None, "model.py:40 in fwd", 5,
                                                      "an unknown rank")


def test_a_restarted_log_dir_gives_the_last_attempts_culprit_and_a_line_per_attempt(capsys):
    doc = why_json(capsys, WHY / "logdir_restarts")
    v = doc["verdict"]
    # attempt 1: rank 0 failed connecting to rank 1 (a reaction), rank 1 never got through
    # init_process_group; attempt 0 (rank 1's RuntimeError) is history, not the verdict
    assert v["culprits"] == [1] and v["code"] == "log-silent-rank"
    assert "init_process_group at train.py:18" in v["summary"]
    past = [c["text"] for c in doc["chain"] if c["text"].startswith("attempt ")]
    assert past == ["attempt 0: rank 1 raised RuntimeError at train.py:12; restarted"]
    assert doc["chain"][-1]["text"] == past[0]
    now = [s for s in doc["sources"] if s["attempt"] == 1]
    assert {s["reader"] for s in now} == {"log", "elastic"}
    assert all("attempt_0" not in s["path"] for s in now)
    assert [s["attempt"] for s in doc["sources"]].count(0) == 1
    elastic = next(e for e in doc["evidence"] if e["reader"] == "elastic"
                   and "attempt_1" in e["source"])
    assert elastic["culprits"] == [] and "reaction" in elastic["fact"]


def test_error_files_and_logs_of_the_same_job_agree(capsys):
    doc = why_json(capsys, WHY / "logdir_record")
    v = doc["verdict"]
    assert (v["culprits"], v["class"], v["confidence"]) == ([1], "exception", "high")
    assert v["summary"].endswith("(elastic agrees)")
    assert sorted(s["reader"] for s in doc["sources"]) == ["elastic", "log"]
    (agree,) = [c for c in doc["chain"] if c["reader"] == "elastic"]
    assert agree["text"].endswith("(agrees: rank 1)") and "train.py:12 in step" in agree["text"]
    # rank 0's error.json is gloo's "Connection closed by peer": a reaction, not the cause
    (ev,) = [e for e in doc["evidence"] if e["reader"] == "elastic"]
    assert ev["culprits"] == [1] and ev["scope"] == [0, 1] and ev["confidence"] == "high"
    # each source alone at medium: agreeing raises the confidence one step (the join, pure)
    log = Evidence(Source("job.log", "log"), (0, 1), (1,), "exception", "rank 1 raised",
                   "medium", "log-first-failure-exception", DIRECT)
    err = Evidence(Source("error.json", "elastic"), (1,), (1,), "exception", "rank 1 raised",
                   "medium", "elastic-error-file", DIRECT)
    assert join([log]).confidence == "medium" and join([log, err]).confidence == "high"


def test_an_earlier_attempt_is_history_in_the_join_never_a_vote():
    def at(n: int, rank: int) -> Evidence:
        return Evidence(Source(f"run/attempt_{n}/", "elastic", run="run", attempt=n), (rank,),
                        (rank,), "exception", f"rank {rank} raised ValueError", "high",
                        "elastic-error-file", DIRECT)

    v = join([at(0, 3), at(1, 2), at(2, 5)])
    assert v.culprits == [5] and v.confidence == "high"
    assert [c.text for c in v.chain] == [
        "elastic run/attempt_2/: rank 5 raised ValueError",
        "attempt 0: rank 3 raised ValueError; restarted",
        "attempt 1: rank 2 raised ValueError; restarted"]


@pytest.mark.parametrize("name,content,says", [
    ("deep.json", b'{"message": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "nested too deeply"),
    ("big.json", b'{"message": "' + b"A" * (10 << 20) + b'"}', "over the 1 MiB"),
    ("list.json", b'["message", {"message": {"extraInfo": {"py_callstack": ""}}}]',
     "not a flight-recorder dump, a stack dump, a sentinel record or an elastic error file"),
    ("num.json", b'{"message": 5, "extraInfo": {}}', "neither text nor an object"),
    ("bad.json", b'{"message": {"message": "RuntimeError: x", "extraInfo": {"py_c', "not valid JSON"),
])
def test_a_hostile_error_file_is_one_note_never_a_traceback(capsys, tmp_path, name, content,
                                                            says):
    shutil.copy(LOGS / "sigkill.log", tmp_path / "job.log")
    (tmp_path / name).write_bytes(content)
    rc, out, err = _cli(["why", str(tmp_path), "--json"], capsys)
    assert rc == 0 and "Traceback" not in out + err
    doc = json.loads(out)
    assert doc["verdict"]["culprits"] == [3]
    (note,) = doc["notes"]
    assert note.startswith(f"{tmp_path / name}: ") and says in note


@pytest.mark.parametrize("case", ["healthy_ddp", "scheduler_sigterm"])
def test_dumps_of_a_running_job_name_no_culprit(case, capsys):
    """Dumps written while the job ran (on SIGTERM from outside, or by the capture handler
    on a live route's signal) catch ranks a collective apart: a cut, not a fault. Real
    dumps of two no-culprit cases of the fault matrix (tests/fixtures/why/live_cut): `why`
    named rank 1 and rank 0 ('never enqueued') until the cut rule (cli.why._running_cut)."""
    d = Path(__file__).parent / "fixtures" / "why" / "live_cut" / case
    assert main(["why", str(d), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["culprits"] == [] and doc["verdict"]["class"] == "healthy", doc
    assert any("cut through a running job" in c["text"] for c in doc["chain"]) or \
        "cut through a running job" in json.dumps(doc), doc["chain"]


def test_a_cut_with_stacks_that_show_the_job_stuck_is_the_mismatch_again():
    """Rule 8: dumps taken on request while ranks were a collective apart are a cut of a
    running job - unless stack dumps of the same moment (what `mldebug hang --fr` joins) say
    the job is stuck; stacks that say it moves keep the cut."""
    fr = Source("hang/fr", "fr", 4)
    hang = Source("hang", "hang", 4)
    mismatch = Evidence(fr, (0, 1, 2, 3), (3,), "outside", "rank 3 never enqueued all_reduce #2",
                        "high", "fr-missing", DIRECT, per_rank=True)
    cut = Evidence(fr, (0, 1, 2, 3), (), "healthy", "a cut through a running job", "medium",
                   "fr-running-cut", HEALTHY, per_rank=True, if_stuck=mismatch)
    moving = Evidence(hang, (0, 1, 2, 3), (), "healthy", "every rank moved", "high",
                      "hang-progress", HEALTHY, per_rank=True)
    stuck = Evidence(hang, (0, 1, 2, 3), (), "desync", "ranks wait in different collectives",
                     "medium", "hang-desync", "generic", per_rank=True)
    assert join([cut]).culprits == [] and join([cut, moving]).culprits == []
    v = join([cut, stuck])
    assert v.culprits == [3] and v.code == "fr-missing", v.chain
    assert "stacks show the job stuck" in v.chain[0].text
