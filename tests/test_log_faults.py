"""mldebug log on the fault matrix's real logs (benchmarks/faults/job.py under torchrun, 4 ranks,
torch 2.13, gloo; tests/fixtures/log/faults/CLASS.log, one per class): each verdict's code and
culprits, and what it says where the evidence cannot tell."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldebug.log.analyze import analyze
from mldebug.log.collect import load
from mldebug.log.model import LogReport
from mldebug.log.parse import parse_lines

FIX = Path(__file__).parent / "fixtures" / "log" / "faults"

# class -> (code, culprits); the culprit is the rank job.py injected the fault on, [] where the
# class has none or where these lines cannot tell (said in the verdict, tested below)
CASES = {
    # desyncs: the call sites of each rank's own timeout traceback, the minority
    "skip-collective": ("log-collective-mismatch", [3]),
    "extra-collective": ("log-collective-mismatch", [2]),
    "reordered-collectives": ("log-collective-mismatch", [2]),
    "other-op": ("log-collective-mismatch", [1]),
    "p2p-wrong-peer": ("log-collective-mismatch", [0]),
    "fsdp2-skip-backward": ("log-collective-mismatch", [3]),
    "nan-branch": ("log-collective-mismatch", [3]),
    "uneven-last-batch": ("log-collective-mismatch", [3]),
    "wrong-broadcast-src": ("log-collective-mismatch", []),  # 2 against 2: cannot tell
    # gloo's size check: the ring (each rank receives from rank+1)
    "shape-mismatch": ("log-size-mismatch", [1]),
    "dtype-mismatch": ("log-size-mismatch", []),  # one abort: rank 2 or its sender 3
    "ddp-skip-backward": ("log-size-mismatch", [3]),
    # outside any collective: the rank with no timeout of its own
    "thread-lock": ("log-silent-rank", [2]),
    "busy-python": ("log-silent-rank", [3]),
    "input-prompt": ("log-silent-rank", [1]),
    "sigstop": ("log-silent-rank", [0]),  # SIGKILLed by torchrun after SIGTERM: not OOM
    "gil-hold": ("log-silent-rank", [3]),
    # launch
    "world-size-hardcoded": ("log-launch", []),
    "master-port-mismatch": ("log-launch", [2]),
    "rank-never-started": ("log-launch", [3]),
    "rendezvous-timeout": ("log-launch", []),
    "dist-store-error": ("log-launch", []),  # every rank waits for every key: cannot tell
    # processes
    "dataloader-crash": ("log-first-failure-exception", [3]),
    "thread-exception-hook": ("log-first-failure-exception", [3]),
    "exit0": ("log-exit-no-traceback", [1]),
    "sigkill": ("log-killed", [3]),
    "sigsegv": ("log-crash", [2]),
    "scheduler-sigterm": ("log-terminated", []),
}


def report(name: str) -> LogReport:
    return analyze(load([str(FIX / f"{name}.log")]))


def test_every_fixture_is_in_the_table() -> None:
    on_disk = {p.stem for p in FIX.glob("*.log")}
    assert on_disk == set(CASES) | {"subgroup-skip"}
    readme = (FIX / "README.md").read_text()
    for name in on_disk:
        assert f"| {name}.log |" in readme, name


ENGINES = [{"prefilter": True}, {"grep_min": 0}]


@pytest.mark.parametrize("kw", ENGINES, ids=["regex-prefilter", "grep-prefilter"])
def test_prefilter_reads_the_matrix_logs_like_every_line(kw: dict[str, object]) -> None:
    """The prefiltered read (Python's passes, or grep) gives the verdict, culprits and each
    rank's first error and wait site of a read that parses every line."""
    for f in sorted(FIX.glob("*.log")):
        full = analyze(load([str(f)], prefilter=False))
        fast = analyze(load([str(f)], **kw))  # type: ignore[arg-type]
        assert fast.culprits == full.culprits, f
        assert (fast.verdict and fast.verdict.code) == (full.verdict and full.verdict.code), f
        assert {r: (s.first_primary and s.first_primary.message, s.wait_site and s.wait_site.frame)
                for r, s in fast.parsed.ranks.items()} == \
            {r: (s.first_primary and s.first_primary.message, s.wait_site and s.wait_site.frame)
             for r, s in full.parsed.ranks.items()}, f


@pytest.mark.parametrize("name", sorted(CASES))
def test_matrix_log_gets_the_right_verdict(name: str) -> None:
    code, culprits = CASES[name]
    r = report(name)
    assert r.verdict is not None, name
    assert (r.verdict.code, r.culprits) == (code, culprits), r.verdict
    assert r.verdict.fix
    assert "Confidence:" in r.verdict.detail


def test_call_sites_name_each_group_and_the_rank_out_of_step() -> None:
    r = report("skip-collective")
    assert r.verdict is not None
    assert "broadcast at job.py:242 in sync_manual" in r.verdict.title
    assert "ranks 0-2 in all_reduce at job.py:253 in sync_manual" in r.verdict.detail
    assert "Confidence: high" in r.verdict.detail
    # three sites: the rank still at a line every other rank passed, not the root waiting for it
    r = report("extra-collective")
    assert r.verdict is not None
    assert "every other rank passed" in r.verdict.detail and "Confidence: medium" in r.verdict.detail


def test_a_tie_of_call_sites_says_it_cannot_tell_and_what_would() -> None:
    r = report("wrong-broadcast-src")
    assert r.verdict is not None
    assert "cannot tell" in r.verdict.title and "0,2 vs 1,3" in r.verdict.title
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in r.verdict.detail
    assert "mldebug fr analyze" in r.verdict.fix  # the dumps the job's ranks wrote
    assert "Ranks 0,2 all wait to send in the same broadcast" in r.verdict.detail
    assert "Confidence: low" in r.verdict.detail


def test_gloo_size_mismatch_does_not_blame_the_neighbour_gloo_aborted() -> None:
    r = report("dtype-mismatch")  # rank 2 aborted: 2632 bytes (float64) for its 1316
    assert r.verdict is not None
    assert "rank 2 or rank 3" in r.verdict.title
    assert "What would tell" in r.verdict.detail
    r = report("shape-mismatch")  # ranks 0 and 1 aborted: their common suspect is rank 1
    assert r.verdict is not None and r.culprits == [1]
    assert "rank+1" in r.verdict.detail
    for f in r.findings:  # a gloo job: no NCCL source, no NCCL advice
        assert "NCCL" not in f.detail + f.fix, f


def test_gloo_all_waiting_gives_no_nccl_advice() -> None:
    lines = [f"[rank{r}]: {s}" for r in range(2) for s in (
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 9, in step',
        "    dist.all_reduce(g)",
        '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce',
        "    work.wait()",
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
        " Timed out waiting 12000ms for recv operation to complete")]
    r = analyze(parse_lines(lines))
    assert r.verdict is not None and r.verdict.code == "log-all-waiting"
    assert "all_reduce at train.py:9 in step" in r.verdict.title
    assert "NCCL" not in r.verdict.fix


def test_one_ranks_lines_do_not_claim_every_rank() -> None:
    """A paste of rank 3's lines alone: it waited; whether the others did is not in them."""
    text = (FIX / "skip-collective.log").read_text().splitlines()
    r = analyze(parse_lines([ln for ln in text if ln.startswith("[rank3]:")]))
    assert r.verdict is not None
    assert "every rank" not in r.verdict.title
    assert "rank 3" in r.verdict.title and r.culprits == []
    assert "Confidence: low" in r.verdict.detail


def test_dataloader_worker_frame_is_the_original_traceback() -> None:
    r = report("dataloader-crash")
    ev = r.parsed.ranks[3].first_primary
    assert ev is not None
    assert ev.frame == "job.py:233 in __getitem__"  # the worker's, not batches()' next(it)
    assert ev.message.startswith("ValueError: corrupt record 8")
    assert "DataLoader worker process 0" in ev.message


def test_a_thread_exception_printed_by_our_hook_blames_its_rank() -> None:
    """mldebug.install_excepthook prints a thread's traceback '[host:rank] '-prefixed (no
    torchrun prefix): read, its rank blamed, said to be a thread's."""
    r = report("thread-exception-hook")
    ev = r.parsed.ranks[3].first_primary
    assert ev is not None and ev.frame == "thread_hook.py:18 in producer"
    assert ev.message.endswith("(in a thread)")
    named = analyze(parse_lines(["[rank1]: Exception in thread prefetch:",
                                 "[rank1]: Traceback (most recent call last):",
                                 '[rank1]:   File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
                                 '[rank1]:   File "/w/t.py", line 3, in producer',
                                 "[rank1]: KeyError: 'tokens'"]))
    assert named.culprits == [1] and named.verdict is not None
    assert "(in thread prefetch)" in named.verdict.title


def test_exit0_names_the_rank_that_left_alone() -> None:
    r = report("exit0")
    assert r.verdict is not None and r.culprits == [1]
    assert "exit code 0" in r.verdict.title
    assert "failure table" in r.verdict.detail
    assert "Ranks 0,2 saw the connection closed by the peer" in r.verdict.detail


def test_scheduler_sigterm_blames_no_rank() -> None:
    r = report("scheduler-sigterm")
    assert r.verdict is not None and r.culprits == []
    assert "terminated from outside" in r.verdict.title and "SIGTERM" in r.verdict.title
    assert "sacct" in r.verdict.fix


def test_a_rank_that_outlived_sigterm_is_not_oom_killed() -> None:
    for name in ("sigstop", "gil-hold"):
        r = report(name)
        assert r.verdict is not None
        assert "SIGTERM" in r.verdict.title and "OOM" not in r.verdict.fix, name
    assert report("sigstop").parsed.unkillable


def test_launch_verdicts_say_who_never_arrived() -> None:
    r = report("world-size-hardcoded")
    assert r.verdict is not None and "rank 4" in r.verdict.title and "ranks 0-3" in r.verdict.title
    r = report("master-port-mismatch")
    assert r.verdict is not None and "/default_pg/0//cpu//0/2" in r.verdict.detail
    r = report("rank-never-started")
    assert r.verdict is not None and "3/4 clients joined" in r.verdict.detail
    r = report("dist-store-error")
    assert r.verdict is not None and "cannot tell" in r.verdict.detail
    assert "store.check" in r.verdict.detail


def test_store_waits_of_ranks_that_failed_at_once_still_name_the_missing_rank(tmp_path) -> None:
    """Ranks that time out at the same instant interleave their tracebacks' last lines: one
    line carries two DistStoreError messages, a key cut where the other began (the quick
    subset in CI read '4 store keys ... cannot tell' from such a log). Each message's keys
    are its own (mldebug.log.parse.store_keys): the second message on a line starts a new
    list, so the first one's cut key is not read as a key."""
    text = (FIX / "master-port-mismatch.log").read_text()
    msg = "torch.distributed.DistStoreError: wait timeout after 12000ms, keys: /default_pg/0//cpu//0/2"
    assert text.count(msg + "\n") >= 3
    cut = msg.rindex("cpu/") + 4
    # the first writer's line stops after 'cpu/', the second's comes whole, then the rest
    mixed = text.replace(msg + "\n", msg[:cut] + msg + "\n" + msg[cut:] + "\n", 1)
    # and another pair wrote one whole message right after the other on a line
    mixed = mixed.replace(msg + "\n", msg + msg + "\n", 1)
    assert mixed != text
    log = tmp_path / "mixed.log"
    log.write_text(mixed)
    r = analyze(load([str(log)]))
    assert r.verdict is not None and r.culprits == [2], (r.culprits, r.verdict.title)
    assert "rank 2 never registered" in r.verdict.title


def test_mldebug_fr_lines_give_their_rank() -> None:
    """Before init the launcher prefixes nothing: mldebug.fr's 'rank N wrote' line names it."""
    r = report("rank-never-started")
    assert sorted(r.parsed.ranks) == [0, 1, 2]


def test_a_prompt_without_newline_does_not_hide_the_next_ranks_traceback() -> None:
    lines = [
        "Overwrite existing checkpoint? [y/N] [rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/w/train.py", line 9, in step',
        '[rank0]:   File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce',
        "[rank0]: RuntimeError: Timed out waiting 12000ms for recv operation to complete",
        "[rank2]: 40%|####      | 4/10\r[rank2]: Traceback (most recent call last):",
        '[rank2]:   File "/w/train.py", line 9, in step',
        '[rank2]:   File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce',
        "[rank2]: RuntimeError: Timed out waiting 12000ms for recv operation to complete",
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "/w/train.py", line 9, in step',
        '[rank3]:   File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce',
        "[rank3]: RuntimeError: Timed out waiting 12000ms for recv operation to complete",
        "[rank1]: step 3",
    ]
    r = analyze(parse_lines(lines))
    assert {0, 2, 3} <= {x for x, st in r.parsed.ranks.items() if st.wait_site is not None}
    assert r.verdict is not None and r.verdict.code == "log-silent-rank" and r.culprits == [1]
    # stacked prefixes are no glued line: pdsh's host stays the line's
    stacked = parse_lines(["node7: [rank5]: Traceback (most recent call last):",
                           'node7: [rank5]:   File "/w/t.py", line 3, in f',
                           "node7: [rank5]: ValueError: x"])
    assert stacked.ranks[5].host == "node7" and stacked.ranks[5].first_primary is not None
    # and in the real job's log, the prompt glued to rank 0's mldebug.fr line
    fr = [ranks for cmd, ranks in report("input-prompt").parsed.evidence.items() if "fr_rank0" in cmd]
    assert fr == [[0]]


def test_subgroup_skip_names_only_what_the_lines_show() -> None:
    """The culprit (rank 3) waits in the world all_reduce beside ranks 0 and 1; its pair partner
    (rank 2), SIGTERMed before its own timeout, left no line: these lines name rank 2. The
    verdict says the partner only 'reported neither an error nor a timeout' (what the log shows)."""
    r = report("subgroup-skip")
    assert r.verdict is not None and r.culprits == [2]
    assert "reported neither an error nor a timeout" in r.verdict.detail


def test_every_rank_waiting_without_a_world_size_says_a_silent_rank_would_be_missed() -> None:
    """busy_python's ranks 0-2 timed out while rank 3 spun; with rank 3's lines and every line
    stating the world size gone (a pooled case's start-up lines once landed in the case
    before), the lines show 3 ranks all waiting: the verdict must say that a rank that printed
    nothing is not seen, at low confidence, and --world-size names it."""
    text = (FIX / "busy-python.log").read_text().splitlines()
    lines = [ln for ln in text if ln.startswith(("[rank0]:", "[rank1]:", "[rank2]:"))
             and "world" not in ln.lower()]
    r = analyze(parse_lines(lines))
    assert r.verdict is not None and r.verdict.code == "log-all-waiting"
    assert "No line states the world size" in r.verdict.detail
    assert "pass --world-size N to tell." in r.verdict.detail
    assert r.verdict.detail.endswith("Confidence: low.")
    parsed = parse_lines(lines)
    parsed.world_size = 4
    r = analyze(parsed)
    assert r.culprits == [3], r.verdict
