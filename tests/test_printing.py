"""Rank-aware printing with real processes: whole lines, prefixes, tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

WRITER = r"""
import sys
from pathlib import Path
from mldebug import printflock
me, n, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    block = "\n".join(f"[{me}:{i}:{j}] " + me * width for j in range(3))
    printflock(block)
"""


def intact(text: str, writers: list[str], n: int, width: int) -> list[str]:
    """Lines that are not exactly one writer's line (empty when nothing interleaved)."""
    bad = []
    seen = 0
    for line in text.splitlines():
        head, _, body = line.partition("] ")
        me = head[1:].split(":")[0]
        if me not in writers or body != me * width:
            bad.append(line[:80])
        seen += 1
    if seen != len(writers) * n * 3:
        bad.append(f"expected {len(writers) * n * 3} lines, got {seen}")
    return bad


def test_checker_detects_interleaving():
    good = "[a:0:0] aaaa\n[b:0:0] bbbb\n"
    assert intact(good, ["a", "b"], 1, 4) == ["expected 6 lines, got 2"]
    assert intact("[a:0:0] aa[b:0:0] bbbb\naa\n", ["a", "b"], 1, 4)


def test_four_processes_never_interleave(tmp_path):
    writers, n, width = ["a", "b", "c", "d"], 150, 30000  # lines far beyond PIPE_BUF
    env = dict(os.environ, PYTHONPATH=str(REPO), MLDEBUG_PRINT_LOCK=str(tmp_path / "lock"))
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, w, str(n), str(width)],
                                  stdout=f, env=env) for w in writers]
        for p in procs:
            assert p.wait(timeout=120) == 0
    assert intact(out.read_text(), writers, n, width) == []
    # the same through a pipe
    r = subprocess.run(
        ["bash", "-c", " & ".join(f"{sys.executable} -c '{WRITER}' {w} {n} {width}" for w in writers)
         + " & wait"], capture_output=True, text=True, env=env, timeout=120)
    assert intact(r.stdout, writers, n, width) == []


