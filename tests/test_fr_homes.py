"""One flight-recorder folder per job (#39): ``mldebug.fr.enable()`` without a directory
writes into ``/tmp/mldebug-fr-<uid>/<job>/`` (the job key and the launcher), so the next job
on the same MASTER_PORT never replaces the previous job's post-mortem; ``fr trigger`` finds
the ranks there, ``--list`` lists the folders, ``fr analyze --job/--pid`` reads one; dead
ranks' registrations are pruned in every folder beside the recorder's.

The jobs here are real 2-rank gloo torchrun jobs using the real default directory (the point
is the default); each removes only the folders its own launchers made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from envelope_check import check_envelope

from mldebug.fr import node
from mldebug.ranks import job_home, start_time

CRASH = """
import sys, torch, torch.distributed as dist, mldebug.fr as fr
fr.enable()
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(2))
if dist.get_rank() == int(sys.argv[2]):
    raise RuntimeError("boom " + sys.argv[1])
dist.barrier()
"""

BASE = Path(f"/tmp/mldebug-fr-{os.getuid()}")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCH_", "MLDEBUG_FR", "TORCHELASTIC"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _crash_job(script: Path, port: int, tag: str, culprit: int) -> int:
    """Run the 2-rank job to its end (rank ``culprit`` raises); the launcher's pid."""
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(port), str(script), tag, str(culprit)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(),
                         cwd=script.parent, start_new_session=True)
    out, _ = p.communicate(timeout=240)
    assert p.returncode != 0 and f"boom {tag}" in out.decode(errors="replace"), out[-3000:]
    return p.pid


def _homes_of(launcher: int) -> list[Path]:
    return [Path(h) for h in node.job_homes(str(BASE))
            if json.loads((Path(h) / node.HOME_INFO).read_text()).get("launcher_pid") == launcher]


