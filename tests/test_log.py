"""mldebug log: real logs from public threads and real torchrun (gloo) jobs -> the culprit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mldebug.cli import main
from mldebug.log.analyze import analyze
from mldebug.log.collect import load, rank_from_path
from mldebug.log.parse import classify, line_prefix, parse_lines, time_key

FIX = Path(__file__).parent / "fixtures" / "log"
REPO = Path(__file__).resolve().parent.parent

CASES = [
    ("vllm-6042-illegal-memory-access.log", "log-first-failure-cuda-error", [3]),
    ("accelerate-157-end-of-epoch.log", "log-collective-mismatch", [0]),
    ("cppo-6-sigkill.log", "log-killed", [0]),
    ("basicsr-737-same-collective.log", "log-all-waiting", []),
    ("llamafactory-5417-timeout-at-work.log", "log-all-waiting", []),
    ("torch213-gloo-rank-raises.log", "log-first-failure-exception", [2]),
    ("torch213-gloo-rank-sigkill.log", "log-killed", [1]),
    ("torch213-gloo-rank-stuck.log", "log-silent-rank", [3]),
    ("torch213-hooks-overflow-tee.log", "log-first-failure-overflow", [2]),
    ("torch213-hooks-overflow-interleaved-abort.log", "log-first-failure-overflow", [2]),
    ("torch213-hooks-watchdog-stall.log", "log-watchdog-stall", [1]),
    ("torch213-gloo-size-mismatch.log", "log-size-mismatch", [3]),
    ("torch213-launcher-eaddrinuse.log", "log-launcher-port-in-use", []),
    ("torch213-detail-fingerprint-mismatch.log", "log-fingerprint-mismatch", [3]),
    ("opendde-23-uneven-split.log", "log-fingerprint-mismatch", []),
    ("gloo-456-preamble-size.log", "log-size-mismatch", []),
    ("dcpdn-12-dataloader-killed.log", "log-first-failure-dataloader-killed", []),
    ("ms-swift-9443-text-only-batch.log", "log-fingerprint-mismatch", []),
    ("simpletuner-2712-allgather-vs-reduce.log", "log-fingerprint-mismatch", []),
    ("speechbrain-2401-checkpoint-broadcast.log", "log-fingerprint-mismatch", []),
    ("lightning-19680-epoch-end-all-gather.log", "log-fingerprint-mismatch", []),
    ("amvur-2-sigkill-flattened.log", "log-killed", [2]),
    ("ms-swift-6301-rank11-cuda-oom.log", "log-first-failure-cuda-oom", [11]),
    ("spa-vl-rlhf-2-broadcast-shapes.log", "log-fingerprint-mismatch", []),
    ("xtuner-1993-monitored-barrier-rank0.log", "log-monitored-barrier", [0]),
]


@pytest.mark.parametrize("name,code,culprits", CASES)
def test_real_logs_name_the_stated_cause(name: str, code: str, culprits: list[int]) -> None:
    report = analyze(load([str(FIX / name)]))
    assert report.verdict is not None
    assert report.verdict.code == code, report.verdict
    assert report.culprits == culprits
    assert report.verdict.fix


def test_hook_lines_point_to_the_command_that_reads_their_evidence() -> None:
    """The watchdog's 'stacks in PATH' line -> `mldebug hang analyze DIR`; the trace ring and
    the flight recorder lines -> `trace show` / `fr analyze` (strings from mldebug/capture,
    trace/full.py, fr/recorder.py)."""
    report = analyze(load([str(FIX / "torch213-hooks-watchdog-stall.log")]))
    assert report.verdict is not None
    assert "mldebug hang analyze /tmp/job/dumps" in report.verdict.fix
    lines = [
        "[rank0]: mldebug.trace: tracing into /scratch/tr/host-rank0-77.ring",
        "[rank1]: mldebug.fr: dumped the flight recorder to /scratch/fr/rank1.pkl",
        "[rank1]: mldebug.breakpoint: rank 1 waited 60s for the debugger on rank 0 and continues",
    ]
    r2 = analyze(parse_lines(lines))
    cmds = {f.title.split(": ", 1)[1] for f in r2.findings if f.code == "log-evidence"}
    assert cmds == {"mldebug trace show /scratch/tr", "mldebug fr analyze /scratch/fr/rank1.pkl"}
    assert r2.parsed.notes and "breakpoint" in r2.parsed.notes[0]


def test_exceptions_of_any_class_name_and_our_prefix() -> None:
    lines = ["[rank1]: [vm:1] step 3", "[rank2]: [vm:2] Traceback (most recent call last):",
             '[rank2]: [vm:2]   File "/w/train.py", line 9, in step',
             "[rank2]: [vm:2] mylib.DataCorrupted: shard 7 has 0 rows",
             "[rank1]: [vm:1] Traceback (most recent call last):",
             "[rank1]: [vm:1] KeyboardInterrupt"]
    report = analyze(parse_lines(lines))
    assert report.culprits == [2] and "DataCorrupted: shard 7" in report.verdict.title  # type: ignore[union-attr]
    assert report.parsed.ranks[2].host == "vm"


def test_a_traceback_with_the_ranks_other_output_between_its_lines() -> None:
    """stdout and stderr of one rank in one log: lines of a report land between a traceback's
    frames. The traceback stays open through them (they are read as any line), and only a name
    that looks like an exception class ends it after such lines; a traceback cut short gives no
    event from a later ordinary line."""
    tb = ["[rank2]: Traceback (most recent call last):",
          '[rank2]:   File "/w/train.py", line 9, in step',
          "[rank2]: Detected inf/nan during batch_number=2",  # the report, on stdout
          "[rank2]: abs min  abs max  metadata",
          '[rank2]:   File "/w/model.py", line 4, in forward',
          "[rank2]: Note: the first inf is in layer 3",  # looks like "Type: msg", is not one
          "[rank2]: mylib.OverflowSeen: inf in layer 3"]
    ranks = analyze(parse_lines(["[rank0]: step 1", *tb])).parsed.ranks
    ev = ranks[2].first_event
    assert ev is not None and ev.message == "OverflowSeen: inf in layer 3", ev
    assert ev.frame == "model.py:4 in forward"
    # cut short: 250 lines of ordinary output, then a line shaped like "Type: msg"
    cut = tb[:2] + [f"[rank2]: step {i} loss 1.0" for i in range(250)] + \
        ["[rank2]: Epoch: 3 done"]
    assert analyze(parse_lines(cut)).parsed.ranks[2].first_event is None


def test_world_size_with_a_rank_that_printed_nothing() -> None:
    """--world-size 4 where rank 3 never printed: no KeyError, rank 3 is the suspect."""
    lines = [f"[rank{r}]:[E0101 10:00:0{r}.0 x.cpp:1] [Rank {r}] Watchdog caught collective operation "
             f"timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600010 ms"
             for r in range(3)]
    p = parse_lines(lines)
    p.world_size = 4
    report = analyze(p)
    assert report.verdict is not None and report.verdict.code == "log-silent-rank"
    assert report.culprits == [3] and "from --world-size" in report.verdict.detail
    p2 = parse_lines(lines + ["WORLD_SIZE=4 MASTER_ADDR=n1"])
    r2 = analyze(p2)
    assert r2.culprits == [3] and "from a line that states it" in r2.verdict.detail  # type: ignore[union-attr]
    # a paste of ranks 2, 4 and 6 only says nothing about ranks 0, 1, 3, 5
    paste = [ln.replace("rank0", "rank6").replace("Rank 0", "Rank 6").replace("rank1", "rank4")
             .replace("Rank 1", "Rank 4") for ln in lines]
    assert analyze(parse_lines(paste)).verdict.code == "log-all-waiting"  # type: ignore[union-attr]
    # ranks 0-7 but 5: the gap is a rank (numbering), said with less confidence
    many = [ln.replace("rank0", f"rank{r}").replace("Rank 0", f"Rank {r}") for r in (0, 1, 2, 3, 4, 6, 7)
            for ln in lines[:1]]
    r3 = analyze(parse_lines(many))
    assert r3.culprits == [5] and "from the rank numbering" in r3.verdict.detail  # type: ignore[union-attr]
    assert "Confidence: medium" in r3.verdict.detail  # type: ignore[union-attr]


def test_rank_only_inside_the_message() -> None:
    lines = ["[E0101 10:00:01.0 x.cpp:1] [Rank 0] Watchdog caught collective operation timeout: "
             "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600010 ms",
             "[E0101 10:00:01.0 x.cpp:1] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: 7, last "
             "enqueued NCCL work: 7, last completed NCCL work: 6.",
             "[E0101 10:00:01.0 x.cpp:1] [PG 0 (default_pg) Rank 2] Timeout at NCCL work: 6, last "
             "enqueued NCCL work: 6, last completed NCCL work: 6."]
    report = analyze(parse_lines(lines))
    assert sorted(report.parsed.ranks) == [0, 1, 2]
    assert report.culprits == [2]


def _fp(rank: int, op: str, seq: int = 1, shape: str = "[4]") -> str:
    return (f"Rank {rank} is running collective: CollectiveFingerPrint(SequenceNumber={seq}, "
            f"OpType={op}, TensorShape={shape}, TensorDtypes=Float, TensorDeviceTypes=TensorOptions("
            "dtype=float (default), device=cpu))")


def test_fingerprint_mismatch_odd_rank_by_majority() -> None:
    """Each DETAIL message names two ranks; the odd one is the rank whose collective differs
    from the majority over every rank named. Rank 0 is named in every message (it is the
    reference ProcessGroupWrapper compares against), yet ranks 1-3 agree, so rank 0 is odd."""
    lines = [f"[rank{r}]:RuntimeError: Detected mismatch between collectives on ranks. "
             f"{_fp(0, 'ALLREDUCE')}, but {_fp(r, 'BROADCAST')}." for r in (1, 2, 3)]
    report = analyze(parse_lines(lines))
    assert report.verdict is not None and report.verdict.code == "log-fingerprint-mismatch"
    assert report.culprits == [0] and "majority of 4 ranks" in report.verdict.detail
    # the same sequence number with another shape is a mismatch too
    lines = [f"[rank{r}]:RuntimeError: Detected mismatch between collectives on ranks. "
             f"{_fp(r, 'ALLREDUCE', 9, '[8]' if r == 2 else '[4]')}, but {_fp(0, 'ALLREDUCE', 9)}."
             for r in (1, 2, 3)]
    assert analyze(parse_lines(lines)).culprits == [2]
    # two ranks only, each naming the other: no majority, said so
    lines = [f"RuntimeError: Detected mismatch between collectives on ranks. {_fp(0, 'ALLREDUCE')}, "
             f"but {_fp(1, 'BROADCAST')}."]
    r2 = analyze(parse_lines(lines))
    assert r2.culprits == [] and "Confidence: low" in r2.verdict.detail  # type: ignore[union-attr]


def test_same_sequence_number_other_size_is_a_mismatch() -> None:
    lines = [f"[rank{r}]:[E0101 10:00:0{r}.0 ProcessGroupNCCL.cpp:1] [Rank {r}] Watchdog caught "
             f"collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn="
             f"{1024 if r != 1 else 512}, NumelOut=1024, Timeout(ms)=600000) ran for 600010 ms"
             for r in range(4)]
    report = analyze(parse_lines(lines))
    assert report.verdict is not None and report.verdict.code == "log-collective-mismatch"
    assert report.culprits == [1] and "512 elements" in report.verdict.title


def test_phase_only_one_rank_entered_breaks_the_tie() -> None:
    """Every rank timed out in the same collective; rank 0 printed 'Running validation' last,
    the others were still training: rank 0 left the common path."""
    lines = [f"[rank{r}]:step 99 loss 1.0" for r in range(4)]
    lines.append("[rank0]:Running validation on 512 samples")
    lines += [f"[rank{r}]:[E0101 10:30:0{r}.0 x.cpp:1] [Rank {r}] Watchdog caught collective operation "
              f"timeout: WorkNCCL(SeqNum=100, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600010 ms"
              for r in range(4)]
    report = analyze(parse_lines(lines))
    assert report.verdict is not None and report.verdict.code == "log-phase-tiebreak"
    assert report.culprits == [0] and "validation" in report.verdict.title
    assert "what each rank printed last" in report.verdict.detail
    # every rank validating: no rank left the common path, every rank waited
    same = [f"[rank{r}]:Running validation on 512 samples" for r in range(4)] + lines
    assert analyze(parse_lines(same)).verdict.code == "log-all-waiting"  # type: ignore[union-attr]


def test_every_fixture_is_listed_with_its_source() -> None:
    readme = (FIX / "README.md").read_text()
    for f in FIX.glob("*.log"):
        assert f.name in readme
    assert {c[0] for c in CASES} == {f.name for f in FIX.glob("*.log")}


def test_two_rank_detail_messages_name_both_ranks_and_what_differs() -> None:
    """Public threads where one DETAIL message names two ranks: no majority, so no culprit, but
    both ranks and the differing shape/op are in the verdict, with low confidence."""
    want = {"opendde-23-uneven-split.log": ("ranks 1-2", "1435", "1436"),
            "ms-swift-9443-text-only-batch.log": ("ranks 0-1", "51123456", "195812480"),
            "simpletuner-2712-allgather-vs-reduce.log": ("ranks 1,7", "ALLGATHER", "REDUCE"),
            "speechbrain-2401-checkpoint-broadcast.log": ("ranks 0-1", "sequence number 485",
                                                          "ALLREDUCE", "BROADCAST"),
            "lightning-19680-epoch-end-all-gather.log": ("ranks 0-1", "no sequence number",
                                                         "ALLGATHER_COALESCED"),
            "spa-vl-rlhf-2-broadcast-shapes.log": ("ranks 0,2", "38838272", "33554432")}
    for name, words in want.items():
        v = analyze(load([str(FIX / name)])).verdict
        assert v is not None and "Confidence: low" in v.detail, name
        assert all(w in v.title + v.detail for w in words), (name, v)


def test_first_failure_names_the_user_frame_and_the_consequences() -> None:
    report = analyze(load([str(FIX / "torch213-gloo-rank-raises.log")]))
    v = report.verdict
    assert v is not None
    assert "ValueError: corrupt sample in shard 2 at step 3" in v.title
    assert "log_rank_raises.py:21 in load_batch" in v.detail
    assert "ranks 1,3 timed out or lost their peer" in v.detail


def test_torchrun_root_cause_is_corrected_when_it_names_a_waiting_rank() -> None:
    report = analyze(load([str(FIX / "torch213-gloo-rank-stuck.log")]))
    codes = [f.code for f in report.findings]
    assert codes[0] == "log-silent-rank"
    assert "log-launcher-root" in codes


def test_behind_rank_from_enqueued_numbers() -> None:
    lines = [
        f"[rank{r}]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:1664] [PG 1 Rank {r}] Exception (either an "
        f"error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: "
        f"{1579 if r == 5 else 1582}, last completed NCCL work: 1579."
        for r in range(8)
    ]
    report = analyze(parse_lines(lines))
    assert report.verdict is not None and report.verdict.code == "log-rank-behind"
    assert report.culprits == [5]
    assert "#1580" in report.verdict.title


def test_time_order_beats_line_order() -> None:
    lines = [
        "[rank1]:[E0101 10:00:05.000 x.cpp:1] Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered",
        "[rank0]:[E0101 10:00:01.000 x.cpp:1] Process group watchdog thread terminated with exception: CUDA error: device-side assert triggered",
    ]
    report = analyze(parse_lines(lines))
    assert report.culprits == [0]
    assert "by the times on the lines" in report.verdict.detail  # type: ignore[union-attr]


def test_oom_with_other_prefixes() -> None:
    lines = [
        "[1,2]<stderr>:Traceback (most recent call last):",
        '[1,2]<stderr>:  File "/home/u/train.py", line 88, in step',
        "[1,2]<stderr>:    loss = model(batch)",
        "[1,2]<stderr>:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "0: [E ProcessGroupNCCL.cpp:1] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600010 milliseconds before timing out.",
    ]
    report = analyze(parse_lines(lines))
    assert report.verdict is not None and report.verdict.code == "log-first-failure-cuda-oom"
    assert report.culprits == [2]
    assert "train.py:88 in step" in report.verdict.detail


def test_prefixes_and_times() -> None:
    assert line_prefix("[rank12]:hello")[0] == 12
    assert line_prefix("[default3]: x")[0] == 3
    assert line_prefix("7: x")[0] == 7
    assert line_prefix("[1,4]<stdout>:x")[0] == 4
    r, t, rest = line_prefix("\x1b[0m【2025-09-25 14:27:49】[rank2]:[E ok")
    assert (r, rest) == (2, "[E ok") and t is not None
    assert time_key("E0321 02:07:08.5") == time_key("2024-03-21 02:07:08.5") == time_key("E321 02:07:08.5")
    assert line_prefix("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] x")[0] == 0
    assert line_prefix("(pid=123) x")[0] is None  # a Ray pid is not a rank
    assert classify("RuntimeError: Connection closed by peer [127.0.0.1]:1")[1] is False
    assert classify("ValueError: bad")[1] is True


def test_nccl_warns_are_grouped() -> None:
    lines = [f"host{h}:1:2 [0] transport/net_ib.cc:12 NCCL WARN NET/IB : Got completion with error 12, opcode 0"
             for h in range(50)]
    report = analyze(parse_lines(lines))
    warns = [f for f in report.findings if f.code == "log-nccl-warn"]
    assert len(warns) == 1 and "50 NCCL WARN lines" in warns[0].detail


def test_rank_from_path() -> None:
    assert rank_from_path(Path("logs/job42_rank3.log")) == 3
    assert rank_from_path(Path("run/attempt_0/5/stderr.log")) == 5
    assert rank_from_path(Path("nccl.host.1234.log")) is None


def test_directory_of_per_rank_files(tmp_path: Path) -> None:
    for r in range(4):
        d = tmp_path / "attempt_0" / str(r)
        d.mkdir(parents=True)
        body = ("Traceback (most recent call last):\n  File \"/x/train.py\", line 5, in main\n"
                "ValueError: bad shard\n") if r == 1 else (
            "RuntimeError: [pair.cc:1] Connection closed by peer\n" if r != 3 else "step 7\n")
        (d / "stderr.log").write_text(body)
    (tmp_path / "link.log").symlink_to("/etc/passwd")  # symlinks inside a directory are skipped
    report = analyze(load([str(tmp_path)]))
    assert report.culprits == [1]
    assert not any("passwd" in s for s in report.parsed.sources)


def test_cli_json_stdin_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", str(FIX / "cppo-6-sigkill.log"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["culprits"] == [0] and doc["findings"][0]["code"] == "log-killed"
    assert doc["findings"][0]["fix"]
    assert main(["log", "/nonexistent/file"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["log", str(FIX), "--world-size", "0"]) == 2


def test_cli_reads_stdin_and_long_lines() -> None:
    text = (FIX / "torch213-gloo-rank-sigkill.log").read_text() + "x" * 100_000 + "\n"
    r = subprocess.run([sys.executable, "-m", "mldebug", "log", "-"], input=text, text=True,
                       capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert "rank 1 killed by SIGKILL" in r.stdout


def test_log_dir_tree_reads_every_rank() -> None:
    """torchrun --log-dir DIR --redirects 3 --tee 3 (torch 2.13): DIR/RUN/attempt_0/RANK/
    {stdout,stderr}.log. Every rank is read (empty files too), the culprit named."""
    report = analyze(load([str(REPO / "tests" / "fixtures" / "log_logdir")]))
    assert sorted(report.parsed.ranks) == [0, 1, 2, 3]
    assert report.verdict is not None and report.verdict.code == "log-first-failure-overflow"
    assert report.culprits == [2]


def test_log_dir_with_restarts_reads_the_last_attempt(tmp_path: Path) -> None:
    """torchrun --max-restarts: attempt_0 failed one way, attempt_1 another; the report is about
    the last attempt and names the earlier one as skipped."""
    import shutil

    run = next((REPO / "tests" / "fixtures" / "log_logdir").iterdir())
    shutil.copytree(run, tmp_path / run.name)
    a1 = tmp_path / run.name / "attempt_1"
    for r in range(4):
        (a1 / str(r)).mkdir(parents=True)
        (a1 / str(r) / "stderr.log").write_text(
            "Traceback (most recent call last):\nKeyError: 'label'\n" if r == 1 else
            "RuntimeError: Connection closed by peer [127.0.0.1]:1\n")
    report = analyze(load([str(tmp_path)]))
    assert report.culprits == [1] and "KeyError" in report.verdict.title  # type: ignore[union-attr]
    assert any("attempt_0" in n for n in report.parsed.notes)


@pytest.mark.slow
def test_real_torchrun_job_with_our_hooks(tmp_path: Path) -> None:
    """One live 4-rank gloo job (tests/fixtures/log_job/hooks_job.py, attempt 0): install_excepthook
    and rank_print print '[host:rank] ' behind torchrun's '[rankN]:' (--tee), the detector raises
    OverflowDetected on every rank; the combined output and the --log-dir tree both name rank 2."""
    from tests.jobs import free_port

    log = tmp_path / "job.log"
    with log.open("w") as f:
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
             "--master-port", str(free_port()), "--log-dir", str(tmp_path / "logs"),
             "--redirects", "3", "--tee", "3",
             str(REPO / "tests" / "fixtures" / "log_job" / "hooks_job.py"),
             "--dumps", str(tmp_path / "dumps"), "--scenario", "0"],
            stdout=f, stderr=subprocess.STDOUT, timeout=180, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    text = log.read_text()
    assert "]:[" in text or "]: [" in text  # torchrun's prefix stacked on ours
    for inputs in ([str(log)], [str(tmp_path / "logs")]):
        report = analyze(load(inputs))
        assert report.verdict is not None and report.verdict.code == "log-first-failure-overflow", inputs
        assert report.culprits == [2]
        assert sorted(report.parsed.ranks) == [0, 1, 2, 3]
        assert "name rank 2" in report.verdict.detail


@pytest.mark.slow
def test_real_torchrun_job_stuck_rank(tmp_path: Path) -> None:
    """A live 4-rank gloo job where rank 1 sleeps outside the collective: torchrun's table blames
    another rank, mldebug log names rank 1."""
    log = tmp_path / "job.log"
    from tests.jobs import free_port

    with log.open("w") as f:
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
             "--master-port", str(free_port()), str(REPO / "recipes" / "log_rank_raises.py"),
             "--how", "sleep", "--culprit", "1", "--step", "2", "--timeout", "4"],
            stdout=f, stderr=subprocess.STDOUT, timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    report = analyze(load([str(log)]))
    assert report.verdict is not None and report.verdict.code == "log-silent-rank"
    assert report.culprits == [1]


_LINE_PARTS = [
    "[rank3]:", "[default1]:", "12: ", "[1,2]<stderr>:", "\x1b[0m", "【2025-09-25 14:27:49】",
    "Traceback (most recent call last):", '  File "/x/train.py", line 7, in main',
    "ValueError: x", "RuntimeError: CUDA error: an illegal memory access was encountered",
    "[Rank 9] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=", "OpType=ALLREDUCE",
    "Timeout(ms)=", "[PG 1 Rank 2] Timeout at NCCL work: 5, last enqueued NCCL work: 99999999999999999999",
    ", last completed NCCL work: -3.", "Failures:", "[0]:", "  rank      : ", "  exitcode  : -9 (pid: ",
    "Root Cause (first observed failure):", "=====", "NCCL WARN ", "Killed", "[E0321 02:07:08.4 ",
    "9" * 5000, "  exitcode  : " + "9" * 5000, "[rank" + "7" * 5000 + "]:", "\udcff", "\x00", "inf", "nan", ")", "]", "(", "[",
]


def test_parser_never_raises_on_garbage() -> None:
    """Property: any mix of the pieces real logs are made of parses (or is ignored), fast."""
    import time

    from hypothesis import given, settings
    from hypothesis import strategies as st

    line = st.lists(st.sampled_from(_LINE_PARTS) | st.text(max_size=40), max_size=8).map("".join)

    @settings(max_examples=150, deadline=None)
    @given(st.lists(line, max_size=60))
    def check(lines: list[str]) -> None:
        t = time.monotonic()
        report = analyze(parse_lines(lines))
        assert report.findings
        report.to_dict()
        assert time.monotonic() - t < 2.0

    check()


def test_no_verdict_when_no_rule_matches_only_notes() -> None:
    """NCCL warnings alone are notes, not a verdict: JSON 'verdict' is null, no culprit."""
    lines = ["host1:1:2 [0] transport/net_ib.cc:12 NCCL WARN NET/IB : Got completion with error 12"]
    report = analyze(parse_lines(lines))
    assert report.verdict is None and report.culprits == []
    assert report.to_dict()["verdict"] is None
    assert [f.code for f in report.findings] == ["log-nccl-warn"]


ENGINES = [
    pytest.param({"grep_min": 1 << 62}, id="python-prefilter"),
    pytest.param({"grep_min": 0}, id="grep-prefilter"),
]


@pytest.mark.parametrize("kw", ENGINES)
def test_prefilter_reads_like_every_line(kw: dict[str, int]) -> None:
    """Every fixture: the prefiltered read (Python regex passes, or grep) gives the verdict,
    culprits and per-rank first errors of a read that parses every line."""
    files = sorted(FIX.glob("*.log")) + [REPO / "tests" / "fixtures" / "log_logdir"]
    for f in files:
        full = analyze(load([str(f)], prefilter=False))
        fast = analyze(load([str(f)], **kw))  # type: ignore[arg-type]
        assert fast.culprits == full.culprits, f
        assert (fast.verdict and fast.verdict.code) == (full.verdict and full.verdict.code), f
        assert {r: (s.first_primary and s.first_primary.message) for r, s in fast.parsed.ranks.items()} == \
            {r: (s.first_primary and s.first_primary.message) for r, s in full.parsed.ranks.items()}, f
        assert sorted(fast.parsed.ranks) == sorted(full.parsed.ranks), f


def test_big_interleaved_log_through_grep_names_the_rank_behind(tmp_path: Path) -> None:
    """A 4+ MiB log goes through grep; the one rank behind is found among 64 ranks, and the
    traceback window (frames after 'Traceback') is read from the file at grep's offset."""
    p = tmp_path / "big.log"
    with p.open("w") as f:
        for s in range(1200):
            for r in range(64):
                f.write(f"[rank{r}]:step {s} loss 2.{s % 97} lr 3e-4 grad_norm 1.{r} tokens/s 51{r}\n")
        f.write("[rank9]:Traceback (most recent call last):\n")
        for r in range(64):
            if r != 9:  # the others go on printing inside rank 9's traceback
                f.write(f"[rank{r}]:step 1200 loss 2.0\n")
        f.write('[rank9]:  File "/u/train.py", line 41, in fetch\n')
        f.write("[rank9]:BadShard: shard 3 is empty\n")
    assert p.stat().st_size > 4 << 20
    for kw in ({}, {"grep_min": 1 << 62}):
        report = analyze(load([str(p)], **kw))  # type: ignore[arg-type]
        assert report.culprits == [9], kw
        assert "train.py:41 in fetch" in report.verdict.detail  # type: ignore[union-attr]
        assert len(report.parsed.ranks) == 64