def test_rank_print_prefixes_every_line_and_numeric_host(tmp_path):
    code = ("from mldebug.printing import rank_print, make_prefix\n"
            "rank_print('line one\\nline two')\n"
            "rank_print('x', fmt='<{host}|{local_rank}/{world_size}>', numeric_host=True)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="5", LOCAL_RANK="1", WORLD_SIZE="8",
               MLDEBUG_PRINT_LOCK=str(tmp_path / "lock"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    host = __import__("socket").gethostname().split(".")[0]
    digits = "".join(c for c in host if c.isdigit()) or host
    assert r.stdout.splitlines() == [f"[{host}:5] line one", f"[{host}:5] line two",
                                     f"<{digits}|1/8> x"]


def test_excepthook_prints_the_whole_traceback_prefixed(tmp_path):
    code = ("from mldebug.debugger.excepthook import install_excepthook\ninstall_excepthook()\n"
            "def inner():\n    raise ValueError('boom\\nsecond line')\ninner()\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="3", MLDEBUG_PRINT_LOCK=str(tmp_path / "l"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0].endswith(":3] Traceback (most recent call last):")
    assert all(":3] " in line for line in lines)
    assert lines[-2].endswith("ValueError: boom") and lines[-1].endswith("] second line")


FORK_WHILE_PRINTING = r"""
import os, sys, threading, time
from mldebug import printflock
stop = False
def chatter():
    while not stop:
        printflock("thread line " + "x" * 2000, file=open(os.devnull, "w"))
threading.Thread(target=chatter, daemon=True).start()
time.sleep(0.2)
pids = []
for i in range(100):
    pid = os.fork()
    if pid == 0:
        printflock("child", i, file=open(os.devnull, "w"))
        os._exit(0)
    pids.append(pid)
deadline = time.monotonic() + 20
hung = set(pids)
while hung and time.monotonic() < deadline:
    for pid in list(hung):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            hung.discard(pid)
    time.sleep(0.05)
for pid in hung:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
stop = True
print("hung", len(hung), flush=True)
"""


def test_children_forked_while_a_thread_prints_never_hang(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), MLDEBUG_PRINT_LOCK=str(tmp_path / "lock"))
    r = subprocess.run([sys.executable, "-c", FORK_WHILE_PRINTING], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "hung 0"


def test_a_planted_symlink_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "lock"
    link.symlink_to(victim)
    env = dict(os.environ, PYTHONPATH=str(REPO), MLDEBUG_PRINT_LOCK=str(link))
    r = subprocess.run([sys.executable, "-c", "from mldebug import printflock; printflock('hi')"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout == "hi\n"
    assert "not using the lock file" in r.stderr
    assert victim.read_text() == "precious\n" and link.is_symlink()


SECOND_USER = "mldebugtest2"


def second_user() -> tuple[int, int]:
    """(uid, gid) of an unprivileged local user, created if needed; skips when impossible."""
    import pwd
    import shutil

    import pytest

    try:
        pw = pwd.getpwnam(SECOND_USER)
    except KeyError:
        if os.geteuid() != 0 or shutil.which("useradd") is None:
            pytest.skip("a second local user is needed: run as root with useradd available")
        r = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            SECOND_USER], capture_output=True, text=True)
        if r.returncode not in (0, 9):  # 9: created meanwhile by a parallel test
            pytest.skip(f"useradd {SECOND_USER} failed: {r.stderr.strip()}")
        pw = pwd.getpwnam(SECOND_USER)
    return pw.pw_uid, pw.pw_gid


def test_another_users_lock_file_is_refused(tmp_path):
    uid, gid = second_user()
    lock = tmp_path / "lock"
    lock.write_text("")
    os.chown(lock, uid, gid)
    env = dict(os.environ, PYTHONPATH=str(REPO), MLDEBUG_PRINT_LOCK=str(lock))
    r = subprocess.run([sys.executable, "-c", "from mldebug import printflock; printflock('hi')"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout == "hi\n"
    assert f"owned by uid {uid}" in r.stderr
    assert "instead" not in r.stderr  # the user chose that path: no fallback, unlocked
    assert os.stat(lock).st_uid == uid


SQUAT_WRITER = WRITER + r"""
import os
from mldebug import printing
st = os.fstat(printing._fd())
sys.stderr.write(f"LOCK {st.st_dev} {st.st_ino}\n")
"""


def _squatted_default(tmp_path, uid: int, gid: int) -> tuple[Path, os.stat_result]:
    """TMPDIR whose default lock file name another user took first (a squatter)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    squat = tmp / f"mldebug-print-{os.geteuid()}.lock"
    squat.write_text("theirs\n")
    os.chown(squat, uid, gid)
    return squat, os.stat(squat)


def _two_writers(env: dict[str, str], tmp_path) -> tuple[set[str], list[str]]:
    """Two processes printing blocks far beyond PIPE_BUF at once: the lock files they hold
    (LOCK dev inode) and the lines of their stderr."""
    n, width = 100, 30000
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        procs = [subprocess.Popen([sys.executable, "-c", SQUAT_WRITER, w, str(n), str(width)],
                                  stdout=f, stderr=subprocess.PIPE, text=True, env=env)
                 for w in ("a", "b")]
        errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert intact(out.read_text(), ["a", "b"], n, width) == []
    locks = {x for e in errs for x in e.splitlines() if x.startswith("LOCK ")}
    return locks, [x for e in errs for x in e.splitlines() if not x.startswith("LOCK ")]


def test_a_squatted_default_lock_file_falls_back_to_a_private_one(tmp_path):
    """#39: another user created root's /tmp/mldebug-print-0.lock first, and every rank's
    prints went unlocked (interleaved). Now every process of ours takes the same private
    fallback ($XDG_RUNTIME_DIR here), says so once, and leaves the squatted file alone."""
    uid, gid = second_user()
    squat, before = _squatted_default(tmp_path, uid, gid)
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(squat.parent),
               XDG_RUNTIME_DIR=str(xdg))
    env.pop("MLDEBUG_PRINT_LOCK", None)
    locks, err = _two_writers(env, tmp_path)
    fallback = os.stat(xdg / "mldebug-print.lock")
    assert locks == {f"LOCK {fallback.st_dev} {fallback.st_ino}"}, locks
    assert fallback.st_ino != before.st_ino and fallback.st_uid == os.geteuid()
    assert len(err) == 2 and all(f"is owned by uid {uid}" in x and
                                 f"using {xdg / 'mldebug-print.lock'} instead" in x
                                 for x in err), err
    after = os.stat(squat)
    assert (after.st_uid, after.st_mode, after.st_mtime_ns) == \
        (before.st_uid, before.st_mode, before.st_mtime_ns)
    assert squat.read_text() == "theirs\n"


def test_a_squatted_default_lock_without_a_runtime_dir_uses_the_home_cache(tmp_path):
    """No usable $XDG_RUNTIME_DIR (unset, or another user's): ~/.cache/mldebug, made 0700."""
    uid, gid = second_user()
    squat, before = _squatted_default(tmp_path, uid, gid)
    home = tmp_path / "home"
    home.mkdir()
    theirs = tmp_path / "their-run"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, uid, gid)
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(squat.parent), HOME=str(home),
               XDG_RUNTIME_DIR=str(theirs))
    env.pop("MLDEBUG_PRINT_LOCK", None)
    locks, err = _two_writers(env, tmp_path)
    cache = home / ".cache" / "mldebug"
    [lock] = list(cache.iterdir())
    st = os.stat(lock)
    assert locks == {f"LOCK {st.st_dev} {st.st_ino}"} and lock.name.startswith("print-")
    assert os.stat(cache).st_mode & 0o777 == 0o700 and list(theirs.iterdir()) == []
    assert len(err) == 2 and all(f"using {lock} instead" in x for x in err), err
    assert squat.read_text() == "theirs\n" and os.stat(squat).st_uid == uid

