"""The capture package without torch: watchdog dumps in plain Python processes (spinning,
sleeping, holding the GIL in a C call), the private directory rules, the faulthandler parser,
and `mldebug hang --signal` against processes with and without a handler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from mldebug.errors import MldebugError
from mldebug.hang.signal_node import NO_HANDLER, catches
from mldebug.privdir import private_dir
from mldebug.stacks import parse_faulthandler

PRELUDE = "import ctypes, os, sys, time\nimport mldebug\nfrom gil_hold import hold_gil\n"


def run_py(code: str, tmp: Path, timeout: float = 60, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    script = tmp / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(code))
    full = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'recipes'}", **(env or {}))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=full, cwd=tmp, timeout=timeout, stdin=subprocess.DEVNULL)


def only_dump(d: Path) -> dict:
    files = list((d / "dumps").glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def main_frames(doc: dict, key: str = "dump") -> list[str]:
    main = next(t for t in doc[key] if t["thread_name"] == "MainThread")
    return [f"{f['name']}:{f['line']}" for f in main["frames"]]


def test_stall_dump_is_what_hang_analyze_reads(tmp_path):
    r = run_py("""
        def stuck_here():
            time.sleep(3)          # the line the dump must name
        wd = mldebug.watchdog(timeout=0.5, dir="cap")
        for _ in range(3):
            mldebug.beat()
        stuck_here()
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "no beat for" in r.stderr
    d = tmp_path / "cap"
    assert (d.stat().st_mode & 0o777) == 0o700
    doc = only_dump(d)
    assert doc["format"] == "mldebug.hang.dump/1" and doc["capture"]["route"] == "python"
    assert doc["capture"]["reason"] == "stall" and doc["capture"]["beats"] == 3
    assert main_frames(doc)[0] == "stuck_here:6"
    assert not any(t["thread_name"] == "mldebug-capture" for t in doc["dump"])
    a = run_cli("hang", "analyze", str(d), "--json")
    assert a.returncode == 0, a.stderr
    report = json.loads(a.stdout)
    assert report["processes"] and "stuck_here" in json.dumps(report["groups"])


def test_dump_format_is_hangs():
    from mldebug.capture.handler import DUMP_FORMAT
    from mldebug.hang.collect import DUMP_FORMAT as HANG

    assert DUMP_FORMAT == HANG


