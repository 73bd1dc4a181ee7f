"""The flight recorder on shared ground: another user's directory, planted symlinks and FIFOs,
acknowledgements that point outside, a forked child, hostile dump files (docs/fr.md, Safety).

A second, unprivileged user is created for the module (useradd; skipped with the reason when
that is not possible). The "rank" answering a trigger is a thread of this test: a real FIFO,
real files, the real node script.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fr_synth as synth
import pytest
from conftest import REPO, run_cli, second_user
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mldebug.fr import node
from mldebug.fr.analyze import analyze
from mldebug.fr.collect import prepare_out, trigger_local_report
from mldebug.fr.loader import expand_inputs, load, load_files
from mldebug.fr.recorder import _atomic_write

HOST = socket.gethostname().split(".")[0]


@pytest.fixture(scope="module")
def other_user() -> Iterator[int]:
    yield from second_user("mldfr")


def test_dir_is_created_0700_and_another_users_or_writable_dir_is_refused(tmp_path, other_user):
    mine = tmp_path / "mine"
    node.private_dir(str(mine))
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    planted = tmp_path / "planted"
    planted.mkdir()
    os.chown(planted, other_user, other_user)
    with pytest.raises(node.UnsafeDir, match=r"belongs to mldfr\d+ \(uid \d+\).*mode 0755"):
        node.private_dir(str(planted))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(node.UnsafeDir, match="mode 0777.*written by other users"):
        node.private_dir(str(open_dir))
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(node.UnsafeDir, match="is a symlink"):
        node.private_dir(str(link))
    # the trigger side refuses the writable one too, and says so instead of using it
    doc = node.trigger(str(open_dir), 1)
    assert doc["ranks"] == [] and "0777" in doc["errors"][0]


def test_enable_refuses_a_directory_another_user_created(tmp_path, other_user):
    pytest.importorskip("torch")
    d = tmp_path / "mldebug-fr-x"
    d.mkdir()
    os.chown(d, other_user, other_user)
    code = f"import mldebug.fr; mldebug.fr.enable({str(d)!r}, on_failure=False)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode != 0 and "another user created it" in r.stderr, r.stderr[-2000:]
    assert list(d.iterdir()) == []


def test_dump_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    d = tmp_path / "d"
    node.private_dir(str(d))
    (d / "fr_rank0").symlink_to(victim)
    _atomic_write(d / "fr_rank0", b"dump")
    assert victim.read_text() == "precious"
    assert not (d / "fr_rank0").is_symlink() and (d / "fr_rank0").read_bytes() == b"dump"
    assert stat.S_IMODE((d / "fr_rank0").stat().st_mode) == 0o600
    assert [p.name for p in d.iterdir()] == ["fr_rank0"]  # no temporary left


def _register(d: Path, pid: int, **extra: object) -> None:
    doc = {"pid": pid, "host": HOST, "rank": 0, **extra}
    (d / f".mldebug-fr-{HOST}-{pid}.json").write_text(json.dumps(doc))


class FakeRank(threading.Thread):
    """Listens on a real FIFO like mldebug.fr's thread and answers with ``answer(token)``."""

    def __init__(self, d: Path, answer, pid: int | None = None) -> None:
        super().__init__(daemon=True)
        self.d, self.answer, self.pid = d, answer, pid or os.getpid()
        _register(d, self.pid)
        os.mkfifo(d / f".mldebug-fr-{HOST}-{self.pid}.trigger", 0o600)

    def run(self) -> None:
        with open(self.d / f".mldebug-fr-{HOST}-{self.pid}.trigger", "rb") as f:
            token = f.read().decode().split()[0]
        done = self.answer(token)
        (self.d / f".mldebug-fr-{HOST}-{self.pid}.done").write_text(json.dumps(done))


def test_done_naming_a_file_outside_the_directory_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's secret")
    secret.chmod(0o600)
    d = tmp_path / "d"
    node.private_dir(str(d))
    rank = FakeRank(d, lambda tok: {"token": tok, "file": str(secret), "rank": 0})
    rank.start()
    out = tmp_path / "out"
    res = trigger_local_report(out, timeout=5, dump_dir=d)
    assert res.files == [] and "outside" in res.errors[0], res
    assert list(out.iterdir()) == []
    # the same through a symlink planted where the protocol expects the dump
    d2 = tmp_path / "d2"
    node.private_dir(str(d2))
    rank = FakeRank(d2, lambda tok: _plant(d2, tok, secret), pid=_other_live_pid())
    rank.start()
    res = trigger_local_report(tmp_path / "out2", timeout=5, dump_dir=d2)
    assert res.files == [] and "dump refused" in " ".join(res.errors), res


