"""Hang analysis on fixtures: real saved dumps, pasted py-spy text, and synthetic sets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mldebug.hang.analyze import analyze
from mldebug.hang.collect import load
from mldebug.hang.frames import collective_of, frame_kind
from mldebug.hang.model import Collection, Process, StackFrame, Thread
from mldebug.hang.pyspy import parse_text_dump

FIX = Path(__file__).parent / "fixtures" / "hang"
RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "collective_mismatch.py"
EXTRA_LINE = next(i for i, line in enumerate(RECIPE.read_text().splitlines(), 1) if "# extra" in line)

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def tf(name: str, line: int) -> StackFrame:
    return StackFrame(name, C10D, line, "torch/distributed/distributed_c10d.py")


def uf(name: str, line: int, file: str = "/home/u/train.py", **locals_: str) -> StackFrame:
    return StackFrame(name, file, line, Path(file).name, locals=tuple(locals_.items()))


def proc(rank: int, frames: list[StackFrame], host: str = "node1", world: int = 4, lws: int = 4,
         node_rank: int | None = None, later: list[StackFrame] | None = None) -> Process:
    p = Process(host=host, pid=1000 + rank, rank=rank, local_rank=rank % lws, world_size=world,
                local_world_size=lws, node_rank=node_rank, launcher="torchrun", run_id="r1",
                threads=[Thread("MainThread", os_thread_id=1000 + rank, frames=frames)])
    if later is not None:
        p.threads_later = [Thread("MainThread", os_thread_id=1000 + rank, frames=later)]
    return p


ALLREDUCE = [tf("all_reduce", 3252), uf("step", 40), uf("main", 60)]
BARRIER = [tf("barrier", 5356), uf("main", 61)]


def test_saved_real_dumps_name_rank0_at_the_extra_all_reduce():
    report = analyze(load([str(FIX / "collective_mismatch")]))
    assert [s.rank for s in report.suspects] == [0]
    assert report.suspects[0].call_site == f"collective_mismatch.py:{EXTRA_LINE} in buggy"
    assert report.verdict_kind == "suspects"
    big = report.groups[0]
    assert big.ranks == [1, 2, 3] and big.collective == "barrier"
    assert report.groups[1].collective == "all_reduce"
    assert report.missing_ranks == []
    d = report.to_dict()
    for key in ("processes", "groups", "suspects", "missing_ranks", "errors"):
        assert key in d
    assert d["suspects"][0]["rank"] == 0


def test_pasted_pdsh_text_gives_the_same_culprit_with_hosts():
    procs = parse_text_dump((FIX / "pdsh_pyspy_dump.txt").read_text())
    assert len(procs) == 4
    assert {p.host for p in procs} == {"gpu-node5", "gpu-node8"}
    report = analyze(Collection(processes=procs))
    assert len(report.suspects) == 1
    s = report.suspects[0]
    assert s.host == "gpu-node5" and s.call_site == f"collective_mismatch.py:{EXTRA_LINE} in buggy"


def test_text_dump_with_locals_and_native_frames():
    text = """Process 77: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 0x7F6D3C29D740 (active+gil): "MainThread"
    pthread_cond_wait (libc.so.6)
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    step (train.py:40)
        Arguments:
            i: 3
            t: <Tensor at 0x7f>
    main (train.py:60)
Thread 0x7F6CF5FFB700 (idle): "Thread-1"
    wait (threading.py:312)
