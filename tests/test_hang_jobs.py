"""Hang analysis in the field: several jobs, lone processes, pasted dumps, scale, the report
that stays one screen, the JSON schema, --out reuse and malformed node documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hang_analyze import ALLREDUCE, BARRIER, proc, tf, uf

from mldebug.cli import main
from mldebug.errors import UsageError
from mldebug.fanout import NodeResult
from mldebug.hang.analyze import analyze
from mldebug.hang.collect import collection_from_results, prepare_out
from mldebug.hang.model import Collection, Process, StackFrame, Thread, VerdictKind
from mldebug.hang.pyspy import parse_text_dump
from mldebug.hang.report import render_text, short_name

FIX = Path(__file__).parent / "fixtures" / "hang"


def job_proc(key: str, rank: int, frames: list[StackFrame], world: int, host: str = "node1",
             pid: int = 0) -> Process:
    p = proc(rank, frames, host=host, world=world)
    p.pid = pid or p.pid
    p.job, p.job_launcher, p.run_id = key, "torchrun", None
    return p


def test_two_jobs_on_one_node_get_one_verdict_each_never_mixed():
    # a 4-rank training job with rank 2 outside the collective, and a 2-rank eval job where
    # both ranks wait in a barrier; both have a "rank 0"
    train = [job_proc("run:train", r, ALLREDUCE if r != 2 else [uf("load", 12), uf("main", 59)],
                      4, pid=100 + r) for r in range(4)]
    evals = [job_proc("run:eval", r, BARRIER, 2, pid=200 + r) for r in range(2)]
    report = analyze(Collection(processes=train + evals))
    assert [j.key for j in report.jobs] == ["run:train", "run:eval"]
    t, e = report.jobs
    assert [s.rank for s in t.suspects] == [2] and t.kind is VerdictKind.SUSPECTS
    assert e.suspects == [] and e.kind is VerdictKind.SAME_PLACE and e.world_size == 2
    assert all(s.job == "run:train" for s in report.suspects)
    assert report.findings[0].code == "jobs" and report.findings[0].title.startswith("2 jobs found")
    text = render_text(report)
    assert text.splitlines()[0].startswith("mldebug hang: 2 jobs found")
    assert "Job run:train" in text and "Job run:eval" in text
    d = report.to_dict()
    assert [j["key"] for j in d["jobs"]] == ["run:train", "run:eval"]
    assert d["jobs"][0]["verdict"]["code"] == "suspects" and d["jobs"][0]["world_size"] == 4
    assert {p["job"] for p in d["processes"]} == {"run:train", "run:eval"}
    only = analyze(Collection(processes=train + evals), job="run:eval")
    assert [j.key for j in only.jobs] == ["run:eval"] and len(only.processes) == 2
    # every hint (a finding that is not a job's verdict) names its job, in the text too
    hints = [f for j in report.jobs for f in j.findings[1:]]
    assert hints and all(f.title.startswith(("Job run:train: ", "Job run:eval: ")) for f in hints)
    assert any(f.title.startswith("Job run:eval: Every rank waits in the same collective")
               for f in hints)
    assert "Job run:eval: Every rank waits" in text
    # the report's own findings list (what --json readers take) names each verdict's job
    tops = [f for f in report.findings[1:] if f.code in ("suspects", "same-place")]
    assert [f.title.split(": ")[0] for f in tops] == ["Job run:train", "Job run:eval"], tops
    assert text.count(e.verdict.title) == 1  # shown once, as the job's verdict line


def test_lone_process_with_rank_but_no_job_is_listed_apart():
    ranks = [job_proc("run:a", r, ALLREDUCE, 2) for r in range(2)]
    shell = Process(host="node1", pid=77, rank=0, world_size=None, lone=True,
                    threads=[Thread("MainThread", frames=[uf("main", 3)])])
    report = analyze(Collection(processes=[*ranks, shell]))
    assert len(report.jobs) == 1 and report.jobs[0].suspects == []
    assert [p.pid for p in report.lone] == [77]
    lone = next(f for f in report.findings if f.code == "lone-processes")
    assert "not analysed as ranks" in lone.title and lone.fix
    assert report.to_dict()["lone_processes"][0]["pid"] == 77


def test_pasted_threads_without_process_lines_are_several_processes():
    procs = parse_text_dump((FIX / "pasted_accelerate_3104.txt").read_text())
    assert [p.pid for p in procs] == [42, 3292]  # by the pid in each MainThread header
    assert [len(p.threads) for p in procs] == [6, 1]
    report = analyze(Collection(processes=procs))
    assert "All 2 ranks are in the same place" not in report.verdict
    groups = {g.pids[0][1]: g for g in report.groups}
    assert groups[42].collective == "backward"  # where it waits, not the outermost user frame
    assert groups[3292].collective == "all_gather_coalesced"  # ZeRO-3's gather, a collective
    # the user call site that led there, from package-relative paste paths
    assert groups[42].where == "training_loop (src/model_back/healing/scripts/fine_tune_accelerate.py:410)"
    # one rank in each: no majority, and the verdict says so instead of guessing
    assert report.verdict_kind == "ambiguous" and "all_gather_coalesced" in report.verdict


def test_pasted_dataloader_deadlock_is_named_with_its_fix():
    (p,) = parse_text_dump((FIX / "pasted_dataloader_ami_140.txt").read_text())
    assert p.threads[0].name == "MainThread" and len(p.threads) == 2
    report = analyze(Collection(processes=[p]))
    g = report.groups[0]
    assert g.wait == "dataloader" and "_get_data" in (g.wait_at or "")
    hint = next(f for f in report.findings if f.code == "wait-dataloader")
    assert "num_workers=0" in hint.fix and "/dev/shm" in hint.fix


def test_missing_ranks_and_ranks_outside_the_collective_at_scale_keep_the_suspects():
    world, outside = 4096, set(range(1000, 1008))
    procs = [proc(r, [uf("load_batch", 12), uf("main", 59)] if r in outside else ALLREDUCE,
                  host=f"node{r // 8}", world=world, lws=8, node_rank=r // 8)
             for r in range(world) if r not in (17, 18)]
    report = analyze(Collection(processes=procs))
    assert report.missing_ranks == [17, 18]
    assert sorted(s.rank for s in report.suspects) == sorted(outside)
    assert "Ranks 17-18 of 4096 are missing" in report.verdict
    assert any(f.code == "rank-exited" for f in report.findings)  # the others are past init


def test_missing_rank_while_the_others_are_in_init_never_started():
    init = [tf("init_process_group", 1500), uf("main", 5)]
    init[0] = StackFrame("init_process_group", init[0].filename, 1500, init[0].short)
    procs = [proc(r, init) for r in range(3)]
    report = analyze(Collection(processes=procs, hosts=["node1"]))
    f = next(f for f in report.findings if f.code == "rank-not-started")
    assert "never joined" in f.title and "node answered" in f.detail


def test_report_of_16384_ranks_stays_one_screen():
    world = 16384
    procs = []
    for r in range(world):
        if r % 8 == 3:  # 2,048 suspects, each at one of 163 lines of one function
            frames = [uf("load_batch", 100 + r % 163), uf("main", 59)]
        else:
            frames = ALLREDUCE
        procs.append(proc(r, frames, host=f"node{r // 8}", world=world, lws=8, node_rank=r // 8))
    report = analyze(Collection(processes=procs))
    assert len(report.suspects) == 2048
    text = render_text(report)
    assert len(text.splitlines()) < 60, text
    assert "more suspects" in text and "at lines" in text
    full = render_text(report, show_all=True)
    assert len(full.splitlines()) > 2048


def test_watch_state_uses_dicts_and_marks_moving_suspects():
    moving = [uf("compute", 10), uf("main", 59)]
    procs = [proc(r, ALLREDUCE, later=ALLREDUCE) for r in range(3)]
    procs.append(proc(3, moving, later=[uf("compute", 11), uf("main", 59)]))
    report = analyze(Collection(processes=procs, watch=1.0))
    assert any(f.code == "suspects-moving" for f in report.findings)


def test_json_emits_each_distinct_stack_once_and_carries_findings_with_fixes():
    report = analyze(Collection(processes=[proc(r, ALLREDUCE) for r in range(3)]
                                + [proc(3, BARRIER)]))
    d = json.loads(json.dumps(report.to_dict()))
    assert len(d["stacks"]) == 2
    assert {p["threads"][0]["stack"] for p in d["processes"]} == {0, 1}
    assert d["findings"] and all(f["code"] and f["fix"] for f in d["findings"])
    assert d["verdict"]["code"] == d["verdict"]["kind"] == "suspects"


def test_long_cpp_template_names_are_shortened_in_text_only():
    name = "c10d::ProcessGroupNCCL::WorkNCCL::wait<" + "std::vector<at::Tensor>, " * 20 + ">(x)"
    assert len(short_name(name)) <= 100 and short_name(name).startswith("c10d::ProcessGroupNCCL")
    frames = [StackFrame(name, "/x/libtorch_cuda.so", 0, "libtorch_cuda.so", native=True),
              *ALLREDUCE]
    report = analyze(Collection(processes=[proc(r, frames) for r in range(2)]))
    assert name not in render_text(report)
    assert name in json.dumps(report.to_dict())


def test_a_wrongly_typed_node_document_is_that_nodes_error_only():
    good = {"host": "n1", "processes": [{"pid": 5, "identity": {"rank": 0}, "dump": []}]}
    bad = {"host": "n2", "processes": [{"pid": "five", "identity": [], "dump": {}}]}
    worse = {"host": "n3", "processes": [7]}
    coll = collection_from_results([NodeResult("n1", data=good), NodeResult("n2", data=bad),
                                    NodeResult("n3", data=worse)])
    assert [p.host for p in coll.processes] == ["n1"]
    assert {e.host for e in coll.errors} == {"n2", "n3"}
    assert all("malformed" in e.error for e in coll.errors)


def test_out_reused_is_refused_or_replaced_as_a_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    prepare_out(out, force=False)
    (out / "dumps").mkdir()
    (out / "dumps" / "old-rank9-1.json").write_text("{}")
    with pytest.raises(UsageError, match="already holds files"):
        prepare_out(out, force=False)
    prepare_out(out, force=True)  # mldebug wrote it: replaced whole
    assert not (out / "dumps").exists()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "data.bin").write_text("x")
    with pytest.raises(UsageError, match="not written by mldebug"):
        prepare_out(theirs, force=True)
    assert (theirs / "data.bin").exists()
    assert main(["hang", "--out", str(theirs), "--force", "--pattern", "nothing-xyz"]) == 2
    monkeypatch.chdir(out)  # even a directory mldebug wrote is never replaced while it is the cwd
    with pytest.raises(UsageError, match="it is the current directory"):
        prepare_out(Path("."), force=True)
    assert (out / ".mldebug-hang").exists()


def test_inside_slurm_allocation_the_scope_is_said():
    from mldebug.hang.collect import slurm_scope_note

    note = slurm_scope_note({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[1-4]"})
    assert note and "this node only" in note and "--slurm-job 77" in note
    assert slurm_scope_note({}) is None


def test_cuda_sync_while_others_wait_in_a_collective_is_named():
    # Frame names as in https://github.com/pytorch/pytorch/issues/95944 (ranks hung in
    # cudaDeviceSynchronize / .item() -> at::native::_local_scalar_dense_cuda -> cudaMemcpyAsync
    # while a peer had not joined a collective); the native frames py-spy --native shows.
    item = [StackFrame("cudaMemcpyAsync", "/cuda/lib64/libcudart.so.11.0", 0, "libcudart.so.11.0",
                       native=True),
            StackFrame("at::native::_local_scalar_dense_cuda(at::Tensor const&)",
                       "/v/torch/lib/libtorch_cuda.so", 0, "libtorch_cuda.so", native=True),
            uf("log_loss", 88), uf("main", 60)]
    report = analyze(Collection(processes=[proc(r, ALLREDUCE) for r in range(3)] + [proc(3, item)]))
    assert [s.rank for s in report.suspects] == [3]
    assert report.groups[1].wait == "cuda-sync"
    hint = next(f for f in report.findings if f.code == "wait-cuda-sync")
    assert "Rank 3" in hint.title and ".item()" in hint.detail and hint.fix


def test_known_background_threads_never_make_a_rank_a_suspect():
    tqdm = Thread("Thread-1", frames=[StackFrame("wait", "threading.py", 324, "threading.py"),
                                      StackFrame("run", "tqdm/_monitor.py", 60, "tqdm/_monitor.py")])
    procs = [proc(r, ALLREDUCE) for r in range(4)]
    procs[1].threads.append(tqdm)  # only rank 1 shows a progress bar thread
    report = analyze(Collection(processes=procs), all_threads=True)
    assert report.suspects == [] and len(report.groups) == 1


def test_render_through_a_rich_console_prints_verdict_and_findings_with_fixes():
    import io

    from rich.console import Console

    from mldebug.hang.report import render

    report = analyze(Collection(processes=[proc(r, ALLREDUCE) for r in range(4)]))
    buf = io.StringIO()
    render(report, Console(file=buf, width=100, no_color=True))
    out = buf.getvalue()
    assert "Verdict: Every rank in the same collective: All 4 ranks are in the same place" in out
    assert "HINT" in out and "fix: Run again with --locals" in out
    assert all(k.style for k in VerdictKind)  # every kind has a style: no KeyError possible


def test_a_paste_read_twice_counts_each_process_once_in_the_wording():
    from mldebug.hang.analyze import analyze
    from mldebug.hang.model import Collection

    text = (Path(__file__).parent / "fixtures" / "hang" / "pasted_accelerate_3104.txt").read_text()
    report = analyze(Collection(processes=parse_text_dump(text + "\n" + text)))
    verdict = report.to_dict()["findings"][0]["title"]
    assert ":42 (x2)" in verdict and ":42, ?:42" not in verdict