def test_spinning_in_python_is_seen_and_beats_reset_the_clock(tmp_path):
    r = run_py("""
        wd = mldebug.watchdog(timeout=0.6, dir="cap")
        for _ in range(20):                    # beating: never a stall
            time.sleep(0.1); mldebug.beat()
        def spin():
            t = time.monotonic()
            while time.monotonic() - t < 2.5:  # spinning in Python, no beat
                pass
        spin()
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    doc = only_dump(tmp_path / "cap")
    assert doc["capture"]["beats"] == 20
    assert main_frames(doc)[0].startswith("spin:")


def test_dump_and_abort_exits_with_the_distinct_code(tmp_path):
    r = run_py("""
        mldebug.watchdog(timeout=0.5, dir="cap", on_stall="dump+abort")
        time.sleep(30)
        print("not reached")
    """, tmp_path)
    from mldebug.capture import STALL_EXIT_CODE

    assert r.returncode == STALL_EXIT_CODE == 54, (r.returncode, r.stderr)
    assert "not reached" not in r.stdout
    assert only_dump(tmp_path / "cap")["capture"]["reason"] == "stall"


def test_dump_and_abort_with_the_gil_held_exits_with_the_same_code(tmp_path):
    # no Python can run: the kernel timer's signal -> faulthandler writes -> _exit(54)
    r = run_py("""
        def in_c():
            hold_gil(20)
        mldebug.watchdog(timeout=0.5, dir="cap", on_stall="dump+abort", poll=0.1)
        in_c()
        print("not reached")
    """, tmp_path)
    from mldebug.capture import STALL_EXIT_CODE

    assert r.returncode == STALL_EXIT_CODE, (r.returncode, r.stderr)
    assert "not reached" not in r.stdout and "exiting with code" not in r.stderr, r.stderr
    [text] = (tmp_path / "cap" / "faulthandler").glob("*.gil.txt")
    [main] = [t for t in parse_faulthandler(text.read_text(), 1) if t["frames"]
              and t["frames"][0]["name"] == "hold_gil"]
    assert [f["name"] for f in main["frames"][:3]] == ["hold_gil", "in_c", "<module>"]


@pytest.mark.parametrize("setup,why", [
    ("signal.signal(ABORT_SIGNAL, mine)", "signal 54 has a Python handler"),
    ("sys.modules['ctypes'] = None", "no ctypes"),
])
def test_abort_route_unavailable_falls_back_to_faulthandler_exit_1(tmp_path, setup, why):
    r = run_py(f"""
        import signal
        from mldebug.capture.abort import ABORT_SIGNAL
        def mine(*a): pass
        {setup}
        wd = mldebug.watchdog(timeout=0.5, dir="cap", on_stall="dump+abort", poll=0.1)
        wd.close()
        assert signal.getsignal(ABORT_SIGNAL) in (mine, signal.SIG_DFL)  # left as it was
        mldebug.watchdog(timeout=0.5, dir="cap", on_stall="dump+abort", poll=0.1)
        hold_gil(20)
    """, tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"will exit with code 1 (faulthandler), not 54: {why}" in r.stderr, r.stderr
    [text] = (tmp_path / "cap" / "faulthandler").glob("*.gil.txt")
    assert "hold_gil" in text.read_text()


def test_abort_timer_is_given_back_on_close_and_not_inherited_by_fork(tmp_path):
    r = run_py("""
        from mldebug.capture.abort import ABORT_SIGNAL, signal_free
        wd = mldebug.watchdog(timeout=0.5, dir="cap", on_stall="dump+abort", poll=0.1)
        assert signal_free(ABORT_SIGNAL) == "signal 54 is already caught"
        pid = os.fork()
        if pid == 0:          # no timer here: outlives the parent's timeout
            time.sleep(2)
            os._exit(7)
        while not (done := os.waitpid(pid, os.WNOHANG))[0]:
            mldebug.beat(); time.sleep(0.05)
        assert os.waitstatus_to_exitcode(done[1]) == 7, done
        wd.close()
        assert signal_free(ABORT_SIGNAL) is None, signal_free(ABORT_SIGNAL)
        hold_gil(2)           # no timer left to fire
        print("alive")
    """, tmp_path)
    assert r.returncode == 0 and "alive" in r.stdout, (r.returncode, r.stderr)


def test_a_handler_the_program_sets_later_is_left_alone_at_close(tmp_path):
    r = run_py("""
        import signal
        from mldebug.capture.abort import ABORT_SIGNAL
        wd = mldebug.watchdog(timeout=0.5, dir="cap", on_stall="dump+abort", poll=0.1)
        got = []
        signal.signal(ABORT_SIGNAL, lambda *a: got.append(1))
        wd.close()
        os.kill(os.getpid(), ABORT_SIGNAL)   # theirs: handled, not _exit
        time.sleep(0.2)
        print("handled", got)
    """, tmp_path)
    assert r.returncode == 0 and "handled [1]" in r.stdout, (r.returncode, r.stderr)


def test_dump_and_continue_dumps_again_at_2x_and_4x(tmp_path):
    r = run_py("""
        mldebug.watchdog(timeout=0.5, dir="cap", on_stall="dump+continue", poll=0.05)
        time.sleep(3)
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    stalls = [float(x.split("no beat for ")[1].split("s")[0])
              for x in r.stderr.splitlines() if "no beat for" in x]
    assert len(stalls) == 3 and stalls[1] >= 1.0 and stalls[2] >= 2.0, r.stderr
    doc = only_dump(tmp_path / "cap")
    assert doc["dump"] and doc["dump_later"] and doc["capture"]["seq"] == 2


def test_gil_held_in_a_c_call_is_dumped_by_faulthandler(tmp_path):
    r = run_py("""
        def in_c():
            hold_gil(3)   # no Python thread can run
        mldebug.watchdog(timeout=0.5, dir="cap", poll=0.1)
        in_c()
        time.sleep(0.5)
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    doc = only_dump(tmp_path / "cap")
    assert doc["capture"]["route"] == "faulthandler", doc["capture"]
    assert "GIL was held" in doc["capture"]["note"]
    assert main_frames(doc)[:2] == ["hold_gil:24", "in_c:6"]
    a = run_cli("hang", "analyze", str(tmp_path / "cap"), "--json")
    assert "in_c" in a.stdout


def test_a_slow_stall_dump_is_not_reported_as_the_gil_held(tmp_path):
    """The watchdog thread itself writes the stall dump (flight recorder, ring: seconds on a
    loaded node). Its GIL guard fires when the thread cannot run for timeout + poll; a dump
    longer than that used to be followed by a second dump saying "the GIL was held", with
    I/O that made `hang --watch` see a stuck rank move (CI: test_views_jobs)."""
    r = run_py("""
        import mldebug.capture.handler as h
        slow = h.DumpHandler._extras
        def _extras(self, reason):
            time.sleep(2.0)   # longer than timeout + poll: the guard would fire meanwhile
            return slow(self, reason)
        h.DumpHandler._extras = _extras
        mldebug.watchdog(timeout=0.5, dir="cap", poll=0.1)
        time.sleep(4.5)       # no beat: one stall (on_stall="dump": once), in Python
        print("done")
    """, tmp_path)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    assert "no beat for" in r.stderr and "GIL was held" not in r.stderr, r.stderr
    doc = only_dump(tmp_path / "cap")
    assert doc["capture"]["route"] == "python", doc["capture"]


def test_context_manager_and_decorator(tmp_path):
    r = run_py("""
        import mldebug.capture as cap
        with mldebug.watchdog(timeout=30, dir="a") as wd:
            wd.beat()
        assert cap.handler._HANDLER is None
        @mldebug.watchdog(timeout=0.4, dir="b", poll=0.05)
        def train():
            time.sleep(1.5)
        train()
        print("ok")
    """, tmp_path)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert not list((tmp_path / "a" / "dumps").glob("*"))
    assert main_frames(only_dump(tmp_path / "b"))[0].startswith("train:")


def test_private_dir_refuses_links_and_shared_dirs(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(MldebugError, match="symlink"):
        private_dir(tmp_path / "link")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(MldebugError, match="can be written by other users"):
        private_dir(shared)
    os.chown(tmp_path / "real", 65534, 65534)
    with pytest.raises(MldebugError, match=r"belongs to .*uid 65534"):
        private_dir(tmp_path / "real")
    assert (private_dir(tmp_path / "new" / "deep").stat().st_mode & 0o777) == 0o700


def test_parse_faulthandler_text():
    text = ('Thread 0x00007f0000000002 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 324 in wait\n\n'
            'Current thread 0x00007f0000000001 (most recent call first):\n'
            '  File "/job/train.py", line 12 in step\n'
            '  File "/job/train.py", line 30 in <module>\n'
            'Thread 0x00007f0000000002 (most recent call first):\n'   # a second dump: ignored
            '  File "/x.py", line 1 in other\n')
    threads = parse_faulthandler(text, 42, main_ident=0x7F0000000001, prefixes=["/job"])
    assert [t["thread_name"] for t in threads] == [None, "MainThread"]
    assert threads[1]["os_thread_id"] == 42
    assert [(f["name"], f["line"], f["short_filename"]) for f in threads[1]["frames"]] == [
        ("step", 12, "train.py"), ("<module>", 30, "train.py")]


HANDLER_JOB = """
    def waiting():
        time.sleep(60)
    mldebug.install_dump_handler(dir="cap", poll=0.1)
    os.write(1, b"ready\\n")
    if os.environ.get("HOLD_GIL"):
        hold_gil(60)
    waiting()
"""


def start(tmp: Path, code: str, env: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(code))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'recipes'}", **env), cwd=tmp)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.parametrize("hold_gil,route,frame", [(False, "python", "waiting"),
                                                  (True, "faulthandler", "<module>")])
def test_signal_collects_from_a_rank_with_a_handler(tmp_path, hold_gil, route, frame):
    env = {"RANK": "5", "WORLD_SIZE": "8", "HOLD_GIL": "1" if hold_gil else ""}
    p = start(tmp_path, HANDLER_JOB, env)
    try:
        time.sleep(0.3)
        r = run_cli("hang", "--signal", "--pid", str(p.pid), "--timeout", "5", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        rep = json.loads(r.stdout)
        assert [x["rank"] for x in rep["processes"]] == [5], rep
        assert frame in json.dumps(rep["groups"]) + json.dumps(rep["stacks"])  # hang JSON v2: stacks apart
        assert [f["code"] for f in rep["capture"]["findings"]] == [f"capture-route-{route}"]
        assert rep["capture"]["findings"][0]["title"].startswith("rank 5 answered through")
        saved = json.loads((tmp_path / "cap" / "dumps" / next(
            iter(os.listdir(tmp_path / "cap" / "dumps")))).read_text()) if not hold_gil else None
        assert hold_gil or saved["capture"]["route"] == route
        assert p.poll() is None  # asked, not hurt
    finally:
        p.kill()
        p.wait()


def test_signal_never_sends_to_a_rank_without_handler(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import os, time\nos.write(1, b'ready\\n')\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, RANK="0", WORLD_SIZE="1"))
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert not catches(p.pid, 10)
        r = run_cli("hang", "--signal", "--pid", str(p.pid), "--timeout", "2", "--json")
        rep = json.loads(r.stdout)
        assert r.returncode == 1
        assert [e["error"] for e in rep["errors"]] == [NO_HANDLER]
        [f] = rep["capture"]["findings"]
        assert f["code"] == "capture-no-handler" and "mldebug.watchdog()" in f["fix"]
        human = run_cli("hang", "--signal", "--pid", str(p.pid), "--timeout", "2")
        assert "rank 0: no dump handler, not signalled" in human.stdout
        time.sleep(0.3)
        assert p.poll() is None  # SIGUSR1 would have killed it
    finally:
        p.kill()
        p.wait()


def test_lazy_exports_do_not_import_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, mldebug; mldebug.watchdog; "
                        "mldebug.beat; mldebug.install_dump_handler; import mldebug.trace; "
                        "print('torch' in sys.modules)"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.stdout.strip() == "False", r.stderr


def test_stall_also_dumps_the_flight_recorder_and_the_ring(tmp_path):
    r = run_py("""
        import mldebug.fr, mldebug.trace
        mldebug.fr.enable("fr")
        mldebug.trace.enable(events="calls", ring=16)
        def waiting_here():
            time.sleep(2)
        mldebug.watchdog(timeout=0.5, dir="cap", poll=0.1)
        waiting_here()
    """, tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    meta = only_dump(tmp_path / "cap")["capture"]
    assert meta["flight_recorder"] == str(tmp_path / "fr" / "fr_rank0")
    assert (tmp_path / "fr" / "fr_rank0").stat().st_size > 0
    ring = json.loads(Path(meta["trace"]).read_text())
    assert "waiting_here" in {loc[2] for loc in ring["locations"]}


def test_the_stacks_and_the_ring_are_written_before_the_slow_flight_recorder_dump(tmp_path):
    # torch's first flight-recorder dump in a process imports torch._inductor (seconds):
    # `mldebug trace show` and `hang --signal` read the stacks and the ring without it
    r = run_py("""
        import json, signal, threading, mldebug.fr, mldebug.trace
        from pathlib import Path
        rec = mldebug.fr.enable("fr")
        mldebug.trace.enable(events="calls", ring=16)
        go = threading.Event()
        slow_dump = rec.dump
        def held_dump(*a, **k):
            go.wait(30)
            return slow_dump(*a, **k)
        rec.dump = held_dump
        h = mldebug.install_dump_handler(dir="cap", poll=0.1)
        def waiting_here():
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(300):
                time.sleep(0.02)
                p = next(iter(Path("cap/dumps").glob("*.json")), None)
                if p is not None:
                    break
            first = json.loads(p.read_text())["capture"]
            go.set()
            for _ in range(300):
                time.sleep(0.02)
                after = json.loads(p.read_text())["capture"]
                if "flight_recorder" in after:
                    break
            print(json.dumps({"first": first, "after": after}))
        waiting_here()
    """, tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert "trace" in got["first"] and "flight_recorder" not in got["first"]
    ring = json.loads(Path(got["first"]["trace"]).read_text())
    assert "waiting_here" in {loc[2] for loc in ring["locations"]}
    assert got["after"]["flight_recorder"] == str(tmp_path / "fr" / "fr_rank0")
    assert got["after"]["seq"] == got["first"]["seq"]  # one dump, completed


def test_stale_registry_entries_are_pruned_and_own_entry_removed_at_exit(tmp_path):
    from mldebug.capture.handler import REGISTRY_FORMAT
    from mldebug.dist import short_hostname
    from mldebug.privdir import own_registry_dir

    stale = own_registry_dir() / f"{short_hostname()}-4194999.json"
    stale.write_text(json.dumps({"format": REGISTRY_FORMAT, "pid": 4194999, "start_time": 1}))
    foreign = own_registry_dir() / f"{short_hostname()}-notours.json"
    foreign.write_text("{}")
    try:
        r = run_py("""
            h = mldebug.install_dump_handler(dir="cap")
            print(h.registry_path.exists(), h.registry_path)
        """, tmp_path)
        existed, own = r.stdout.split()
        assert existed == "True", r.stderr
        assert not Path(own).exists()  # removed at exit
        assert not stale.exists()
        assert foreign.exists()  # not an mldebug entry: left alone
        # nor its temporary file (privdir.write_private: ".NAME.PID.tmp")
        assert not list(own_registry_dir().glob(f".{Path(own).name}.*.tmp"))
    finally:
        foreign.unlink(missing_ok=True)
        stale.unlink(missing_ok=True)


def test_a_registry_entry_removed_under_a_live_rank_comes_back(tmp_path):
    """Another rank's prune can remove a live rank's entry when pids repeat (one home shared by
    nodes with their own pid namespaces, a restarted job); the handler registers again on its
    next poll, so `hang --signal` still finds the rank."""
    r = run_py("""
        import os, time
        h = mldebug.install_dump_handler(dir="cap", poll=0.1)
        os.unlink(h.registry_path)
        deadline = time.monotonic() + 10
        while not h.registry_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(h.registry_path.exists())
    """, tmp_path)
    assert r.stdout.split() == ["True"], r.stderr


def test_unknown_signal_is_a_usage_error():
    r = run_cli("hang", "--signal", "SIGNOPE")
    assert r.returncode == 2 and "not a signal name or number" in r.stderr


def test_locals_when_asked(tmp_path):
    r = run_py("""
        def stuck(step, lr=0.5):
            batch = list(range(3))
            time.sleep(1.5)
        mldebug.watchdog(timeout=0.3, dir="cap", locals=True, poll=0.05)
        stuck(41)
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    doc = only_dump(tmp_path / "cap")
    main = next(t for t in doc["dump"] if t["thread_name"] == "MainThread")
    got = {v["name"]: (v["repr"], v["arg"]) for v in main["frames"][0]["locals"]}
    assert got == {"step": ("41", True), "lr": ("0.5", True), "batch": ("[0, 1, 2]", False)}
    a = run_cli("hang", "analyze", str(tmp_path / "cap"), "--json")
    assert a.returncode == 0 and "stuck" in a.stdout


def test_a_signal_someone_else_handles_is_refused(tmp_path):
    r = run_py("""
        import signal
        signal.signal(signal.SIGUSR1, lambda *a: None)   # e.g. a SLURM requeue handler
        try:
            mldebug.watchdog(timeout=10, dir="cap")
        except Exception as e:
            print(str(e))
        wd = mldebug.watchdog(timeout=10, dir="cap", signum="SIGUSR2")
        print("ok", wd.signum == signal.SIGUSR2)
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "SIGUSR1 already has a handler" in r.stdout and 'signum="SIGUSR2"' in r.stdout
    assert "ok True" in r.stdout


def test_registrations_take_turns_and_a_stopped_holder_never_holds_up_the_job(tmp_path):
    """The registry's ranks prune and register one at a time (a prune could otherwise unlink
    a rank's live entry just renamed over a stale one of the same name); a holder stopped
    mid-registration delays the next rank by the bound, never more."""
    import fcntl
    import time

    from mldebug.capture.handler import _registry_lock

    reg = tmp_path / "reg"
    reg.mkdir(mode=0o700)
    with _registry_lock(reg):
        fd = os.open(reg / ".lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # held: another registration waits
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    held = os.open(reg / ".lock", os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # a rank stopped while it registers
        t0 = time.monotonic()
        with _registry_lock(reg, wait=0.3):
            waited = time.monotonic() - t0
        assert 0.3 <= waited < 30, waited
    finally:
        os.close(held)
    with _registry_lock(reg, wait=30):  # released: taken at once
        pass
    assert (reg / ".lock").stat().st_mode & 0o777 == 0o600


def test_the_default_directory_is_per_job_and_never_the_jobs_source_directory(tmp_path,
                                                                              monkeypatch):
    """Issue #40: ./mldebug-capture landed in the job's working directory (often its source
    checkout). Now: $MLDEBUG_DIR, else a per-job directory under the user's state home; a real
    watchdog dump lands there, 0700, and nothing is created in the working directory."""
    from mldebug.privdir import default_dir

    code = textwrap.dedent("""
        import os, sys, time, json, mldebug
        from mldebug.privdir import default_dir
        print(default_dir(), flush=True)
        wd = mldebug.watchdog(timeout=0.5, on_stall="dump")
        time.sleep(2.5)
        wd.close()
    """)
    src = tmp_path / "checkout"
    src.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLDEBUG_DIR", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR")}
    env.update(PYTHONPATH=str(REPO), XDG_STATE_HOME=str(tmp_path / "state"),
               TORCHELASTIC_RUN_ID="abc-123", RANK="0", WORLD_SIZE="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=src, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    where = Path(r.stdout.splitlines()[0])
    assert where == tmp_path / "state" / "mldebug" / "capture" / "run_abc-123"
    assert list(src.iterdir()) == []  # nothing in the job's working directory
    assert [p.name for p in (where / "dumps").iterdir()][0].endswith(".json")
    assert (where.stat().st_mode & 0o777) == 0o700
    # the key is one path component whatever the launcher put in it; $MLDEBUG_DIR wins
    monkeypatch.delenv("MLDEBUG_DIR", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "../../etc")
    d = default_dir()
    assert d.name == "run_.._.._etc" and d.parent.name == "capture"
    monkeypatch.setenv("MLDEBUG_DIR", str(tmp_path / "mine"))
    assert default_dir() == tmp_path / "mine"