@pytest.mark.timeout(600)
def test_two_jobs_on_one_port_keep_their_own_dumps_listed_and_found_by_key_or_pid(tmp_path):
    """row: fr-home-per-job - two jobs in turn on one MASTER_PORT (job key
    ``master:HOST/127.0.0.1:PORT`` both times): each has its own folder with both ranks'
    failure dumps; the first job's dumps are byte for byte what they were before the second
    ran (on the old code both wrote /tmp/mldebug-fr-<uid>/fr_rank<R>, the second over the
    first); no registration of the ranks is left (rank 0 ended by torchrun's SIGTERM used to
    leave its own); `fr trigger --list` lists both folders; `fr analyze --job KEY` reads the
    newest and `--pid <first launcher>` the first."""
    pytest.importorskip("torch")
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    port = _free_port()
    made: list[Path] = []
    try:
        first = _crash_job(script, port, "first", 1)
        (h1,) = _homes_of(first)
        made.append(h1)
        before = {n: (h1 / n).read_bytes() for n in ("fr_rank0", "fr_rank1")}
        second = _crash_job(script, port, "second", 0)
        (h2,) = _homes_of(second)
        made.append(h2)
        assert h1 != h2 and h1.parent == h2.parent == BASE
        assert {n: (h1 / n).read_bytes() for n in before} == before
        assert (h2 / "fr_rank0").read_bytes() != before["fr_rank0"]
        for h in (h1, h2):
            left = [n for n in os.listdir(h) if n.startswith(".mldebug-fr-")
                    and n != node.HOME_INFO]
            assert left == [], (h, left)
            assert oct(h.stat().st_mode & 0o777) == "0o700"
        key = json.loads((h1 / node.HOME_INFO).read_text())["key"]
        assert key == json.loads((h2 / node.HOME_INFO).read_text())["key"]
        assert key.startswith("master:") and key.endswith(f":{port}")

        r = run_cli("fr", "trigger", "--list", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        check_envelope(doc, "fr.jobs", decides=False)
        homes = {h["dir"]: h for n in doc["nodes"] for h in n["homes"]}
        assert homes[str(h1)]["dumps"] == homes[str(h2)]["dumps"] == 2
        assert homes[str(h1)]["key"] == key and homes[str(h1)]["pids"] == []
        assert homes[str(h1)]["launcher_pid"] == first
        text = run_cli("fr", "trigger", "--list", env=dict(_env(), NO_COLOR="1", COLUMNS="250"))
        assert key in text.stdout and "none (ended)" in text.stdout, text.stdout

        by_key = run_cli("fr", "analyze", "--job", key, "--json")
        assert by_key.returncode == 0, by_key.stderr
        assert str(h2) in by_key.stderr and "2 job folders" in by_key.stderr
        assert json.loads(by_key.stdout)["verdict"]["culprits"] == [0]  # the second job
        by_pid = run_cli("fr", "analyze", "--pid", str(first), "--json")
        assert by_pid.returncode == 0, by_pid.stderr
        assert json.loads(by_pid.stdout)["verdict"]["culprits"] == [1]  # the first job
        nothing = run_cli("fr", "analyze", "--job", "run:no-such-job")
        assert nothing.returncode == 1 and "fr trigger --list" in nothing.stderr
        assert "Traceback" not in nothing.stderr
    finally:
        for h in made:
            shutil.rmtree(h, ignore_errors=True)


@pytest.mark.timeout(300)
def test_trigger_without_a_dir_finds_a_live_job_in_its_folder(tmp_path):
    """row: fr-home-trigger - a live job under the default: `fr trigger --pid <launcher>` (no
    --dir) dumps both ranks from the job's folder and `--list` shows them live."""
    pytest.importorskip("torch")
    script = tmp_path / "wait.py"
    script.write_text("import time, torch, torch.distributed as dist, mldebug.fr as fr\n"
                      "fr.enable()\n"
                      "dist.init_process_group('gloo')\n"
                      "dist.all_reduce(torch.ones(2)); print('ready', flush=True)\n"
                      "time.sleep(90)\n")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(_free_port()), str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(),
                         cwd=tmp_path, start_new_session=True, text=True)
    made: list[Path] = []
    try:
        assert p.stdout is not None
        seen = [p.stdout.readline() for _ in range(2)]
        deadline = time.monotonic() + 60
        while not made and time.monotonic() < deadline:
            made = _homes_of(p.pid)
            time.sleep(0.2)
        (home,) = made
        while len(list(home.glob(".mldebug-fr-*.trigger"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        listed = run_cli("fr", "trigger", "--list", "--pid", str(p.pid), "--json")
        (h,) = [h for n in json.loads(listed.stdout)["nodes"] for h in n["homes"]]
        assert h["dir"] == str(home) and h["ranks"] == [0, 1], (h, seen)
        r = run_cli("fr", "trigger", "--pid", str(p.pid), "--out", str(tmp_path / "o"), "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert sorted(os.path.basename(f) for f in doc["files"]) == ["fr-" + doc["nodes"][0][
            "host"] + "-rank0", "fr-" + doc["nodes"][0]["host"] + "-rank1"]
        assert list((home / "triggered").iterdir())  # written in the job's folder
    finally:
        import signal

        p.send_signal(signal.SIGTERM)  # torchrun stops its ranks (their sessions are their own)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for h in made:
            shutil.rmtree(h, ignore_errors=True)


def test_job_home_names_one_launcher_and_its_ranks():
    """Ranks of one launcher share the folder; the same key under another launcher (the next
    job on the port) gets another; a process with no job key is a job of its own."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0"}
    me, parent = os.getpid(), os.getppid()
    a = job_home(env, "vm", me, parent)
    assert a == job_home(dict(env, RANK="1"), "vm", me + 1, parent)
    assert a.startswith("master_vm_127.0.0.1_29500-") and a.endswith(f"-{parent}-"
                                                                      f"{start_time(parent)}")
    assert job_home(env, "vm", me, 1) != a
    assert job_home({"TORCHELASTIC_RUN_ID": "abc/../x"}, "vm", me, parent).startswith("run_abc_.._x-")
    assert job_home({}, "vm", me, parent) == f"pid-{me}-{start_time(me)}"
    assert "/" not in job_home({"SLURM_JOB_ID": "7/../../etc", "SLURM_STEP_ID": "0"}, "vm", me,
                               parent)


def test_a_new_recorder_prunes_dead_registrations_in_the_other_jobs_folders(tmp_path):
    """row: fr-home-stale-pruned - a job killed with SIGKILL leaves its registrations in its
    folder, which no later job uses; the next recorder beside it removes them (this user's
    files with mldebug's names, of a pid that no longer runs), and leaves the dumps, a live
    rank's registration and another user's-style foreign file alone."""
    from mldebug.fr.recorder import Recorder

    base = tmp_path / "mldebug-fr-x"
    old, mine = base / "run_old-1-1", base / "run_new-2-2"
    for d in (old, mine):
        d.mkdir(parents=True, mode=0o700)
        (d / node.HOME_INFO).write_text("{}")
    base.chmod(0o700)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stem = old / f".mldebug-fr-vm-{dead.pid}"
    (old / f"{stem.name}.json").write_text(json.dumps({"pid": dead.pid, "host": "vm"}))
    os.mkfifo(old / f"{stem.name}.trigger", 0o600)
    live = old / f".mldebug-fr-vm-{os.getppid()}.json"
    live.write_text(json.dumps({"pid": os.getppid(), "host": "vm"}))
    (old / "fr_rank0").write_bytes(b"evidence")
    (old / "notes.txt").write_text("not ours")
    rec = Recorder(dump_dir=mine, rank=0, host="vm")
    assert rec.prune_siblings() == 1
    assert sorted(os.listdir(old)) == sorted([node.HOME_INFO, live.name, "fr_rank0",
                                              "notes.txt"])
    bare = Recorder(dump_dir=tmp_path / "chosen", rank=0, host="vm")
    (tmp_path / "chosen").mkdir(mode=0o700)
    assert bare.prune_siblings() == 0  # a directory somebody chose: no job folders beside it


def test_a_new_recorder_removes_the_empty_folders_of_ended_jobs_only(tmp_path):
    """row: fr-home-empty-pruned - one folder per job would pile up a folder for every job that
    never dumped; the next recorder removes a sibling folder that holds only what enable()
    made (its job file and an empty nccl/) when its launcher no longer runs and nothing
    changed in it for ENDED_AFTER_S. Everything else stays: a dump, a live launcher, a recent
    change, a file of the user's, a folder without mldebug's job file."""
    from mldebug.fr.recorder import ENDED_AFTER_S, Recorder

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    base = tmp_path / "mldebug-fr-x"
    base.mkdir(mode=0o700)
    old = time.time() - ENDED_AFTER_S - 60

    def home(name: str, launcher: int, *, extra: str | None = None, age: float = old,
             info: bool = True) -> Path:
        d = base / name
        (d / "nccl").mkdir(parents=True, mode=0o700)
        d.chmod(0o700)
        if info:
            (d / node.HOME_INFO).write_text(json.dumps({"key": "k", "launcher_pid": launcher}))
        if extra:
            (d / extra).write_text("x")
        os.utime(d, (age, age))
        return d

    gone = home("run_a-1-1", dead.pid)
    kept = [home("run_b-1-1", dead.pid, extra="fr_rank0"),
            home("run_c-1-1", os.getpid()),
            home("run_d-1-1", dead.pid, age=time.time()),
            home("run_e-1-1", dead.pid, extra="notes.txt"),
            home("run_f-1-1", dead.pid, info=False)]
    (kept[0] / "nccl" / "fr_rank1").write_bytes(b"")  # and its nccl/ is not empty
    mine = base / "run_new-2-2"
    mine.mkdir(mode=0o700)
    (mine / node.HOME_INFO).write_text("{}")
    Recorder(dump_dir=mine, rank=0, host="vm").prune_siblings()
    assert not gone.exists()
    assert all(d.is_dir() for d in kept), [d for d in kept if not d.is_dir()]
    assert (kept[1] / node.HOME_INFO).exists() and (kept[1] / "nccl").is_dir()