def _plant(d: Path, token: str, target: Path) -> dict:
    node.private_dir(str(d / "triggered" / token))
    (d / "triggered" / token / "fr_rank0").symlink_to(target)
    return {"token": token, "file": str(d / "triggered" / token / "fr_rank0"), "rank": 0}


def _other_live_pid() -> int:
    p = subprocess.Popen(["sleep", "30"])
    _other_live_pid.procs.append(p)  # type: ignore[attr-defined]
    return p.pid


_other_live_pid.procs = []  # type: ignore[attr-defined]


@pytest.fixture(autouse=True, scope="module")
def _stop_other_live_pids():
    yield
    for p in _other_live_pid.procs:  # type: ignore[attr-defined]
        p.kill()
        p.wait()
    _other_live_pid.procs.clear()  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", [0o600, 0o644])
def test_output_keeps_the_source_permission(tmp_path, mode):
    d = tmp_path / "d"
    node.private_dir(str(d))
    data = pickle.dumps(synth.dump(0, [synth.entry(1)], world=1))

    def answer(tok: str) -> dict:
        node.private_dir(str(d / "triggered" / tok))
        f = d / "triggered" / tok / "fr_rank0"
        f.write_bytes(data)
        f.chmod(mode)
        return {"token": tok, "file": str(f), "rank": 0}

    FakeRank(d, answer).start()
    res = trigger_local_report(tmp_path / "out", timeout=5, dump_dir=d)
    (f,) = res.files
    assert f.read_bytes() == data and stat.S_IMODE(f.stat().st_mode) == mode


def test_registrations_that_lie_are_refused(tmp_path, other_user):
    victim = tmp_path / "root-file"
    victim.write_text("keep")
    d = tmp_path / "d"
    node.private_dir(str(d))
    # 1. its FIFO is a regular file (a root-owned file hard to tell from a FIFO by name)
    p1 = _other_live_pid()
    _register(d, p1)
    (d / f".mldebug-fr-{HOST}-{p1}.trigger").write_text("keep")
    # 2. its FIFO is a symlink to a file outside
    p2 = _other_live_pid()
    _register(d, p2)
    (d / f".mldebug-fr-{HOST}-{p2}.trigger").symlink_to(victim)
    # 3. malformed: pid is text
    (d / f".mldebug-fr-{HOST}-abc.json").write_text(json.dumps({"pid": "abc", "host": HOST}))
    # 4. written by another user
    p4 = _other_live_pid()
    _register(d, p4)
    os.chown(d / f".mldebug-fr-{HOST}-{p4}.json", other_user, other_user)
    # 5. nested a million levels deep
    (d / f".mldebug-fr-{HOST}-1.json").write_text("[" * 100000)
    doc = node.trigger(str(d), 2)
    errors = sorted(str(r.get("error")) for r in doc["ranks"])
    assert victim.read_text() == "keep"
    assert (d / f".mldebug-fr-{HOST}-{p1}.trigger").read_text() == "keep"
    text = "\n".join(errors)
    assert "trigger FIFO refused: .mldebug" in text and "is not a fifo" in text
    assert "trigger FIFO refused: it is a symlink" in text
    assert "malformed registration .mldebug-fr-" in text and "'pid' is 'abc'" in text
    assert text.count("not a JSON object") == 2, text  # the other user's, the deep one
    r = run_cli("fr", "trigger", "--dir", str(d), "--out", str(tmp_path / "o"), "--timeout", "2")
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr
    assert "malformed registration" in r.stdout