@pytest.mark.parametrize("content,words", [
    (b"\x00\x01\x02binary" * 100, "binary data"),
    (b"\x1f\x8b\x08\x00" + b"\x00" * 100, "gzip-compressed"),
    (b"ok\n" + bytes(range(160, 256)) * 200, "not UTF-8"),
    (b"a" * (9 << 20), "no line break"),
])
def test_bad_input_is_one_clear_line_and_nothing_is_written(tmp_path: Path, content: bytes,
                                                            words: str) -> None:
    bad = tmp_path / "in" / "bad.log"
    bad.parent.mkdir()
    bad.write_bytes(content)
    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run([sys.executable, "-m", "mldebug", "log", str(bad)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home),
                            "XDG_STATE_HOME": str(home / "state")})
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2  # the message and its fix
    assert r.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bad.log", "home", "in"]
    # inside a directory the bad file is skipped with its reason; the rest is read
    (bad.parent / "rank1.log").write_text("[rank1]:Traceback (most recent call last):\n"
                                          "[rank1]:ValueError: x\n")
    report = analyze(load([str(bad.parent)]))
    assert report.culprits == [1] and any(words in n for n in report.parsed.notes)


def test_launcher_prefixes_stacked_on_ours() -> None:
    """pdsh, srun -l, mpirun --tag-output, deepspeed/accelerate [rankN]: over mldebug's [host:rank]:
    the rank is read through any stack of them."""
    tb = ["Traceback (most recent call last):", '  File "/w/train.py", line 3, in step',
          "ValueError: bad batch"]
    for pre in ("node7: [rank5]: [node7:5] ", "5: [node7:5] ", "[1,5]<stderr>:[node7:5] ",
                "node7: [default5]:[node7:5] ", "[rank5]:[node7:5] "):
        report = analyze(parse_lines([pre + ln for ln in tb]))
        assert report.culprits == [5], pre
        assert "train.py:3 in step" in report.verdict.detail, pre  # type: ignore[union-attr]