"""
    (p,) = parse_text_dump(text)
    assert p.pid == 77 and [t.name for t in p.threads] == ["MainThread", "Thread-1"]
    frames = p.threads[0].frames
    assert frames[0].native and frames[0].name == "pthread_cond_wait"
    assert frames[2].locals == (("i", "3"), ("t", "<Tensor at 0x7f>"))
    assert collective_of(frames) == "all_reduce"
    assert p.threads[0].active is True
    assert frame_kind(p.threads[1].frames[0]) == "library"


def test_rank_outside_any_collective_is_the_suspect():
    procs = [proc(r, ALLREDUCE) for r in (0, 1, 3)] + [proc(2, [uf("load_batch", 12), uf("main", 59)])]
    report = analyze(Collection(processes=procs))
    assert [s.rank for s in report.suspects] == [2]
    assert "not in any collective" in report.suspects[0].reason
    assert report.suspects[0].call_site == "train.py:12 in load_batch"


def test_minority_in_a_different_collective_and_code_loops_note():
    procs = [proc(r, ALLREDUCE) for r in range(3)] + [proc(3, [tf("broadcast", 3151), uf("step", 41), uf("main", 60)])]
    report = analyze(Collection(processes=procs))
    assert [s.rank for s in report.suspects] == [3]
    assert "same function, different line" in report.suspects[0].reason


def test_equal_split_is_ambiguous_not_guessed():
    procs = [proc(r, ALLREDUCE) for r in (0, 1)] + [proc(r, BARRIER) for r in (2, 3)]
    report = analyze(Collection(processes=procs))
    assert report.verdict_kind == "ambiguous" and report.suspects == []
    assert "No majority" in report.verdict


def test_all_in_one_place_says_so_and_points_below_python():
    report = analyze(Collection(processes=[proc(r, ALLREDUCE) for r in range(4)]))
    assert report.verdict_kind == "same-place" and report.suspects == []
    assert any("mldebug fr" in h.fix for h in report.hints)


def test_same_call_site_different_iterations_split_by_locals_ignoring_rank():
    def frames(step: str, rank: int) -> list[StackFrame]:
        return [tf("broadcast", 3151), uf("sync", 24, step=step, rank=str(rank)), uf("main", 30)]

    procs = [proc(0, frames("1", 0))] + [proc(r, frames("0", r)) for r in (1, 2, 3)]
    report = analyze(Collection(processes=procs))
    assert [s.rank for s in report.suspects] == [0]
    assert "different iterations" in report.suspects[0].reason
    assert report.groups[0].locals_key == (("step", "0"),)


def test_missing_rank_named_with_its_expected_node():
    procs = [proc(r, BARRIER, host="node1" if r < 4 else "node2", world=8, node_rank=r // 4)
             for r in range(8) if r != 6]
    report = analyze(Collection(processes=procs))
    assert report.missing_ranks == [6]
    assert report.missing_hosts == {6: "node2"}
    assert "Rank 6 of 8 is missing (expected on node2)" in report.verdict
    assert report.to_dict()["missing"] == [{"rank": 6, "expected_host": "node2"}]


def test_watch_marks_stuck_and_moving():
    moving = [uf("compute", 10), uf("main", 59)]
    procs = [proc(r, ALLREDUCE, later=ALLREDUCE) for r in range(3)]
    procs.append(proc(3, moving, later=[uf("compute", 11), uf("main", 59)]))
    report = analyze(Collection(processes=procs, watch=2.0))
    states = {tuple(g.ranks): g.state for g in report.groups}
    assert states == {(0, 1, 2): "stuck", (3,): "moving"}
    assert any("slow, not stuck" in h.title for h in report.hints)


def test_watch_progress_names_the_slowest_from_the_second_dump_when_the_first_had_all_waiting():
    """A slow rank arrives at the all_reduce just as the first dump is taken: every rank
    waits in it there. --watch's second dump finds it back in its slow data source while
    the others wait: it is named the slowest, never a suspect."""
    later = [tf("all_reduce", 3252), uf("step", 41), uf("main", 60)]
    slow = [uf("slow_source", 21), uf("main", 59)]
    procs = [proc(r, ALLREDUCE, later=later) for r in range(3)]
    procs.append(proc(3, ALLREDUCE, later=slow))
    report = analyze(Collection(processes=procs, watch=3.0))
    assert report.suspects == [] and report.verdict_kind == "progress"
    assert ("At the second dump rank 3 was outside the collective the others waited in "
            "(at train.py:21 in slow_source): the slowest, not stuck.") in report.verdict
    # no rank elsewhere at either dump: nobody is called the slowest
    procs = [proc(r, ALLREDUCE, later=later) for r in range(4)]
    report = analyze(Collection(processes=procs, watch=3.0))
    assert report.verdict_kind == "progress" and "slowest" not in report.verdict


def test_no_processes_is_reported_with_errors_kept():
    from mldebug.hang.model import CollectError

    report = analyze(Collection(errors=[CollectError("node9", None, "unreachable")]))
    assert report.verdict_kind == "no-processes"
    assert report.to_dict()["errors"] == [{"host": "node9", "pid": None, "error": "unreachable"}]


def test_native_wait_does_not_hide_the_python_collective():
    frames = [StackFrame("c10d::Work::wait", "/x/libtorch_cpu.so", 0, "libtorch_cpu.so", native=True),
              *ALLREDUCE]
    assert collective_of(frames) == "all_reduce"
    async_wait = [StackFrame("c10d::Work::wait", "/x/libtorch_cpu.so", 0, "libtorch_cpu.so", native=True),
                  uf("step", 50)]
    assert collective_of(async_wait) == "wait"


@pytest.mark.parametrize("frame,kind", [
    (StackFrame("f", "/usr/lib/python3.11/threading.py", 3, "threading.py"), "library"),
    (StackFrame("f", "/venv/lib/python3.11/site-packages/deepspeed/x.py", 3, "deepspeed/x.py"), "library"),
    (StackFrame("f", "/home/u/proj/train.py", 3, "train.py"), "user"),
    (StackFrame("f", "<string>", 1, "<string>"), "user"),
    (StackFrame("all_reduce", C10D, 1, "torch/distributed/distributed_c10d.py"), "torch"),
    (StackFrame("threading.py", "threading.py", 3, "threading.py"), "library"),
])
def test_frame_kinds(frame, kind):
    assert frame_kind(frame) == kind


def test_4096_rank_synthetic_set():
    world, bad = 4096, 1234
    procs = []
    for r in range(world):
        if r == 17:
            continue  # missing
        frames = [uf("load_batch", 12), uf("main", 59)] if r == bad else ALLREDUCE
        procs.append(proc(r, frames, host=f"node{r // 8}", world=world, lws=8, node_rank=r // 8))
    t = time.perf_counter()
    report = analyze(Collection(processes=procs))
    elapsed = time.perf_counter() - t
    assert [s.rank for s in report.suspects] == [bad]
    assert report.suspects[0].host == "node154"
    assert report.missing_ranks == [17] and report.missing_hosts[17] == "node2"
    assert len(report.groups) == 2 and len(report.groups[0].ranks) == world - 2
    assert elapsed < 30  # sanity only; the timing claim lives in benchmarks/bench_hang.py


def test_a_stopped_rank_is_alive_and_unreadable_not_exited():
    """A SIGSTOPped (or traced) rank has a process but no stacks: the report says so and how
    to resume it, never that it exited (#24)."""
    procs = [proc(r, BARRIER) for r in range(4) if r != 2]
    why = ("py-spy could not attach to pid 1002: the process is stopped (State T (stopped)), "
           "by SIGSTOP or a job-control stop. Resume it with kill -CONT 1002")
    report = analyze(Collection(processes=procs, undumped={("run:r1", 2): why}))
    assert "Rank 2 of 4 is alive" in report.verdict and "missing" not in report.verdict
    titles = {h.code: h for h in report.hints}
    assert "rank-exited" not in titles and "rank-not-started" not in titles
    assert "kill -CONT 1002" in titles["rank-unreadable"].detail
    assert report.to_dict()["jobs"][0]["verdict"]["class"] != "dead-rank"


def test_a_stopped_rank_is_recorded_from_the_node_document():
    from mldebug.fanout import NodeResult
    from mldebug.hang.collect import collection_from_results

    doc = {"host": "node1", "processes": [
        {"pid": 1002, "ppid": 1, "cmdline": ["python", "t.py"], "dump": None,
         "error": "py-spy could not attach to pid 1002: the process is stopped",
         "identity": {"rank": 2, "world_size": 4, "run_id": "r1", "launcher": "torchrun"},
         "job": {"key": "run:r1", "launcher": "torchrun", "lone": False}}], "errors": []}
    coll = collection_from_results([NodeResult("node1", data=doc)])
    assert coll.undumped == {("run:r1", 2): "pid 1002 on node1: py-spy could not attach to "
                                            "pid 1002: the process is stopped"}


def test_a_rank_that_exited_during_the_dump_is_gone_not_unreadable():
    """exit0 in the fault matrix: the culprit called exit(0) and was in its teardown (or a
    zombie) when py-spy came; the others raise "Connection closed by peer". The rank is gone,
    and the raising ranks are reacting to it - not suspects, and not "alive but unreadable"."""
    from mldebug.fanout import NodeResult
    from mldebug.hang.collect import collection_from_results

    def entry(r: int, **kw) -> dict:
        return {"pid": 1000 + r, "ppid": 1, "cmdline": ["python", "t.py"],
                "identity": {"rank": r, "world_size": 4, "run_id": "r1", "launcher": "torchrun"},
                "job": {"key": "run:r1", "launcher": "torchrun", "lone": False}, **kw}

    for why, samples in (("process 1001 exited during the dump (State Z (zombie))", []),
                         ("py-spy failed on pid 1001 (exit code 1): Error: No such file",
                          [{"t": 1.0, "state": "Z", "ticks": 5}])):
        doc = {"host": "node1", "errors": [], "processes": [
            entry(1, dump=None, error=why, samples=samples)]}
        coll = collection_from_results([NodeResult("node1", data=doc)])
        assert coll.undumped == {}, why
    procs = [proc(r, BARRIER) for r in range(4) if r != 1]
    report = analyze(Collection(processes=procs))
    assert "missing" in report.verdict and "alive" not in report.verdict


def test_a_node_answering_under_another_name_is_not_dead():
    """`--nodes 10.0.0.[1-2]` or ssh aliases: the node's own host name differs from the name
    asked. Its answer is filed under the name asked, the difference is noted, and the node
    is never counted among the hosts that did not answer."""
    from mldebug.fanout import NodeResult
    from mldebug.hang.collect import collection_from_results

    docs = [NodeResult(h, data={"host": "gpu-node-7", "processes": [], "errors": []})
            for h in ("10.0.0.1", "10.0.0.2")]
    coll = collection_from_results(docs)
    coll.hosts = ["10.0.0.1", "10.0.0.2"]
    rep = analyze(coll).to_dict()
    assert not rep.get("dead_hosts"), rep
    assert any("answered as host" in e["error"] and e["host"] == "10.0.0.1"
               for e in rep["notes"])  # a note on the collection, never an error
    assert not any("answered as host" in e["error"] for e in rep["errors"])


# -- the fault matrix's real node documents (tests/fixtures/hang/faults, see its README) --
FAULTS = FIX / "faults"


def fault_collection(name: str, *, first_dump_only: bool = False) -> Collection:
    import json

    from mldebug.fanout import NodeResult
    from mldebug.hang.collect import collection_from_results

    doc = json.loads((FAULTS / f"{name}.json").read_text())
    if first_dump_only:  # as the node answered before the re-check existed
        for p in doc["processes"]:
            p.update(dump_later=None, recheck=None, samples=p["samples"][:2])
    return collection_from_results([NodeResult(doc["host"], data=doc)])


@pytest.mark.parametrize("name", ["healthy", "healthy_dataloader", "healthy_ddp",
                                  "slow_straggler"])
def test_matrix_a_training_job_is_progress_after_the_recheck_not_a_suspect(name):
    """Ranks between steps stand at different places in one snapshot; the re-check's second
    dump shows every rank moved, so the verdict is progress with no suspect."""
    first = analyze(fault_collection(name, first_dump_only=True))
    assert first.suspects, "the first dump alone names someone: the re-check decides"
    report = analyze(fault_collection(name))
    assert report.suspects == [] and report.verdict_kind == "progress"
    assert report.jobs[0].hang_class.value == "slow"
    assert "0.5s apart" in report.verdict and "nothing is stuck" in report.verdict
    assert {g.state for g in report.groups} == {"moving"}
    assert not any(h.code.startswith("wait-") for h in report.hints)  # nothing waits


def test_matrix_a_training_job_caught_in_one_collective_is_progress_not_the_network():
    """A job whose step is one all_reduce is found with every rank in it at most instants:
    one snapshot would blame the network (collective idle); the re-check's dump shows every
    rank moved, so the verdict is progress with no suspect."""
    first = analyze(fault_collection("healthy_one_collective", first_dump_only=True))
    assert first.suspects == [] and first.jobs[0].hang_class.value in (
        "same-collective", "collective-idle"), "the first dump alone blames what is below"
    report = analyze(fault_collection("healthy_one_collective"))
    assert report.suspects == [] and report.verdict_kind == "progress"
    assert report.jobs[0].hang_class.value == "slow"
    assert "every rank in one place" in report.verdict and "nothing is stuck" in report.verdict


@pytest.mark.parametrize("name,culprit,cls,wait,needle", [
    ("flock", 1, "blocked", "file-lock", "flock on "),
    ("thread_lock", 2, "blocked", "lock", "a futex"),
    ("gil_hold", 3, "blocked", "lock", "a futex"),
    ("queue_dead_producer", 0, "blocked", "queue", "Queue.get"),
    ("dataloader_stuck", 2, "blocked", "dataloader", "_get_data"),
    ("fifo_read", 0, "blocked", "fifo-open", "open of a FIFO"),
    ("socket_read", 3, "blocked", "socket-read", "recvfrom on a socket"),
    ("input_prompt", 1, "blocked", "pipe-read", "read on a pipe"),
    ("busy_python", 3, "spinning", None, "spinning"),
    ("busy_forward", 1, "spinning", None, "spinning"),
    ("long_eval", 2, "spinning", None, "spinning"),
    ("long_checkpoint", 2, "blocked", "sleep", "clock_nanosleep"),
])
def test_matrix_a_rank_outside_the_collective_is_named_with_what_it_waits_in(
        name, culprit, cls, wait, needle):
    report = analyze(fault_collection(name))
    assert [s.rank for s in report.suspects] == [culprit]
    assert report.jobs[0].hang_class.value == cls
    assert needle in report.suspects[0].reason
    g = next(g for g in report.groups if culprit in g.ranks)
    assert g.wait == wait
    # the victims did not move in the re-check: they wait, they are no suspects
    assert {x.state for x in report.groups if culprit not in x.ranks} == {"stuck"}
    if wait is not None:
        assert any(h.code == f"wait-{wait}" for h in report.hints)


def test_matrix_flock_names_the_holder_of_the_lock():
    report = analyze(fault_collection("flock"))
    s = report.suspects[0]
    holder = report.processes[1].kernel
    assert holder is not None and holder.lock_holder
    assert f"held by pid {holder.lock_holder}" in s.reason and "ckpt-rank1.lock" in s.reason
    hint = next(h for h in report.hints if h.code == "wait-file-lock")
    assert f"held by pid {holder.lock_holder}" in hint.title
    rank1 = next(p for p in report.to_dict()["processes"] if p["rank"] == 1)
    assert rank1["kernel"]["syscall"] == "flock"
    assert rank1["kernel"]["lock"]["holder"] == holder.lock_holder and rank1["recheck"] == 0.5


def test_matrix_a_busy_suspect_is_said_busy_and_what_would_tell_slow_from_stuck():
    report = analyze(fault_collection("busy_python"))
    hint = next(h for h in report.hints if h.code == "recheck-suspect-busy")
    assert "Rank 3 kept running" in hint.title and "--watch 30" in hint.fix


@pytest.mark.parametrize("name,rank", [("busy_python", 3), ("long_eval", 2)])
def test_matrix_a_rank_looping_in_one_stack_is_spinning_not_stuck(name, rank):
    # the same stack at both dumps, but its CPU time grew in between: the groups table says
    # spinning, as the verdict does; the ranks asleep in the collective stay stuck
    from mldebug.hang.report import render_text

    report = analyze(fault_collection(name))
    assert report.jobs[0].hang_class.value == "spinning"
    states = {g["ranks"][0]: g["state"] for g in report.to_dict()["groups"]}
    assert states[rank] == "spinning" and set(states.values()) == {"stuck", "spinning"}, states
    assert f"Group 2: rank {rank}  on vm  - not in a collective  [spinning]" in render_text(report)


def test_every_rank_in_mldebug_breakpoint_is_a_pdb_session_not_a_fault():
    # real dumps of recipes/pdb_batch_rank.py (4 ranks, mldebug.breakpoint(rank=2) on every
    # rank, nobody connected): rank 2 sits in pdb, ranks 0,1,3 wait for it in the breakpoint
    report = analyze(load([str(FAULTS.parent / "pdb_all_ranks")]))
    v = report.verdict_finding
    assert report.jobs[0].hang_class.value == "debugger"
    assert "Rank 2 is in a pdb session at pdb_batch_rank.py:28 in step" in v.title, v.title
    assert "ranks 0-1,3 wait for it in mldebug.breakpoint" in v.title
    assert "only some ranks" not in v.title + v.fix
    assert "mldebug pdb connect 2" in v.fix


def test_signal_findings_never_name_more_ranks_than_the_header_counts():
    # a --signal node document whose one entry is malformed is refused as a whole: the header
    # counts 0 rank processes, and "ranks 0-3 answered through the Python route" was said too
    import json

    from mldebug.fanout import NodeResult
    from mldebug.hang.collect import collection_from_results
    from mldebug.hang.report import render_text
    from mldebug.hang.signal_report import signal_findings

    doc = json.loads((FAULTS / "busy_python.json").read_text())
    for p in doc["processes"]:
        p["route"] = "python"
    good = NodeResult(doc["host"], data=json.loads(json.dumps(doc)))
    doc["processes"][0]["identity"]["run_id"] = 5  # not a string: the node is refused
    bad = NodeResult(doc["host"], data=doc)
    for r, n, said in ((good, 4, ["ranks 0-3 answered through the Python route"]),
                       (bad, 0, [])):
        report = analyze(collection_from_results([r]))
        assert render_text(report).startswith(f"mldebug hang: {n} rank processes")
        held = {(p.host, p.pid) for p in report.processes}
        assert [f.title for f in signal_findings([r], held)] == said


def test_matrix_sigstop_rank_is_stopped_named_and_resumed_with_its_pid():
    coll = fault_collection("sigstop")
    ((_, r), (host, pid)), = coll.stopped.items()
    assert r == 0
    report = analyze(coll)
    assert [(s.rank, s.pid, s.activity) for s in report.suspects] == [(0, pid, "stopped")]
    assert report.jobs[0].hang_class.value == "stopped"
    assert report.verdict.startswith("Stopped rank: Rank 0 of 4 is alive")
    assert f"kill -CONT {pid}" in report.verdict_finding.fix
    assert "desync" not in report.to_dict()["verdict"]["class"]


def test_matrix_all_threads_text_shows_the_lock_holder_thread():
    from mldebug.hang.report import render_text

    text = render_text(analyze(fault_collection("thread_lock"), all_threads=True))
    assert "other threads of rank 2" in text
    assert "thread 'cache-refresher'" in text and "take_lock_held_by_thread.<locals>.holder" in text
    assert "of mldebug itself (mldebug-fr-signal, mldebug-fr-trigger) not shown" in text
    assert "cache-refresher" not in render_text(analyze(fault_collection("thread_lock")))


def test_matrix_a_rank_that_cannot_reach_the_store_is_named_in_start_up():
    """master_port_mismatch: rank 2 still connects to its (wrong) store while the others got
    there and wait for every rank in process-group creation."""
    report = analyze(fault_collection("master_port_mismatch"))
    assert [s.rank for s in report.suspects] == [2]
    assert report.jobs[0].hang_class.value == "launch"
    assert "still reaching the job's store" in report.suspects[0].reason
    assert "MASTER_PORT" in report.suspects[0].reason


@pytest.mark.parametrize("name,culprits", [("world_size_hardcoded", []),
                                           ("rank_never_started", [3])])
def test_matrix_start_up_that_never_completes_is_class_launch(name, culprits):
    report = analyze(fault_collection(name))
    assert [s.rank for s in report.suspects] == culprits
    assert report.jobs[0].hang_class.value == "launch"
    assert "init_process_group" in report.verdict_finding.fix
    if culprits:  # the missing rank is the suspect, with no process
        assert report.suspects[0].pid is None and "never started" in report.suspects[0].reason
        assert report.missing_ranks == culprits


def test_matrix_a_rank_exiting_is_the_dead_rank_not_the_ranks_reacting_to_it():
    """exit0: rank 1's interpreter runs no Python code any more (exiting) while ranks 0 and 2,
    whose gloo pair with it closed, are busy raising; rank 3 still waits."""
    first = analyze(fault_collection("exit0"))
    assert [s.rank for s in first.suspects] == [1]
    assert first.jobs[0].hang_class.value == "dead-rank"
    assert "it is exiting" in first.suspects[0].reason
    # a moment later rank 1's process is gone and ranks 0 and 2 raise (their exception hook
    # runs): the gone rank is named, not the ranks raising because of it
    coll = fault_collection("exit0")
    coll.processes = [p for p in coll.processes if p.rank != 1]
    later = analyze(coll)
    assert [(s.rank, s.pid) for s in later.suspects] == [(1, None)]
    assert later.jobs[0].hang_class.value == "dead-rank"


def test_matrix_every_rank_at_one_line_names_nobody():
    """dist_store_error: every rank waits in store.wait for a key rank 1 never set, at the
    same line: the stacks cannot tell the culprit, and the verdict does not guess."""
    report = analyze(fault_collection("dist_store_error"))
    assert report.suspects == [] and report.verdict_kind == "same-place"
    assert report.groups[0].wait == "poll"


def test_matrix_a_pipeline_stage_sending_to_the_wrong_peer_is_the_one_named():
    report = analyze(fault_collection("p2p_wrong_peer"))
    assert [s.rank for s in report.suspects] == [0]
    assert "in send" in report.suspects[0].reason and "wait in recv" in report.suspects[0].reason


def test_matrix_a_rank_in_its_exception_hook_is_raising_not_spinning():
    """thread_exception_hook (as the job injects it today: its import raises ImportError in
    the main thread): rank 3 runs torch's _distributed_excepthook at the top of its main
    thread, busy (the hook's flight-recorder dump imports torch._inductor) - it is raising
    and will exit, not spinning in the user's code."""
    report = analyze(fault_collection("thread_exception_hook"))
    assert [s.rank for s in report.suspects] == [3]
    assert report.jobs[0].hang_class.value == "exception"
    assert "_distributed_excepthook" in report.suspects[0].reason
    assert report.verdict.startswith("A rank is raising: ")


def test_the_sender_no_receiver_takes_is_named_not_the_ranks_past_it():
    """p2p_wrong_peer at 8 ranks: stage 3 sends to stage 5; stages 0-2 finished their part and
    wait in the step's all_reduce, 4-7 wait in recv. The recv majority must not make the
    all_reduce ranks suspects: the sender is the one no receiver takes."""
    send = [tf("send", 2400), uf("pipeline_step", 329), uf("main", 60)]
    recv = [tf("recv", 2450), uf("pipeline_step", 321), uf("main", 60)]
    reduce_ = [tf("all_reduce", 3252), uf("pipeline_step", 331), uf("main", 60)]
    procs = [proc(r, reduce_ if r < 3 else send if r == 3 else recv, world=8, lws=8)
             for r in range(8)]
    report = analyze(Collection(processes=procs))
    assert [s.rank for s in report.suspects] == [3]
    assert "a blocking send waits for its peer" in report.suspects[0].reason
    assert report.jobs[0].hang_class.value == "desync"
    # the rule is what names rank 3: without a send in the picture the minority answers
    procs[3] = proc(3, recv, world=8, lws=8)
    assert [s.rank for s in analyze(Collection(processes=procs)).suspects] == [0, 1, 2]


@pytest.mark.parametrize("name,passed", [("subgroup_skip", "Rank 2 waits"),
                                         ("extra_collective", "Ranks 0,2 wait")])
def test_matrix_a_rank_in_a_collective_the_majority_passed_is_said_undecidable(name, passed):
    """subgroup_skip (rank 3 skipped its pair's all_reduce, its partner 2 waits there) and
    extra_collective (rank 2's extra all_reduce matched out of order; rank 0 blocks in the
    broadcast it met): the majority stands further on in the same function, so the call the
    minority waits in completed without it. The stacks cannot tell the culprit: said, with
    the flight recorder as what tells."""
    report = analyze(fault_collection(name))
    hint = next(h for h in report.hints if h.code == "passed-collective")
    assert hint.title.startswith(passed) and "cannot be told" in hint.title
    assert "subgroup collective" in hint.detail and "mldebug hang --fr" in hint.fix
    for other in ("p2p_wrong_peer", "flock", "healthy"):
        assert not any(h.code == "passed-collective" for h in analyze(fault_collection(other)).hints)


@pytest.mark.parametrize("name,culprits,victims", [("subgroup_skip", [3], "rank 2 only waits"),
                                                   ("extra_collective", [2], "rank 0 only waits")])
def test_matrix_the_flight_recorder_settles_what_the_stacks_cannot(name, culprits, victims):
    """The same classes with the ranks' flight-recorder dumps (real gloo dumps of the matrix's
    jobs at seed 0, tests/fixtures/hang/faults/fr/): the recorder knows each collective's
    group and sequence number, so its culprits become the suspects and the waiting ranks are
    said to be victims."""
    from mldebug.fr.analyze import analyze as fr_analyze
    from mldebug.fr.loader import load_files
    from mldebug.hang.flight import needs_fr, settle

    report = analyze(fault_collection(name))
    assert needs_fr(report) and [s.rank for s in report.suspects] != culprits
    fr = fr_analyze(load_files(sorted((FAULTS / "fr" / name).glob("fr_rank*"))))
    assert settle(report, fr)
    assert [s.rank for s in report.suspects] == culprits
    assert all(s.reason.startswith("the flight recorder: ") for s in report.suspects)
    doc = report.to_dict()
    assert doc["verdict"]["class"] == "desync" and doc["verdict"]["kind"] == "suspects"
    assert "told by the flight recorder" in report.verdict and victims in report.verdict
    assert [s["rank"] for s in doc["jobs"][0]["suspects"]] == culprits
    codes = [f.code for f in report.findings]
    assert "passed-collective" not in codes and "fr-settled" in codes
    assert report.findings[0] is report.jobs[0].verdict


def test_a_flight_recorder_naming_no_rank_of_the_job_changes_nothing():
    from types import SimpleNamespace

    from mldebug.hang.flight import settle

    for culprits in ([], [99]):  # no culprit; a rank of another job's dump
        report = analyze(fault_collection("subgroup_skip"))
        before = report.to_dict()
        fr = SimpleNamespace(mismatches=[SimpleNamespace(culprit_ranks=culprits)])
        assert not settle(report, fr)
        assert report.to_dict() == before
    report = analyze(fault_collection("healthy"))  # nothing left open: never consulted
    fr = SimpleNamespace(mismatches=[SimpleNamespace(culprit_ranks=[1])])
    assert not settle(report, fr) and report.suspects == []