def test_a_forked_child_exiting_keeps_the_parents_registration(tmp_path):
    pytest.importorskip("torch")
    code = textwrap.dedent(f"""
        import os, sys, glob
        import mldebug.fr
        rec = mldebug.fr.enable({str(tmp_path)!r}, on_failure=False)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: atexit handlers run in the child
        os.waitpid(pid, 0)
        print(os.path.exists(rec.registry), os.path.exists(rec.fifo))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.stdout.split() == ["True", "True"], r.stderr[-2000:]


def _hostile_dumps() -> dict[str, bytes]:
    """One per class of bad input; each must be skipped with its reason, fast."""
    base = synth.dump(69, [synth.entry(1)], world=70)
    out: dict[str, bytes] = {}
    big = dict(base, entries=[synth.entry(1, sizes=((10**5000,),))])
    out["huge_int"] = pickle.dumps(big)
    nan = dict(base, entries=[synth.entry(1, sizes=((float("nan"),),))])
    out["nan_size"] = pickle.dumps(nan)
    inf = synth.dump(69, [synth.entry(1)], world=70)
    inf["entries"][0]["collective_seq_id"] = float("inf")
    out["inf_seq"] = pickle.dumps(inf)
    world = synth.dump(69, [synth.entry(1)], world=70)
    world["mldebug"] = {"world_size": 10**12}
    world["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(3)))[:-1] + ", 99999999999]"}}
    out["world"] = pickle.dumps(world)
    n = 200000  # {"entries": [[[[...]]]]} 200,000 lists deep, written opcode by opcode
    out["deep"] = b"\x80\x04}\x8c\x07entries" + b"]" * n + b"a" * (n - 1) + b"s."
    row = list(range(1000))
    shapes = [row] * 1000
    bomb = dict(synth.entry(1), input_sizes=shapes, output_sizes=shapes)
    out["memo_bomb"] = pickle.dumps(dict(base, entries=[bomb] * 4000))
    out["json_deep"] = b'{"entries": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    # tuples nested 300,000 deep as a dict key: hashing it in C overflowed the stack and
    # killed the process (no recursion limit guards hashing); written opcode by opcode
    out["deep_tuple_key"] = b"\x80\x02})" + b"\x85" * 300_000 + b"K\x01s."
    out["deep_tuple_set"] = b"\x80\x04\x8f()" + b"\x85" * 300_000 + b"\x90."
    out["deeper_than_any_stack"] = b"\x80\x02})" + b"\x85" * 5_000_000 + b"K\x01s."
    out["json_huge_int"] = b'{"rank": 5, "entries": [], "version": ' + b"9" * 5000 + b"}"
    return out


def test_one_bad_file_among_70_is_skipped_and_the_others_analysed(tmp_path):
    for name, data in _hostile_dumps().items():
        d = tmp_path / name
        synth.write(d, {r: synth.dump(r, [synth.entry(1), synth.entry(2)], world=70)
                        for r in range(69)})
        (d / "rank_69").write_bytes(data)
        start = time.monotonic()
        ds = load([d])
        a = analyze(ds)
        took = time.monotonic() - start
        assert took < 20, (name, took)
        assert sorted(ds.dumps) == list(range(69)) or name == "world", name
        if name == "world":  # a world size nobody believes: the file is read, the size is not
            assert a.world_size == 70 and len(a.ranks) == 70
            continue
        (problem,) = ds.problems
        assert problem.file.endswith("rank_69") and "skipped" in problem.error, problem
        assert a.missing_ranks == [69] and a.mismatches[0].culprit_ranks == [69]


def test_a_field_holding_tuples_nested_300k_deep_is_read_without_crashing(tmp_path):
    """The loader hashes field values (states, op names, rank lists): a tuple nested 300,000
    deep overflowed the C stack there and killed the process (or the loader worker). The
    file is now read on a thread whose stack fits it, and the field is read as unknown."""
    synth.write(tmp_path, {r: synth.dump(r, [synth.entry(1), synth.entry(2)], world=70)
                           for r in range(69)})
    good = pickle.dumps(synth.dump(69, [dict(synth.entry(1), state="XSTATEX"), synth.entry(2)],
                                   world=70), 2)
    bad = good.replace(b"X\x07\x00\x00\x00XSTATEX", b")" + b"\x85" * 300_000)
    assert bad != good
    (tmp_path / "rank_69").write_bytes(bad)
    for workers in (1, 2):
        ds = load_files(expand_inputs([tmp_path]), workers=workers)
        assert sorted(ds.dumps) == list(range(70)) and not ds.problems
        tl = ds.timelines[ds.dumps[69].timeline]
        assert ds.states[tl.state[0]] == "?"
        assert not analyze(ds).mismatches


def test_trigger_output_directory_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run_cli("fr", "trigger", "--dir", str(tmp_path / "none"), "--timeout", "1", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["out_dir"] is None and doc["files"] == []
    assert list(tmp_path.iterdir()) == []  # nothing in the current directory, nothing left
    out, created = prepare_out(None)
    assert created and stat.S_IMODE(out.stat().st_mode) == 0o700
    assert not str(out).startswith(str(tmp_path))
    out.rmdir()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "fr-x-rank0").write_bytes(b"earlier")
    r = run_cli("fr", "trigger", "--dir", str(tmp_path), "--out", str(tmp_path / "used"))
    assert r.returncode == 2 and "already holds files" in r.stderr
    assert (tmp_path / "used" / "fr-x-rank0").read_bytes() == b"earlier"


# -- property-based: whatever the bytes, the loader parses them or names why not ----------

_scalars = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
_values = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=4)
                       | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=20)
_FIELDS = ["process_group", "collective_seq_id", "p2p_seq_id", "profiling_name", "input_sizes",
           "output_sizes", "input_dtypes", "output_dtypes", "state", "is_p2p", "frames",
           "record_id", "pg_id", "time_created_ns"]


@st.composite
def _dumps(draw: st.DrawFn) -> dict:
    """A real-looking dump with some fields replaced by anything at all."""
    d = synth.dump(draw(st.integers(0, 3)), [synth.entry(i) for i in range(1, 4)], world=4)
    for e in d["entries"]:
        for key in draw(st.lists(st.sampled_from(_FIELDS), max_size=3)):
            e[key] = draw(_values)
    for key in draw(st.lists(st.sampled_from(["rank", "pg_config", "pg_status", "version",
                                              "mldebug", "entries"]), max_size=2)):
        d[key] = draw(_values)
    return d


def _loads_within_bounds(tmp: Path, data: bytes) -> None:
    f = tmp / "rank_1"
    f.write_bytes(data)
    start = time.monotonic()
    ds = load_files([f])
    assert len(ds.dumps) + len(ds.problems) == 1
    analyze(ds)  # whatever was accepted can be analysed
    assert time.monotonic() - start < 5


_PROPS = settings(max_examples=40, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])


@_PROPS
@given(_dumps())
def test_any_pickled_dump_parses_or_is_named(tmp_path, doc):
    _loads_within_bounds(tmp_path, pickle.dumps(doc, protocol=4))


@_PROPS
@given(_dumps())
def test_any_json_dump_parses_or_is_named(tmp_path, doc):
    _loads_within_bounds(tmp_path, json.dumps(doc, default=str).encode())


@_PROPS
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_are_named(tmp_path, data):
    _loads_within_bounds(tmp_path, b"\x80\x04" + data)
    _loads_within_bounds(tmp_path, b"{" + data)


def test_trigger_finds_the_fallback_beside_a_squatted_directory(tmp_path, other_user):
    """Another user created the flight-recorder directory first: the rank moved to a private
    fallback beside it (``NAME-XXXXXXXX``, privdir.private_dir); `fr trigger` on the usual
    directory finds the rank there (a link with the fallback's name is never followed)."""
    import tempfile

    squat = tmp_path / "mldebug-fr-x"
    squat.mkdir()
    os.chown(squat, other_user, other_user)
    fallback = Path(tempfile.mkdtemp(prefix=squat.name + "-", dir=tmp_path))
    (tmp_path / f"{squat.name}-linklink").symlink_to(fallback)  # never followed
    data = pickle.dumps(synth.dump(0, [synth.entry(1)], world=1))

    def answer(tok: str) -> dict:
        node.private_dir(str(fallback / "triggered" / tok))
        f = fallback / "triggered" / tok / "fr_rank0"
        f.write_bytes(data)
        return {"token": tok, "file": str(f), "rank": 0}

    FakeRank(fallback, answer).start()
    assert node.fallback_dirs(str(squat)) == [str(fallback)]
    res = trigger_local_report(tmp_path / "out", timeout=5, dump_dir=squat)
    (f,) = res.files
    assert f.read_bytes() == data


def test_enable_pins_its_directory_a_path_swapped_later_never_redirects_a_dump(tmp_path):
    """enable(dump_dir=D) checks D once on an fd and keeps it: when D is renamed and a link to
    another directory put in its place (whoever owns D's parent can), the dump, the
    registration and its removal at exit all stay in the real directory; nothing is written
    into the link's target."""
    pytest.importorskip("torch")
    d, moved, victim = tmp_path / "d", tmp_path / "d.moved", tmp_path / "victim"
    victim.mkdir()
    code = textwrap.dedent(f"""
        import os, mldebug.fr as fr
        rec = fr.enable({str(d)!r})
        os.rename({str(d)!r}, {str(moved)!r})
        os.symlink({str(victim)!r}, {str(d)!r})
        rec.dump("manual")
        print(sorted(os.listdir({str(moved)!r})))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(victim.iterdir()) == []
    assert "fr_rank0" in r.stdout and any(n.startswith(".mldebug-fr-") for n in eval(r.stdout))
    assert (moved / "fr_rank0").stat().st_size > 0
    assert not any(p.name.startswith(".mldebug-fr-") for p in moved.iterdir())  # removed at exit


FROZEN = """
import ctypes, sys
import mldebug.fr as fr
fr.enable(sys.argv[2])
lib = ctypes.PyDLL(None) if sys.argv[1] == "gil" else ctypes.CDLL(None)  # PyDLL keeps the GIL
m = ctypes.create_string_buffer(64)  # a zeroed pthread mutex, locked twice: frozen in C
lib.pthread_mutex_lock(m)
print("ready", flush=True)
lib.pthread_mutex_lock(m)
"""


FUTEX = {"x86_64": 202, "aarch64": 98}


def _frozen_in_futex(pid: int, timeout: float = 20.0) -> None:
    """Wait until ``pid``'s main thread sleeps in futex(2) (the second mutex lock), twice in
    a row: "ready" is printed just before that call, and a SIGTERM that lands while the main
    thread still runs Python is handled there (dump, then death by SIGTERM: -15), which is
    right for a rank that is not frozen but is not what this test is about."""
    import platform

    nr = FUTEX.get(platform.machine())
    if nr is None:
        pytest.skip(f"futex syscall number unknown on {platform.machine()}")
    end, seen = time.monotonic() + timeout, 0
    while time.monotonic() < end:
        with open(f"/proc/{pid}/syscall") as f:
            seen = seen + 1 if f.read().split()[:1] == [str(nr)] else 0
        if seen >= 2:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never blocked in futex(2)")


@pytest.mark.parametrize("gil", ["gil", "nogil"])
def test_sigterm_ends_a_rank_frozen_in_c_even_holding_the_gil(tmp_path, gil):
    """fr.enable()'s SIGTERM handler never makes a rank harder to stop: frozen in C holding
    the GIL (no Python thread can run) the rank still ends on SIGTERM (the guard process ends
    it as SIGTERM's default would have) instead of living until a SIGKILL; frozen in C without
    the GIL (a collective's wait) it dumps first and exits 143. The guard leaves with it."""
    pytest.importorskip("torch")
    import psutil

    (tmp_path / "frozen.py").write_text(FROZEN)
    p = subprocess.Popen([sys.executable, str(tmp_path / "frozen.py"), gil, str(tmp_path / "d")],
                         stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        guards = psutil.Process(p.pid).children()
        assert [" ".join(g.cmdline()).count("mldebug-fr-guard") for g in guards] == [1]
        _frozen_in_futex(p.pid)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)  # without the guard: never (the mutex is never released)
        assert rc == (-signal.SIGKILL if gil == "gil" else 128 + signal.SIGTERM), rc
        assert (tmp_path / "d" / "fr_rank0").exists() == (gil == "nogil")
        psutil.wait_procs(guards, timeout=10)
        assert not any(g.is_running() for g in guards)
    finally:
        p.kill()
        p.wait()


def test_enable_prunes_the_registrations_dead_ranks_left(tmp_path, other_user):
    """Ranks SIGKILLed or OOM-killed never unregister: their .json/.trigger/.done piled up in
    the user's flight-recorder directory. The next recorder there removes those of processes
    that no longer run (or whose pid another process now holds), and only its own user's files
    with mldebug's names; live ranks, other hosts, other users' files and links stay."""
    from mldebug.fr.recorder import Recorder
    from mldebug.ranks import start_time

    d = tmp_path / "fr"
    node.private_dir(str(d))
    dead, dead2, dead3 = (subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(3))
    for p in (dead, dead2, dead3):
        p.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        def reg(pid: int, host: str = HOST, **doc: object) -> Path:
            stem = d / f".mldebug-fr-{host}-{pid}"
            stem.with_name(stem.name + ".json").write_text(json.dumps({"pid": pid, **doc}))
            os.mkfifo(stem.with_name(stem.name + ".trigger"), 0o600)
            stem.with_name(stem.name + ".done").write_text("{}")
            return stem
        gone = reg(dead.pid)
        reused = reg(live.pid, start_time=1)  # the pid now names another process
        kept = [reg(os.getpid(), start_time=start_time(os.getpid())),
                reg(dead.pid, host="other-host")]
        theirs = reg(dead2.pid)
        for suffix in (".json", ".trigger", ".done"):
            os.chown(theirs.with_name(theirs.name + suffix), other_user, other_user,
                     follow_symlinks=False)
        link = d / f".mldebug-fr-{HOST}-{dead3.pid}.json"
        link.symlink_to(tmp_path / "target")
        rec = Recorder(dump_dir=d, rank=0, host=HOST, tag="")
        rec.pid = -1  # not one of the registered pids
        assert rec.prune_stale() == 2
        names = {p.name for p in d.iterdir()}
        for stem in (gone, reused):
            assert not any(n.startswith(stem.name + ".") for n in names), names
        for stem in (*kept, theirs):
            assert {stem.name + s for s in (".json", ".trigger", ".done")} <= names, stem
        assert link.is_symlink()
    finally:
        live.kill()
        live.wait()