def test_no_prefix_and_one_rank_pasted() -> None:
    """A paste of one rank's traceback without any prefix: the failure is still named, from the
    rank in its message when there is one, else as the launcher's (no rank)."""
    lines = ["Traceback (most recent call last):", '  File "/w/train.py", line 3, in step',
             "torch.distributed.DistBackendError: [PG 0 Rank 6] NCCL error in: "
             "ProcessGroupNCCL.cpp:1, unhandled system error (run with NCCL_DEBUG=INFO for "
             "details), NCCL version 2.21.5"]
    report = analyze(parse_lines(lines))
    assert report.verdict is not None
    assert report.verdict.code in ("log-first-failure-nccl-error", "log-launcher-failed")
    assert any(f.code == "log-torch-nccl-error" for f in report.findings)


def test_cut_and_wrapped_lines() -> None:
    """A watchdog line wrapped over two lines (a terminal or an issue's code block) and a
    traceback cut before its last line are read without raising; the rank is still named."""
    lines = ["[rank2]:[E0101 10:00:00.0 ProcessGroupNCCL.cpp:1] [Rank 2] Watchdog caught collective "
             "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE,",
             "[rank2]: NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds",
             "[rank1]:Traceback (most recent call last):",
             '[rank1]:  File "/w/train.py", line 3, in step']
    report = analyze(parse_lines(lines))
    assert 2 in report.parsed.ranks and report.parsed.ranks[2].timeouts
    assert report.parsed.ranks[2].timeouts[0].seq == 9


