"""Remote pdb with real processes: ranks without a terminal serve a session; the CLI lists and
connects to it through a real pty (pexpect); other users are refused; only 127.0.0.1 listens."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pexpect
import pytest
from conftest import REPO, run_cli
from jobs import kill_tree

TORCHRUN_JOB = r"""
import datetime, time
import torch.distributed as dist
import mldebug
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
rank = dist.get_rank()
mldebug.breakpoint(rank=BP_RANK)
stopped_here = rank * 10
print(f"rank {rank} after t={time.time():.3f}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
STOP_LINE = 8  # the line after mldebug.breakpoint(): where pdb stops

POST_MORTEM = r"""
from mldebug.debugger.excepthook import install_excepthook
install_excepthook(debug=True)

def inner(scale):
    local_value = 1234 * scale
    raise ValueError("boom")

inner(1)
"""
RAISE_LINE = 7


def job_env(session_dir: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
                MLDEBUG_PDB_DIR=str(session_dir), MLDEBUG_PRINT_LOCK=str(session_dir) + ".lock")


def start_batch(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process as a batch scheduler would: no terminal, stdin /dev/null."""
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def start_script(tmp_path: Path, source: str, name: str, *launcher: str
                 ) -> tuple[subprocess.Popen[bytes], Path, dict[str, str]]:
    """Write ``source`` to tmp_path/name and start it batch-style: (process, log, env)."""
    script = tmp_path / name
    script.write_text(source)
    env = job_env(tmp_path / "sessions")
    log = tmp_path / (name + ".log")
    launch = [sys.executable, *launcher] if launcher else [sys.executable]
    return start_batch([*launch, str(script)], env, log), log, env


def wait_for(log: Path, pattern: str, proc: subprocess.Popen[bytes] | None,
             timeout: float = 120) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text(errors="replace"))
        if m:
            return m
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not in the log:\n{log.read_text(errors='replace')[-3000:]}")


def listening(pid: int | None = None) -> list[tuple[str, int]]:
    """(address, port) of the LISTEN sockets of ``pid`` (every process when None), from /proc."""
    inodes: set[str] | None = None
    if pid is not None:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] != "0A":  # LISTEN
                    continue
                if inodes is not None and cols[9] not in inodes:
                    continue
                addr, port = cols[1].split(":")
                found.append((_address(addr, width), int(port, 16)))
    return found


def _address(hexaddr: str, width: int) -> str:
    if width == 8:
        return ".".join(str(int(hexaddr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return "ipv6:" + hexaddr


def spawn_cli(args: list[str], env: dict[str, str], cwd: Path, *,
              sigint_ignored: bool = False) -> pexpect.spawn:
    """``mldebug ARGS`` on a terminal; ``sigint_ignored``: started with SIGINT ignored."""
    import signal

    env = dict(env, PYTHONPATH=str(REPO))
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return pexpect.spawn(sys.executable, ["-m", "mldebug", *args], env=env, cwd=str(cwd),
                         encoding="utf-8", timeout=60, dimensions=(50, 200), preexec_fn=pre)


def after_times(log: Path) -> dict[int, float]:
    return {int(r): float(t) for r, t in re.findall(r"rank (\d) after t=([0-9.]+)", log.read_text())}


def drive_session(child: pexpect.spawn, rank: int, world: int = 4) -> float:
    """p dist.get_rank(), n, c in a connected session; returns the time just before 'c'."""
    child.expect(rf"attached to rank {rank} on")
    child.expect(r"-> stopped_here = rank \* 10")
    child.expect(r"\(Pdb\) ")
    child.sendline("p dist.get_rank()")
    child.expect(rf"\r\n{rank}\r\n")
    child.expect(r"\(Pdb\) ")
    child.send("p dist.get_world_si\t")  # tab completion, computed on the rank's side
    child.expect("get_world_size")
    child.sendline(")")
    child.expect(rf"\r\n{world}\r\n")
    child.expect(r"\(Pdb\) ")
    child.sendline("n")
    child.expect(r"-> print\(f\"rank")
    child.expect(r"\(Pdb\) ")
    child.sendline("p stopped_here")
    child.expect(rf"\r\n{rank * 10}\r\n")
    child.expect(r"\(Pdb\) ")
    return continue_session(child)


def continue_session(child: pexpect.spawn) -> float:
    """Type 'c' at the prompt; the client ends cleanly. Returns the time just before 'c'."""
    before_c = time.time()
    child.sendline("c")
    child.expect(r"continues; session closed")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return before_c


@pytest.mark.slow
def test_rank2_of_a_batch_torchrun_job_is_listed_and_debugged(tmp_path):
    script = tmp_path / "tr.py"
    job, log, env = start_script(tmp_path, TORCHRUN_JOB.replace("BP_RANK", "2"), script.name,
                                 "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4")
    try:
        m = wait_for(log, r"waiting for a debugger: (mldebug pdb connect (\S+):(\d+))", job)
        port = int(m[3])
        wait_for(log, r"the other ranks wait \(up to 3600s\) while rank 2 is debugged", job)
        r = run_cli("pdb", "list", "--json", env=env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        [s] = doc["sessions"]
        assert (s["rank"], s["line"], s["function"], s["kind"], s["port"]) == (2, STOP_LINE, "<module>", "pdb", port)
        assert s["file"] == str(script) and s["world_size"] == 4 and "token" not in s
        text = run_cli("pdb", "list", env=env).stdout
        assert re.search(rf"^2\s+\S+\s+{s['pid']}\s+pdb\s+tr.py:{STOP_LINE} in <module>\s+{m[2]}:{port}$",
                         text, re.M), text
        # the session listens on 127.0.0.1 only, and nothing else uses its port
        assert [a for a in listening() if a[1] == port] == [("127.0.0.1", port)]
        assert ("127.0.0.1", port) in listening(s["pid"])
        time.sleep(1.0)
        assert after_times(log) == {}, "a rank went on before the debugger continued"
        before_c = drive_session(spawn_cli(["pdb", "connect", "2"], env, tmp_path), 2)
        assert job.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            kill_tree(job)
    times = after_times(log)
    assert sorted(times) == [0, 1, 2, 3]
    assert all(t > before_c for t in times.values()), (times, before_c)
    assert not list((tmp_path / "sessions").iterdir()), "the registration was left behind"


def test_post_mortem_session_at_the_raising_frame_and_reconnect(tmp_path):
    proc, log, env = start_script(tmp_path, POST_MORTEM, "pm.py")
    try:
        m = wait_for(log, r"post-mortem at pm.py:(\d+), waiting for a debugger: mldebug pdb connect (\S+:\d+)", proc)
        assert int(m[1]) == RAISE_LINE
        assert "ValueError: boom" in log.read_text()  # the traceback printed first, as usual
        # nothing of this process listens beyond 127.0.0.1
        socks = listening(proc.pid)
        assert socks and all(addr == "127.0.0.1" for addr, _ in socks), socks
        child = spawn_cli(["pdb", "connect", m[2]], env, tmp_path)
        child.expect(r"-> raise ValueError")
        child.expect(r"\(Pdb\) ")
        child.sendline("p local_value")
        child.expect(r"\r\n1234\r\n")
        child.expect(r"\(Pdb\) ")
        child.sendcontrol("d")  # detach: the process stays in the session
        child.expect("detached; the rank stays stopped")
        child.expect(pexpect.EOF)
        time.sleep(0.5)
        assert proc.poll() is None
        child = spawn_cli(["pdb", "connect", m[2]], env, tmp_path)
        child.expect(r"-> raise ValueError")  # where it stands, shown again on attach
        child.expect(r"\(Pdb\) ")
        child.sendline("p scale + 1")
        child.expect(r"\r\n2\r\n")
        child.expect(r"\(Pdb\) ")
        child.sendline("up")  # the whole traceback is there, not only the last frame
        child.expect(r"-> inner\(1\)")
        child.expect(r"\(Pdb\) ")
        child.sendline("q")  # 'q' never ends a process from a session: it continues
        child.expect(r"does not stop a rank")
        child.expect(pexpect.EOF)
        assert proc.wait(timeout=30) == 1  # the exception ends the program, as without us
    finally:
        if proc.poll() is None:
            kill_tree(proc)


INTERRUPTIBLE = r"""
import time
import mldebug
def slow():
    print("slow() runs", flush=True)
    while True:
        time.sleep(0.05)
mldebug.breakpoint()
print("done", flush=True)
"""


SIGINT_SETUPS = {
    "default": "",
    # a batch launch (`job &` in a script without job control) starts everything with SIGINT
    # ignored: the rank and the terminal that connects to it
    "ignored": "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n",
    # a job's own handler (a graceful shutdown) must not be run by a remote Ctrl-C
    "handler": ("import signal\nsignal.signal(signal.SIGINT, lambda *a: print('the job\\'s "
                "SIGINT handler ran', flush=True))\n"),
}


@pytest.mark.parametrize("setup", list(SIGINT_SETUPS))
def test_ctrl_c_interrupts_the_running_command_not_the_session(tmp_path, setup):
    proc, log, env = start_script(tmp_path, SIGINT_SETUPS[setup] + INTERRUPTIBLE, "slow.py")
    try:
        m = wait_for(log, r"mldebug pdb connect (\S+:\d+)", proc)
        child = spawn_cli(["pdb", "connect", m[1]], env, tmp_path,
                          sigint_ignored=setup == "ignored")
        child.expect(r"\(Pdb\) ")
        child.sendline("p slow()")
        wait_for(log, r"slow\(\) runs", proc)  # the command runs: the Ctrl-C is for it
        child.sendintr()
        child.expect("KeyboardInterrupt")
        child.expect(r"\(Pdb\) ")
        child.sendline("p 6 * 7")  # still connected, still stopped
        child.expect(r"\r\n42\r\n")
        child.sendline("c")
        child.expect(pexpect.EOF)
        assert proc.wait(timeout=30) == 0
        assert "done" in log.read_text()
        assert "SIGINT handler ran" not in log.read_text()
    finally:
        if proc.poll() is None:
            kill_tree(proc)


OTHER_USER_CLIENT = r"""
import socket, sys
from mldebug.debugger import registry, wire
port = int(sys.argv[1])
for first in (("A", "0" * 32), ("L", "p 1")):
    s = socket.create_connection(("127.0.0.1", port), timeout=15)
    wire.Sender(s).send(*first)
    print(wire.recv(s))
try:
    registry.find(sys.argv[2], port=port)
except (registry.RegistryError, OSError) as e:
    print("find:", type(e).__name__, e)
"""


def test_another_user_cannot_connect_and_is_logged(tmp_path):
    from test_printing import second_user

    uid, gid = second_user()
    script = tmp_path / "pm.py"
    script.write_text(POST_MORTEM)
    # under /tmp itself, so the other user can reach the directory and meet its owner check
    sessions = Path(tempfile.mkdtemp(prefix="mldebug-pdb-test-")) / "sessions"
    os.chmod(sessions.parent, 0o755)
    env = job_env(sessions)
    log = tmp_path / "pm.log"
    proc = start_batch([sys.executable, str(script)], env, log)
    try:
        m = wait_for(log, r"mldebug pdb connect (\S+):(\d+)", proc)
        r = subprocess.run(["/usr/bin/python3", "-c", OTHER_USER_CLIENT, m[2], str(sessions)],
                           capture_output=True, text=True, timeout=60, user=uid, group=gid,
                           extra_groups=[], cwd="/",
                           env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "('R', 'refused: wrong token')"
        assert lines[1] == "('R', 'refused: no token')"
        assert lines[2].startswith("find: RegistryError") and "belongs to root (uid 0)" in lines[2]
        text = log.read_text()
        assert "refused a connection from 127.0.0.1" in text and ": wrong token" in text
        assert ": no token" in text
        # the owner still gets in and ends the session
        child = spawn_cli(["pdb", "connect", f"{m[1]}:{m[2]}"], env, tmp_path)
        child.expect(r"\(Pdb\) ")
        child.sendline("c")
        child.expect(pexpect.EOF)
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        shutil.rmtree(sessions.parent, ignore_errors=True)


ALL_THEN_TIMEOUT = r"""
import datetime, time
import torch.distributed as dist
import mldebug
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
rank = dist.get_rank()
mldebug.breakpoint(rank="all")
print(f"rank {rank} after t={time.time():.3f}", flush=True)
mldebug.breakpoint(rank=0, timeout=3)
print(f"rank {rank} second t={time.time():.3f}", flush=True)
dist.barrier()
"""


def connect_and_continue(env: dict[str, str], cwd: Path, rank: int) -> float:
    child = spawn_cli(["pdb", "connect", str(rank)], env, cwd)
    child.expect(rf"attached to rank {rank} on")
    child.expect(r"\(Pdb\) ")
    return continue_session(child)


@pytest.mark.slow
def test_every_rank_debugged_then_a_wait_that_times_out(tmp_path):
    job, log, env = start_script(tmp_path, ALL_THEN_TIMEOUT, "all.py", "-m",
                                 "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    try:
        wait_for(log, r"(?s)rank [01] on .*rank [01] on .*waiting", job)
        listed = json.loads(run_cli("pdb", "list", "--json", env=env).stdout)
        assert sorted(s["rank"] for s in listed["sessions"]) == [0, 1]
        connect_and_continue(env, tmp_path, 1)
        time.sleep(1.0)
        assert after_times(log) == {}, "rank 1 went on while rank 0 was still debugged"
        released = connect_and_continue(env, tmp_path, 0)
        wait_for(log, r"rank 1 waited 3s for the debugger on rank 0 and continues without it", job)
        connect_and_continue(env, tmp_path, 0)
        assert job.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            kill_tree(job)
    times = after_times(log)
    assert sorted(times) == [0, 1] and all(t > released for t in times.values())
    second = {int(r): float(t) for r, t in re.findall(r"rank (\d) second t=([0-9.]+)", log.read_text())}
    assert second[1] < second[0]  # rank 1 gave up waiting before rank 0 was continued


class _Frames:
    """What a Channel sends its client, kept (the client side of a unit test)."""

    def __init__(self):
        self.sent = []

    def send(self, kind, text=""):
        self.sent.append((kind, text))
        return True


def test_a_ctrl_c_between_a_sent_line_and_its_start_stops_that_command():
    """On a loaded node the client's Ctrl-C can reach the rank after the command's line but
    before pdb took it: the interrupt must stop that command (pdb's --KeyboardInterrupt--),
    not be dropped as if it came at an idle prompt, and must not touch the next command."""
    import threading

    from mldebug.debugger.remote import Channel

    ch = Channel("token", lambda: None, lambda _doc: [], "test")
    got = []

    def pdb_reads():
        for _ in range(2):
            try:
                got.append(ch.readline())
            except KeyboardInterrupt:
                got.append("KeyboardInterrupt")

    try:
        t = threading.Thread(target=pdb_reads, daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while ch._prompt is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ch._prompt is not None
        ch._interrupt(_Frames())  # at the idle prompt, nothing sent: ignored here
        assert not ch._interrupt_pending
        with ch._state:  # pdb may take the line meanwhile, but cannot start it
            ch._put_line("p slow()")
            ch._interrupt(_Frames())
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        ch._put_line("p 6 * 7")
        t.join(10)
        assert got == ["KeyboardInterrupt", "p 6 * 7\n"]
    finally:
        ch.close("test over")


@pytest.mark.parametrize("closed", [False, True])
def test_a_ctrl_c_reaches_a_session_in_any_thread_and_never_the_rank_after_it_ended(closed):
    """The interrupt is raised in the thread the session runs in (here not the main one);
    once 'c' has closed the session the rank runs its own code, and a late Ctrl-C is
    dropped instead of raised there."""
    import threading

    from mldebug.debugger.remote import Channel

    box: dict[str, object] = {}
    ready = threading.Event()

    def rank_thread():
        ch = box["ch"] = Channel("token", lambda: None, lambda _doc: [], "test")
        ready.set()
        try:
            end = time.monotonic() + 2.0
            while time.monotonic() < end:  # a command running, or the rank's own code
                pass
            box["result"] = "ran on"
        except KeyboardInterrupt:
            box["result"] = "interrupted"
        finally:
            ch.close("over")

    t = threading.Thread(target=rank_thread, daemon=True)
    t.start()
    assert ready.wait(10)
    ch = box["ch"]
    if closed:
        ch.close("rank 0 continues; session closed.")
    ch._interrupt(_Frames())
    t.join(10)
    assert box["result"] == ("ran on" if closed else "interrupted")


def test_a_second_ctrl_c_right_after_the_first_is_not_raised_in_pdbs_handler():
    """pdb prints --KeyboardInterrupt-- in an except clause; a second KeyboardInterrupt raised
    there would leave pdb and end the rank. A double press raises one; a later press (a
    command that caught the first) raises again."""
    import threading

    from mldebug.debugger.remote import INTERRUPT_GAP, Channel

    box: dict[str, object] = {"caught": 0}
    ready = threading.Event()

    def session_thread():
        ch = box["ch"] = Channel("token", lambda: None, lambda _doc: [], "test")
        ready.set()
        end = time.monotonic() + 2 * INTERRUPT_GAP + 1.0
        while time.monotonic() < end:  # a command that catches KeyboardInterrupt and goes on
            try:
                while time.monotonic() < end:
                    pass
            except KeyboardInterrupt:
                box["caught"] += 1  # type: ignore[operator]
        ch.close("over")

    t = threading.Thread(target=session_thread, daemon=True)
    t.start()
    assert ready.wait(10)
    ch = box["ch"]
    ch._interrupt(_Frames())
    deadline = time.monotonic() + 5
    while box["caught"] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    ch._interrupt(_Frames())  # the double press: the first is being handled
    time.sleep(INTERRUPT_GAP + 0.3)
    ch._interrupt(_Frames())  # later: the command is still running
    t.join(10)
    assert box["caught"] == 2


CLIENT = r"""
import sys
from mldebug.debugger import client
sys.exit(client.run(int(sys.argv[1]), "tok"))
"""


def test_ctrl_c_while_output_streams_is_sent_never_fatal():
    """A Ctrl-C lands wherever the client is - writing a command's output, sending a frame -
    not only while it waits for the next frame: each press reaches the rank as one interrupt
    frame and the session goes on (CI once saw `mldebug: interrupted` end the connection)."""
    import select
    import signal
    import threading

    from mldebug.debugger import wire

    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(60)
    # SIGINT at its default in the client: a runner started in the background (`pytest &` in a
    # script) passes it down ignored, and a client with no terminal leaves an ignored SIGINT be
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(srv.getsockname()[1])],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    stop = threading.Event()
    try:
        conn, _ = srv.accept()
        conn.settimeout(None)  # the flood's sends never time out; the presses wait by select
        assert select.select([conn], [], [], 60)[0] and wire.recv(conn) == ("A", "tok")
        sender = wire.Sender(conn)
        ended: list[str] = []

        def flood() -> None:  # a command that prints all the time, in bursts
            try:
                while not stop.is_set():
                    for _ in range(50):
                        if not sender.send("O", "x" * 300 + "\n"):
                            ended.append("the connection failed")
                            return
                    time.sleep(0.001)
                ended.append("stopped")
            except BaseException as e:
                ended.append(repr(e))
                raise
        thread = threading.Thread(target=flood, daemon=True)
        thread.start()
        for press in range(25):  # the client before this fix ended at the first or second
            os.kill(proc.pid, signal.SIGINT)
            if not select.select([conn], [], [], 60)[0]:
                spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                where = subprocess.run([spy, "dump", "--pid", str(proc.pid)],
                                       capture_output=True, text=True, timeout=60)
                pytest.fail(f"press {press}: no interrupt frame in 60 s; the flood: "
                            f"{ended or 'running'}; the client ({proc.poll()=}):\n"
                            f"{where.stdout}{where.stderr}")
            frame = wire.recv(conn)
            assert frame == ("I", ""), f"press {press}: {frame=} {proc.poll()=}"
        stop.set()
        thread.join(30)
        sender.send("E", "the rank continued")
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        srv.close()
