"""The node collector: process selection, py-spy error messages, and running stdlib-only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mldebug.fanout import MARKER, bundle
from mldebug.hang.collect import NODE_MODULES
from mldebug.hang.node import PTRACE_FIX, explain_pyspy_error
from mldebug.ranks import find_ranks, proc_status

REPO = Path(__file__).resolve().parent.parent


def table(*rows: tuple[int, int, str, list[str]]) -> dict[int, dict]:
    return {pid: {"pid": pid, "ppid": ppid, "state": state, "uid": 0, "comm": cmd[0].split("/")[-1][:15],
                  "cmdline": cmd} for pid, ppid, state, cmd in rows}


def envs(mapping: dict[int, dict[str, str]]):
    return lambda pid: mapping.get(pid, {})


def worker_env(rank: int, **extra: str) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "job1", **extra}


def test_torchrun_under_srun_keeps_workers_drops_launcher_and_dataloader_children():
    procs = table(
        (10, 1, "S", ["/usr/bin/python3", "-m", "torch.distributed.run", "train.py"]),
        (11, 10, "S", ["/usr/bin/python3", "train.py"]),
        (12, 10, "S", ["/usr/bin/python3", "train.py"]),
        (13, 11, "S", ["/usr/bin/python3", "train.py"]),  # DataLoader worker of rank 0
        (14, 10, "Z", ["python3"]),  # zombie
        (20, 1, "S", ["/usr/bin/python3", "other.py"]),  # unrelated Python, no rank
        (30, 1, "S", ["/bin/bash"]),
    )
    env = envs({10: {"SLURM_PROCID": "0"},
                11: worker_env(0, SLURM_PROCID="0"), 12: worker_env(1, SLURM_PROCID="0"),
                13: worker_env(0, SLURM_PROCID="0"), 14: worker_env(1)})
    targets, errors = find_ranks(procs, environ=env, host="n1")
    assert [t["pid"] for t in targets] == [11, 12]
    assert [t["identity"]["rank"] for t in targets] == [0, 1]
    assert errors == []


def test_pid_of_a_launcher_selects_its_ranks_and_pattern_needs_no_rank():
    procs = table(
        (10, 1, "S", ["python", "-m", "torch.distributed.run", "a.py"]),
        (11, 10, "S", ["python", "a.py"]),
        (40, 1, "S", ["python", "b.py"]),
        (41, 40, "S", ["python", "b.py"]),
    )
    env = envs({11: worker_env(0), 41: worker_env(0, TORCHELASTIC_RUN_ID="job2")})
    targets, _ = find_ranks(procs, pid=10, environ=env)
    assert [t["pid"] for t in targets] == [11]
    targets, _ = find_ranks(procs, pattern=r"b\.py", environ=envs({}))
    assert [t["pid"] for t in targets] == [40, 41]
    targets, errors = find_ranks(procs, pid=99, environ=env)
    assert targets == [] and errors == [{"pid": 99, "error": "no process 99 on this node"}]


def test_pyspy_error_messages_are_actionable():
    me = os.getpid()
    msg = explain_pyspy_error(me, "Error: Permission Denied (os error 13)", 1, euid=1000)
    assert msg == f"py-spy could not attach to pid {me} (ptrace denied). {PTRACE_FIX}"
    assert "sysctl -w kernel.yama.ptrace_scope=0" in msg and "SYS_PTRACE" in msg
    assert explain_pyspy_error(2**22 + 12345, "whatever", 1) == f"process {2**22 + 12345} exited during the dump"
    assert "not a Python process" in explain_pyspy_error(me, "Error: Failed to find python version from target process", 1)


def test_stopped_or_traced_rank_is_named_as_such_not_as_ptrace_denied_to_root():
    """A real SIGSTOPped process, and the /proc status of a traced one: running as root, the
    message must say which it is, never "run as root"."""
    import signal
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(100):
            if proc_status(child.pid).get("State", "").startswith("T"):
                break
            time.sleep(0.02)
        msg = explain_pyspy_error(child.pid, "Error: Operation not permitted (os error 1)", 1)
        assert "is stopped" in msg and f"kill -CONT {child.pid}" in msg
        assert "Run as root" not in msg
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    traced = {"State": "S (sleeping)", "TracerPid": str(os.getpid())}
    msg = explain_pyspy_error(me := os.getpid(), "Error: Operation not permitted", 1, traced)
    assert f"already traced by pid {me}" in msg and "Run as root" not in msg
    msg = explain_pyspy_error(me, "Error: Permission Denied", 1, {"State": "S", "TracerPid": "0"},
                              euid=0)
    assert "although running as root" in msg and "Run as root" not in msg


def test_a_zombie_is_said_to_have_exited():
    import time

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):
            if proc_status(child.pid).get("State", "").startswith("Z"):
                break
            time.sleep(0.02)
        msg = explain_pyspy_error(child.pid, "Error: Failed to find python version", 1)
        assert msg.startswith(f"process {child.pid} exited during the dump"), msg
    finally:
        child.wait()


def test_pid_of_another_users_process_is_said_so(tmp_path):
    procs = table((10, 1, "S", ["python", "a.py"]))
    procs[10]["uid"] = 4242
    targets, errors = find_ranks(procs, pid=10, uid=1000, environ=envs({10: worker_env(0)}))
    assert targets == [] and "belongs to uid 4242" in errors[0]["error"]
    assert "no process" not in errors[0]["error"]


def test_mldebug_itself_is_never_a_rank_and_jobs_are_keyed():
    procs = table((10, 1, "S", ["python", "/venv/bin/mldebug", "hang", "--pattern", "t.py"]),
                  (11, 1, "S", ["python3", "-c", "import base64;'<mldebug-node>'", "t.py"]),
                  (12, 1, "S", ["python", "-m", "mldebug", "hang", "--pattern", "t.py"]),
                  (20, 1, "S", ["/venv/bin/python", "/venv/bin/torchrun", "t.py"]),
                  (21, 20, "S", ["python", "t.py"]),
                  (30, 1, "S", ["bash"]),
                  (31, 30, "S", ["python", "t.py"]))
    env = envs({10: worker_env(0), 11: worker_env(0), 12: worker_env(0),
                21: worker_env(0, TORCHELASTIC_RUN_ID="abc"), 31: {"RANK": "0"}})
    targets, _ = find_ranks(procs, pattern=r"t\.py", environ=env, host="n1")
    by_pid = {t["pid"]: t["job"] for t in targets}
    assert set(by_pid) == {21, 31}  # the launcher above its rank is dropped
    assert by_pid[21] == {"key": "run:abc", "launcher": "torchrun", "lone": False}
    targets, _ = find_ranks(procs, environ=env, host="n1")
    by_pid = {t["pid"]: t["job"] for t in targets}
    assert set(by_pid) == {21, 31} and by_pid[31]["lone"] is True


def test_bin_collector_runs_with_the_stdlib_only(tmp_path):
    # -I: isolated mode, no site-packages, no PYTHONPATH: only the stdlib and the repo files
    r = subprocess.run([sys.executable, "-I", str(REPO / "bin" / "mldebug-collect"), "--pid",
                        str(os.getpid()), "--pretty"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["node_version"] == 1 and "processes" in doc


def test_bundled_node_script_runs_where_mldebug_is_not_installed(tmp_path):
    script = tmp_path / "node_script.py"
    script.write_text(bundle(NODE_MODULES, "mldebug.hang.node"))
    r = subprocess.run([sys.executable, "-I", str(script), "--pid", str(os.getpid())],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith(MARKER)
    doc = json.loads(line[len(MARKER):])
    assert doc["host"] and isinstance(doc["processes"], list)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged user")
def test_pid_of_another_users_process_real_cli_says_whose(tmp_path):
    """An unprivileged user names root's process (this test's own): told whose it is."""
    tmp_path.chmod(0o777)
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(tmp_path))
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-m", "mldebug", "hang", "--pid", str(os.getpid()),
                        "--json"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    errors = [e["error"] for e in json.loads(r.stdout)["errors"]]
    assert errors and "belongs to uid 0" in errors[0] and "no process" not in errors[0]


def test_process_table_of_one_pid_holds_its_tree_and_both_ancestries():
    """list_processes(root=PID) - what `mldebug hang --pid PID` reads - has that process, its
    descendants, their ancestors and mldebug's own chain, each entry as the full table has it;
    find_ranks selects the same from both."""
    import time

    from mldebug.ranks import list_processes

    code = ("import subprocess,sys,time;"
            "c=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']);"
            "print(c.pid,flush=True);time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.2)
        part = list_processes(root=parent.pid)
        full = list_processes()
        assert {parent.pid, child, os.getpid(), os.getppid()} <= set(part)
        assert len(part) < len(full)
        for pid, info in part.items():
            if pid in full:
                assert info == full[pid]
        env = envs({child: worker_env(0)})
        assert find_ranks(part, pid=parent.pid, environ=env) == \
            find_ranks(full, pid=parent.pid, environ=env)
        assert [t["pid"] for t in find_ranks(part, pid=parent.pid, environ=env)[0]] == [child]
        gone = list_processes(root=1 << 30)  # no such process: mldebug's own chain only
        assert os.getpid() in gone and parent.pid not in gone
        assert find_ranks(gone, pid=1 << 30)[1] == [
            {"pid": 1 << 30, "error": f"no process {1 << 30} on this node"}]
    finally:
        parent.kill()
        parent.wait()
        if child:
            try:
                os.kill(child, 9)
            except ProcessLookupError:
                pass


def test_run_many_gives_code_and_both_streams_and_kills_at_the_timeout():
    """The py-spy runner (posix_spawn + one poll loop, no subprocess): per command its exit
    code, stdout and stderr apart, stdin empty, in the order given whatever the width; past
    the timeout a process is killed and reaped; one that cannot start is its OSError."""
    import time

    from mldebug.hang.node import run_many

    talk = [sys.executable, "-c", "import sys; print(sys.stdin.read() + sys.argv[1]); "
                                  "sys.stderr.write('err' * 50000); sys.exit(3)"]
    t = time.monotonic()
    got = run_many([[*talk, "a"], [sys.executable, "-c", "import time; time.sleep(30)"],
                    ["/nonexistent/py-spy", "dump"], ["sh", "-c", "kill -9 $$"], [*talk, "b"]],
                   2.0, 2)
    assert time.monotonic() - t < 15
    assert got[0] == (3, "a\n", "err" * 50000) and got[4] == (3, "b\n", "err" * 50000)
    assert isinstance(got[1], TimeoutError)
    assert isinstance(got[2], OSError)
    assert got[3] == (-9, "", "")


def _wait_state(pid: int, want: str, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (proc_status(pid).get("State") or "").startswith(want):
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never reached state {want}")


def test_kernel_wait_names_a_flock_and_its_holder_from_proc_locks(tmp_path):
    """A real holder and a real waiter on one file: the waiter's system call, the file its fd
    names, and the holder's pid from /proc/locks (the fault matrix's flock class)."""
    import time

    from mldebug.hang.node import kernel_all

    lock = tmp_path / "ckpt.lock"
    lock.touch()
    take = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX); open(sys.argv[1] + '.' + sys.argv[2], 'w').close(); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", take, str(lock), "held"])
    waiter = None
    try:
        while not (tmp_path / "ckpt.lock.held").exists():
            time.sleep(0.02)
        waiter = subprocess.Popen([sys.executable, "-c", take, str(lock), "second"])
        _wait_state(waiter.pid, "S")
        time.sleep(0.3)  # into flock
        targets = [{"pid": waiter.pid}, {"pid": holder.pid}]
        kernel_all(targets)
        k = targets[0]["kernel"]
        assert k["syscall"] in ("flock", "syscall 73"), k
        assert k["file"] == str(lock)
        assert k["lock"]["holder"] == holder.pid and k["lock"]["kind"] == "FLOCK"
        assert k["lock"]["holder_comm"].startswith("python")
        # the holder sleeps: a nanosleep, and it waits on no lock
        assert targets[1]["kernel"]["syscall"] in ("clock_nanosleep", "nanosleep")
        assert "lock" not in targets[1]["kernel"]
    finally:
        for p in (holder, waiter):
            if p is not None:
                p.kill()
                p.wait()


def test_recheck_whenever_a_stack_was_read():
    from mldebug.hang.node import needs_recheck

    def t(pid: int, *frames: tuple[str, str, int]) -> dict:
        return {"pid": pid, "dump": [{"thread_name": "MainThread", "os_thread_id": pid, "frames": [
            {"name": n, "filename": f, "line": line} for n, f, line in frames]}]}

    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    same = [t(p, ("all_reduce", c10d, 3252), ("step", "/w/train.py", 40)) for p in (1, 2)]
    # every rank in one collective: one snapshot would blame the network, a healthy job whose
    # step is one big all_reduce looks the same at most instants
    assert needs_recheck(same)
    assert needs_recheck([*same, t(3, ("all_reduce", c10d, 3252), ("step", "/w/train.py", 44))])
    assert needs_recheck([t(4, ("load", "/w/train.py", 9))])  # outside any collective
    assert not needs_recheck([{"pid": 5, "dump": None}])  # nothing read: nothing to compare