def test_failure_table_squeezed_onto_one_line_is_read() -> None:
    """torchrun's table as an issue page renders it (spaces and newlines gone): the entry on one
    line still gives the rank, the exit code and the pid; the table's own layout still works."""
    flat = ["Root Cause (first observed failure) :", "[0]:", "time", "host",
            "rank5 (local rank: 1)exitcode: -6 (pid: 4242)error file: <N/A>"]
    parsed = parse_lines(flat)
    assert [(f.rank, f.exitcode, f.pid, f.root) for f in parsed.launcher] == [(5, -6, 4242, True)]
    spaced = ["Root Cause (first observed failure):", "[0]:", "  time      : 2024-01-01_00:00:00",
              "  rank      : 3 (local_rank: 3)", "  exitcode  : -9 (pid: 77)", "  error_file: <N/A>"]
    parsed = parse_lines(spaced)
    assert [(f.rank, f.exitcode, f.pid) for f in parsed.launcher] == [(3, -9, 77)]


def test_monitored_barrier_names_the_rank_that_did_not_arrive() -> None:
    """monitored_barrier's own words (ProcessGroupGloo.cpp): rank 0 names the ranks it did not
    hear from (one or several); that beats the other ranks pointing at rank 0."""
    lines = ["[rank0]: RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 5000 ms",
             "[rank2]: RuntimeError: Rank 2 successfully reached monitoredBarrier, but received "
             "errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank."]
    report = analyze(parse_lines(lines))
    assert report.verdict is not None and report.verdict.code == "log-monitored-barrier"
    assert report.culprits == [1, 3] and "Confidence: high" in report.verdict.detail
    one = analyze(parse_lines(["[rank0]: RuntimeError: [Rank 0]: Rank 2 failed to pass "
                               "monitoredBarrier in 1000 ms", " Original exception: ", "x"]))
    assert one.culprits == [2]
