"""Safe on a shared cluster, as a table: one row per hostile or careless input, each run
against every command it applies to (docs/safety.md lists the classes and rows).

A new command is covered by adding it to the COMMANDS tables below. Commands run in-process
(``mldebug.cli.main``) where they cannot hang the test; a process is started only where the
row is about processes (signals, a rank's secret command line, SIGKILL of mldebug). Rows
about another user run as root with a second real user (useradd), as test_fr_hostile does.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import REPO, second_user

from mldebug.cli import main
from mldebug.fanout import NodeResult

ESC = "\x1b]52;c;aGFja2Vk\x07\x1b[2J\x9b31m"  # OSC 52 clipboard write, screen clear, C1 CSI
SECRET = "sk-live-abcdefghijklmnopqrstuvwx"
URL_PW = "hunter2pass"


@pytest.fixture(scope="module")
def other_user() -> Iterator[int]:
    yield from second_user("mldst")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err, err
    return rc, out, err


# -- the commands that write a directory: argv reaching the --out check -----------------------
def _src(tmp: Path) -> Path:
    src = tmp / "src"
    (src / "model").mkdir(parents=True, exist_ok=True)
    (src / "train.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    return src


OUT_COMMANDS: dict[str, Callable[[Path, str], list[str]]] = {
    "make-tiny-dataset": lambda s, o: ["make-tiny-dataset", str(s / "train.jsonl"), "-n", "1",
                                       "--out", o],
    "make-tiny": lambda s, o: ["make-tiny", "llama", "--out", o],
    "shrink-layers": lambda s, o: ["shrink-layers", str(s / "model"), "--layers", "1",
                                   "--no-measure", "--out", o],
    "hang --out": lambda s, o: ["hang", "--pattern", "zzz-no-such-process", "--out", o],
    "fr trigger --out": lambda s, o: ["fr", "trigger", "--dir", str(s / "nofr"), "--out", o],
}


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else b"")
            for p in sorted(d.rglob("*"))}


# -- class: path tricks ---------------------------------------------------------------------
@pytest.mark.parametrize("cmd", sorted(OUT_COMMANDS))
def test_path_dotdot_after_a_missing_directory_is_refused(cmd, tmp_path, capsys, monkeypatch):
    """`--out data/missing/..` once made --force delete data/ (row: path-dotdot)."""
    monkeypatch.chdir(tmp_path)
    src = _src(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    (data / "precious").write_text("keep")
    before = _tree(data)
    for extra in ([], ["--force"]) if cmd != "fr trigger --out" else ([],):
        rc, out, err = _cli(OUT_COMMANDS[cmd](src, "data/missing/..") + extra, capsys)
        assert rc == 2 and "'..'" in err, (cmd, rc, err)
        assert _tree(data) == before and not (data / "missing").exists()


@pytest.mark.parametrize("cmd", sorted(OUT_COMMANDS))
def test_path_out_that_is_a_symlink_is_refused(cmd, tmp_path, capsys, monkeypatch):
    """row: path-symlink - a link to a directory is never written through."""
    monkeypatch.chdir(tmp_path)
    src = _src(tmp_path)
    real = tmp_path / "real"
    real.mkdir()
    (real / "f").write_text("keep")
    (tmp_path / "link").symlink_to(real)
    rc, out, err = _cli(OUT_COMMANDS[cmd](src, "link"), capsys)
    assert rc == 2 and "link" in err, (cmd, err)
    assert _tree(real) == {"f": b"keep"}


@pytest.mark.parametrize("cmd", sorted(c for c in OUT_COMMANDS if c != "fr trigger --out"))
def test_path_force_never_replaces_what_mldebug_did_not_write(cmd, tmp_path, capsys, monkeypatch):
    """row: path-force-unmarked."""
    monkeypatch.chdir(tmp_path)
    src = _src(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "data.bin").write_text("x")
    rc, out, err = _cli(OUT_COMMANDS[cmd](src, str(theirs)) + ["--force"], capsys)
    assert rc == 2 and "not written by" in err, (cmd, err)
    assert _tree(theirs) == {"data.bin": b"x"}


@pytest.mark.parametrize("cmd", sorted(OUT_COMMANDS))
def test_path_empty_directory_of_another_user_is_refused(cmd, tmp_path, capsys, monkeypatch,
                                                          other_user):
    """row: path-other-users-dir - they could plant links in it while we write (root once
    overwrote files it was pointed at)."""
    monkeypatch.chdir(tmp_path)
    src = _src(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user, -1)
    rc, out, err = _cli(OUT_COMMANDS[cmd](src, str(theirs)), capsys)
    assert rc == 2 and "another user" in err or "not to you" in err, (cmd, err)
    assert list(theirs.iterdir()) == [] and theirs.stat().st_uid == other_user


def test_path_hang_out_files_are_private_and_replaced_whole(tmp_path, capsys, monkeypatch):
    """row: path-private-files - hang --out writes 0700/0600, built aside, swapped in."""
    monkeypatch.chdir(tmp_path)
    rc, _, _ = _cli(["hang", "--pattern", "zzz-no-such-process", "--out", "run"], capsys)
    assert rc == 1
    run = tmp_path / "run"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    for f in run.rglob("*"):
        if f.is_file():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    rc, _, _ = _cli(["hang", "--pattern", "zzz-no-such-process", "--out", "run", "--force"],
                    capsys)
    assert rc == 1 and (run / "report.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run.")] == []


@pytest.mark.parametrize("cmd", sorted(OUT_COMMANDS))
def test_path_a_second_writer_to_the_same_out_is_refused_and_writes_nowhere(cmd, tmp_path, capsys,
                                                                           monkeypatch):
    """row: path-second-writer (#39: two `hang --out D` started together both said 'saved',
    D held one run's dumps). A run writing o holds its claim; another to o is told at once."""
    from mldebug import paths

    monkeypatch.chdir(tmp_path)
    src = _src(tmp_path)
    if cmd == "shrink-layers":  # it reads its model before the --out claim: a real tiny one
        assert _cli(["make-tiny", "llama", "--out", str(src / "model"), "--force"], capsys)[0] == 0
    with paths.staged(tmp_path / "o", command="the first run", private=True) as first:
        first.write("mine", "first run's")
        rc, out, err = _cli(OUT_COMMANDS[cmd](src, "o"), capsys)
        assert rc == 2 and "another mldebug run is writing" in err and "wrote nothing" in err, \
            (cmd, rc, err)
    assert (tmp_path / "o" / "mine").read_text() == "first run's"
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [".mldebug-output", "mine"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".o.")] == []


def test_path_a_killed_writers_claim_is_taken_over_a_planted_one_refused(tmp_path, capsys,
                                                                        monkeypatch, other_user):
    """row: path-stale-claim - a run killed while writing leaves its claim (ours, lock free):
    the next run takes it over; one another user planted is refused, never entered."""
    from mldebug.paths import CLAIM_LOCK

    monkeypatch.chdir(tmp_path)
    claim = tmp_path / ".run.tmp-writing"
    claim.mkdir(mode=0o700)
    (claim / CLAIM_LOCK).write_text("")  # its writer is gone: nobody holds the lock
    (claim / "dumps").mkdir()
    rc, _, err = _cli(["hang", "--pattern", "zzz-no-such-process", "--out", "run"], capsys)
    assert rc == 1 and "saved" in err and (tmp_path / "run" / "report.json").is_file()
    assert not claim.exists()
    planted = tmp_path / ".again.tmp-writing"
    planted.mkdir(mode=0o700)
    os.chown(planted, other_user, -1)
    rc, _, err = _cli(["hang", "--pattern", "zzz-no-such-process", "--out", "again"], capsys)
    assert rc == 2 and "not a private directory of yours" in err, err
    assert planted.stat().st_uid == other_user and not (tmp_path / "again").exists()


def test_path_two_hang_out_runs_started_together_one_wins_whole(secret_rank, tmp_path):
    """row: path-second-writer, for real: two `mldebug hang --pid P --out D` processes at once.
    One saves D whole; the other exits 2 saying so (whichever order they reach D in)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "mldebug", "hang", "--pid", str(secret_rank.pid), "--out",
            str(tmp_path / "D")]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path) for _ in range(2)]
    done = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    for p in procs:
        if p.stdout:
            p.stdout.close()
        if p.stderr:
            p.stderr.close()
    assert sorted(rc for rc, _ in done) == [0, 2], done
    loser = next(err for rc, err in done if rc == 2)
    assert "another mldebug run is writing" in loser or "was filled by another run" in loser
    assert "saved" not in loser
    dumps = list((tmp_path / "D" / "dumps").iterdir())
    assert len(dumps) == 1 and (tmp_path / "D" / "report.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".D.")] == []


VIEW_COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "fr analyze --html": lambda f: ["fr", "analyze", str(FIXTURES / "fr" / "raw_gloo"),
                                    "--html", str(f)],
    "fr analyze --trace-event": lambda f: ["fr", "analyze",
                                           str(FIXTURES / "fr" / "raw_gloo"),
                                           "--trace-event", str(f)],
}
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("cmd", sorted(VIEW_COMMANDS))
@pytest.mark.parametrize("where", ["other-users-dir", "world-writable-no-sticky"])
def test_path_views_follow_the_out_rules_for_their_directory(cmd, where, tmp_path, capsys,
                                                             other_user):
    """row: path-view-shared-dir (#39: --html/--trace-event wrote into a directory any user can
    write, where --out refuses): a directory of another user, or one others can write without
    the sticky bit, is refused before any work; root's sticky /tmp-like directory is fine."""
    d = tmp_path / where
    d.mkdir()
    if where == "other-users-dir":
        os.chown(d, other_user, -1)
        os.chmod(d, 0o1777)
    else:
        os.chmod(d, 0o777)
    rc, out, err = _cli(VIEW_COMMANDS[cmd](d / "view.out"), capsys)
    assert rc == 2 and "another user could swap the file" in err, (cmd, where, err)
    assert list(d.iterdir()) == []
    sticky = tmp_path / "sticky"
    sticky.mkdir(mode=0o777, exist_ok=True)
    os.chmod(sticky, 0o1777)  # owned by us (root here), like /tmp
    rc, out, err = _cli(VIEW_COMMANDS[cmd](sticky / f"{where}.out"), capsys)
    assert rc == 0 and (sticky / f"{where}.out").is_file(), err


# -- class: links ----------------------------------------------------------------------------
LINK_READERS: dict[str, Callable[[Path], list[str]]] = {
    "hang analyze": lambda d: ["hang", "analyze", str(d)],
    "fr analyze": lambda d: ["fr", "analyze", str(d)],
    "mem report": lambda d: ["mem", "report", str(d / "link.pickle")],
    "why": lambda d: ["why", str(d)],
}


@pytest.mark.parametrize("cmd", sorted(LINK_READERS))
def test_links_planted_in_an_input_directory_are_not_followed(cmd, tmp_path, capsys):
    """row: links-planted - root reading a user's directory never prints a file a link
    points to."""
    secret = tmp_path / "root-only.json"
    secret.write_text(json.dumps({"format": "mldebug.hang.dump/1", "TOPSECRET": "TOPSECRET-42"}))
    secret.chmod(0o600)
    d = tmp_path / "dir"
    d.mkdir()
    for name in ("link.json", "link.pickle", "fr-h-rank0"):
        (d / name).symlink_to(secret)
    rc = main(LINK_READERS[cmd](d))
    out, err = capsys.readouterr()
    assert rc != 0 and "TOPSECRET-42" not in out + err, (cmd, out, err)
    assert "internal error" not in err


# -- class: node answers ---------------------------------------------------------------------
def test_node_answer_host_field_never_becomes_a_path_or_another_node(tmp_path):
    """rows: node-host-path, node-other-identity, node-duplicate-rank (hang; fr below)."""
    from mldebug.hang.analyze import analyze
    from mldebug.hang.collect import collection_from_results, save_node

    frames = [{"name": "wait", "filename": "/x.py", "line": 1}]
    thread = [{"thread_name": "MainThread", "thread_id": 1, "frames": frames}]
    honest = {"host": "n1", "processes": [
        {"pid": 10, "identity": {"rank": 0, "world_size": 2, "run_id": "j"}, "dump": thread}]}
    hostile = {"host": "../../n1", "processes": [
        {"pid": 7, "identity": {"rank": 0, "world_size": 2, "run_id": "j"}, "dump": thread}]}
    worse = {"host": "n3", "processes": [
        {"pid": "../../8", "identity": {"rank": "../../9"}, "dump": thread}]}
    results = [NodeResult("n1", data=honest), NodeResult("n2", data=hostile)]
    out = tmp_path / "out"
    out.mkdir()
    written = [p for r in [*results, NodeResult("n3", data=worse)] for p in save_node(out, r)]
    assert len(written) == 3
    for p in written:
        assert p.resolve().parent == (out / "dumps").resolve() and "/" not in p.name
    assert sorted(json.loads(p.read_text())["host"] for p in written) == ["n1", "n2", "n3"]
    coll = collection_from_results(results)
    assert sorted(p.host for p in coll.processes) == ["n1", "n2"]
    assert any("answered as host" in e.error and e.host == "n2" for e in coll.notes)
    codes = [f.code for f in analyze(coll).findings]
    assert "duplicate-ranks" in codes


def test_node_answer_fr_host_field_is_filed_under_the_host_asked(tmp_path):
    """row: node-host-path (fr trigger over nodes)."""
    from mldebug.fr.collect import save_node_doc

    outcome = save_node_doc("n2", {"host": "../../etc", "notes": [], "ranks": []}, tmp_path)
    assert outcome.host == "n2" and any("answered as host" in e for e in outcome.errors)


# -- class: escapes --------------------------------------------------------------------------
def _hang_dump(d: Path) -> Path:
    frames = [{"name": f"step{ESC}", "filename": f"/train{ESC}.py", "line": 3}]
    doc = {"format": "mldebug.hang.dump/1", "host": "vm", "pid": 100,
           "identity": {"rank": 0, "world_size": 1, "run_id": f"job{ESC}"},
           "dump": [{"thread_name": f"Main{ESC}", "thread_id": 1, "frames": frames}]}
    p = d / "vm-rank0-100.json"
    p.write_text(json.dumps(doc))
    return p


ESCAPE_COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "hang analyze": lambda d: ["hang", "analyze", str(_hang_dump(d))],
    "log": lambda d: ["log", str(_write(d / "rank0.log", (
        "[rank0]: Traceback (most recent call last):\n"
        f'[rank0]:   File "/train{ESC}.py", line 3, in <module>\n'
        f"[rank0]: RuntimeError: boom {ESC}\n")))],
    "nccl-log": lambda d: ["nccl-log", str(_write(
        d / "nccl.log", f"node1:1234:1300 [0] misc/socket.cc:50 NCCL WARN Net : {ESC} failed\n"))],
    "env": lambda d: ["env", "--torch-timeout", "1"],
    "why": lambda d: ["why", str(_write(d / "rank0.log", (
        "[rank0]: Traceback (most recent call last):\n"
        f'[rank0]:   File "/train{ESC}.py", line 3, in <module>\n'
        f"[rank0]: RuntimeError: boom {ESC}\n")))],
}


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


@pytest.mark.parametrize("cmd", sorted(ESCAPE_COMMANDS))
@pytest.mark.parametrize("mode", ["plain", "markdown-or-all"])
def test_escapes_in_outside_text_never_reach_the_terminal(cmd, mode, tmp_path, capsys,
                                                          monkeypatch):
    """row: escapes - ESC, OSC 52 and C1 controls in frame names, file names, log lines, NCCL
    WARN text and env values are shown escaped (\\x1b) in every human output."""
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", f"INIT{ESC}")
    argv = ESCAPE_COMMANDS[cmd](tmp_path)
    if mode == "markdown-or-all":
        argv += ["--markdown"] if cmd == "env" else (["--all"] if cmd == "hang analyze" else [])
    rc, out, err = _cli(argv, capsys)
    assert "\x1b" not in out + err and "\x9b" not in out + err and "\x07" not in out + err
    assert "\\x1b" in out or "\\x9b" in out, (cmd, out[-2000:])  # shown, escaped


@pytest.mark.parametrize("cmd", ["hang analyze", "env"])
def test_escapes_json_keeps_the_exact_text(cmd, tmp_path, capsys, monkeypatch):
    """row: escapes-json - --json is exact (JSON escapes controls itself)."""
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", f"INIT{ESC}")
    rc, out, err = _cli(ESCAPE_COMMANDS[cmd](tmp_path) + ["--json"], capsys)
    assert "\x1b" not in out
    assert any("\x1b]52;c;aGFja2Vk" in x for x in _strings(json.loads(out))), out[:2000]


def _strings(doc: object) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in _strings(k) + _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


# -- class: secrets --------------------------------------------------------------------------
def test_secrets_env_json_and_markdown_are_redacted(capsys, monkeypatch):
    """rows: secrets-env-json, secrets-env-markdown (a URL password in a finding title)."""
    monkeypatch.setenv("NCCL_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz012345")
    monkeypatch.setenv("MASTER_ADDR", f"http://user:{URL_PW}@10.0.0.1")
    for extra in (["--json"], ["--markdown"], []):
        rc, out, err = _cli(["env", "--torch-timeout", "1", *extra], capsys)
        assert "hf_abcdefghijklmnopqrstuvwxyz012345" not in out + err, extra
        assert URL_PW not in out + err, (extra, out)
    rc, out, err = _cli(["env", "--torch-timeout", "1", "--json", "--show-secrets"], capsys)
    assert "hf_abcdefghijklmnopqrstuvwxyz012345" in out


def test_secrets_password_pairs_inside_a_value_are_redacted(capsys, monkeypatch):
    """row: secrets-value-password - `password=`, `token=`, `api_key=` pairs inside a shown
    variable's value (space-separated settings, a URL query) were shown: redacted in --json,
    --markdown and plain output; --show-secrets shows them; 'tokenizer=bert' and
    'password_file=/path' are no secrets."""
    from mldebug.redact import redact_text

    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0 password=hunter2hca")
    monkeypatch.setenv("MASTER_ADDR", "https://host/?password=hunter2qs&x=1")
    for extra in (["--json"], ["--markdown"], []):
        rc, out, err = _cli(["env", "--torch-timeout", "1", *extra], capsys)
        assert "hunter2hca" not in out + err and "hunter2qs" not in out + err, (extra, out)
        assert "password=<redacted>" in out, (extra, out[-3000:])
    rc, out, err = _cli(["env", "--torch-timeout", "1", "--json", "--show-secrets"], capsys)
    assert "hunter2hca" in out and "hunter2qs" in out
    for text, shown in [("a PASSWD=pw1,b=2", "a PASSWD=<redacted>,b=2"),
                        ("pwd=pw2;q secret=pw3 TOKEN='pw4' api_key=pw5 apikey=pw6&z",
                         "pwd=<redacted>;q secret=<redacted> TOKEN='<redacted>' "
                         "api_key=<redacted> apikey=<redacted>&z"),
                        ("x access_token=pw7 y", "x access_token=<redacted> y"),
                        ("tokenizer=bert password_file=/etc/pw", "tokenizer=bert password_file=/etc/pw")]:
        assert redact_text(text) == shown, text


@pytest.fixture
def secret_rank(tmp_path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29871", TORCHELASTIC_RUN_ID="secretjob")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)",
                          f"--api-key={SECRET}", "--token", SECRET], env=env)
    time.sleep(0.5)
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def test_secrets_hang_json_and_out_files_are_redacted(secret_rank, tmp_path, capsys):
    """rows: secrets-argv-json, secrets-argv-out-files (0600), --show-secrets opts out."""
    rc, out, err = _cli(["hang", "--pid", str(secret_rank.pid), "--json", "--out",
                         str(tmp_path / "o")], capsys)
    doc = json.loads(out)
    assert doc["processes"] and SECRET not in out, out[:2000]
    assert any("<redacted>" in " ".join(p["cmdline"]) for p in doc["processes"])
    for f in (tmp_path / "o").rglob("*"):
        if f.is_file():
            assert SECRET not in f.read_text(), f
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    rc, out, err = _cli(["hang", "--pid", str(secret_rank.pid), "--json", "--show-secrets"],
                        capsys)
    assert SECRET in out


# -- class: devices --------------------------------------------------------------------------
DEVICE_READERS: dict[str, tuple[Callable[[str], list[str]], bool]] = {
    # name: (argv for a path, whether a FIFO is refused - log and nccl-log stream FIFOs)
    "mem report": (lambda p: ["mem", "report", p], True),
    "fr analyze": (lambda p: ["fr", "analyze", p], True),
    "hang analyze": (lambda p: ["hang", "analyze", p], True),
    "log": (lambda p: ["log", p], False),
    "nccl-log": (lambda p: ["nccl-log", p], False),
    "why": (lambda p: ["why", p], True),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["device", "fifo"])
@pytest.mark.parametrize("cmd", sorted(DEVICE_READERS))
def test_devices_and_fifos_are_refused_in_every_reader(cmd, kind, tmp_path, capsys):
    """rows: devices-dev-zero, devices-fifo - /dev/zero once grew `mem report` to 8 GB and
    kept `mldebug log` busy forever; a FIFO without a writer blocked."""
    argv, refuses_fifo = DEVICE_READERS[cmd]
    if kind == "fifo":
        if not refuses_fifo:
            pytest.skip(f"{cmd} streams a FIFO by design (bounded per line)")
        path = tmp_path / "fifo"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    rc, out, err = _cli(argv(str(path)), capsys)
    assert rc != 0 and err.strip(), (cmd, kind, out, err)


# -- class: numbers --------------------------------------------------------------------------
NUMBER_OPTIONS = [
    ["hang", "--pattern", "zzz", "--watch={}"],
    ["hang", "--pattern", "zzz", "--timeout={}"],
    ["env", "--torch-timeout={}"],
    ["mem", "top", "--watch={}"],
    ["fr", "watch", "--interval={}"],
    ["dist-test", "--timeout={}"],
    ["trace", "show", "--pid", "1", "--timeout={}"],
]


@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "-inf", "1e300"])
@pytest.mark.parametrize("argv", NUMBER_OPTIONS, ids=lambda a: f"{a[0]} {a[-1][:-3]}")
def test_numbers_inf_nan_and_huge_options_are_one_line(argv, value, capsys):
    """rows: numbers-options."""
    rc, out, err = _cli([a.format(value) for a in argv], capsys)
    assert rc == 2 and ("finite" in err or "out of range" in err), err


@pytest.mark.parametrize("value", ["1e400", "-1e400", "NaN", "Infinity"])
def test_numbers_in_json_fields_are_refused_with_one_line(value, tmp_path, capsys):
    """rows: numbers-json - a dump whose pid or rank is inf/nan/huge."""
    p = tmp_path / "d.json"
    p.write_text('{"format": "mldebug.hang.dump/1", "host": "vm", "pid": ' + value
                 + ', "identity": {"rank": ' + value + '}, "dump": []}')
    rc, out, err = _cli(["hang", "analyze", str(p)], capsys)
    assert rc != 0 or "error" in (out + err).lower()


def test_numbers_nproc_over_the_bound_is_refused_before_anything_starts(capsys):
    """row: numbers-nproc - `dist-test --nproc 100000` once spawned ranks until the OOM
    killer fired."""
    rc, out, err = _cli(["dist-test", "--nproc", "100000"], capsys)
    assert rc == 2 and "--max-nproc" in err and "launching" not in out


# -- class: resources ------------------------------------------------------------------------
def test_resources_mem_probe_default_is_bounded(tmp_path, capsys, monkeypatch):
    """row: resources-mem-probe-default - `mem probe` without --max once took all available
    memory of a shared node (#39). The default is 10% of MemAvailable (here a meminfo saying
    640 MiB: 64 MiB) or 4 GiB, whichever is smaller, and says so in one line with the way
    further; --json carries the bound."""
    from mldebug.memory import probe

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  263767000 kB\nMemAvailable:   655360 kB\n")
    monkeypatch.setattr(probe, "MEMINFO", str(meminfo))
    monkeypatch.setattr(probe.cgroup, "limit", lambda pid="self": (None, None))
    rc, out, err = _cli(["mem", "probe", "--json"], capsys)
    doc = json.loads(out)
    bound = 64 * 1024**2
    assert rc == 0 and doc["bound"] == doc["maximum"] == bound, doc
    assert doc["max_from"] == "10% of available memory" and doc["stopped_by"] == "max"
    assert 0 < doc["allocated"] <= bound
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "bounded at 64.00 MiB" in lines[0] and "--max" in lines[0], err
    rc, out, err = _cli(["mem", "probe", "--max", "96MiB", "--step", "32MiB", "--json"], capsys)
    doc = json.loads(out)  # an explicit size is honoured as before, and says nothing more
    assert (doc["maximum"], doc["allocated"], doc["bound"]) == (96 * 1024**2, 96 * 1024**2, None)
    assert "bounded" not in err


# -- class: damaged input -------------------------------------------------------------------
# A crashed node leaves NULs, cut lines, absurd numbers: each is a problem of one line, one
# field or one file, noted, never of the whole run (#39).
_CUDA = "RuntimeError: CUDA error: an illegal memory access was encountered"


def _nonfinite_inputs(d: Path) -> dict[str, list[str]]:
    """A JSON input of each reader with 1e400 / Infinity / NaN where integers belong, beside
    good data in the same run where the format has more than one record."""
    (d / "rec").mkdir()
    (d / "rec" / "numerics-n-rank0.jsonl").write_text(
        '{"v": 1, "kind": "nonfinite", "rank": 1e400, "world_size": 8, "host": "n", '
        '"step": Infinity, "origin": true}\n{"v": 1, "kind": "nonfinite", "rank": 2, '
        '"world_size": 8, "host": "n", "step": 3, "origin": true}\n')
    (d / "fr_rank0.json").write_text(
        '{"version": "2.10", "rank": 1e400, "entries": [{"collective_seq_id": Infinity, '
        '"record_id": NaN, "profiling_name": "gloo:all_reduce", "process_group": ["0", '
        '"default_pg"], "state": "completed"}]}')
    (d / "snap.json").write_text(
        '{"segments": [{"device": 0, "address": 1e400, "total_size": Infinity, "blocks": '
        '[{"size": NaN, "state": "active_allocated"}]}], "device_traces": []}')
    return {"why": ["why", str(d), "--json"],
            "numerics report": ["numerics", "report", str(d / "rec"), "--json"],
            "fr analyze": ["fr", "analyze", str(d / "fr_rank0.json"), "--json"],
            "mem report": ["mem", "report", str(d / "snap.json"), "--json"]}


@pytest.mark.parametrize("cmd", ["numerics report", "fr analyze", "mem report", "why"])
def test_damaged_nonfinite_numbers_in_every_json_reader(cmd, tmp_path, capsys):
    """row: damaged-nonfinite-json, for the other JSON readers: a record, dump or snapshot
    with 1e400 / Infinity / NaN where an integer belongs is a problem of that record or
    file (named), never an internal error; the good record beside it is still read."""
    argv = _nonfinite_inputs(tmp_path)[cmd]
    rc, out, err = _cli(argv, capsys)
    doc = json.loads(out)  # strict JSON out: no Infinity/NaN written back
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-finite {c} in the output"))
    if cmd == "numerics report":
        assert doc["verdict"]["culprits"] == [2] and "rank is not" in json.dumps(doc)
    elif cmd == "fr analyze":
        assert rc == 1 and "inf, not an integer" in json.dumps(doc["problems"])
    elif cmd == "why":  # all three at once: the good record decides, the others are notes
        assert doc["verdict"]["culprits"] == [2] and "inf, not an integer" in json.dumps(doc)
    else:
        assert rc == 0 and doc["segments"] == 1


NUL_READERS: dict[str, tuple[bytes, bytes, Callable[[dict], bool]]] = {
    # command: (lines before the NUL block, after it, what the JSON must still say)
    "nccl-log": (b"host1:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n",
                 b"host1:100:200 [0] misc/socket.cc:50 NCCL WARN socketStartConnect: Connect to "
                 b"10.0.0.2<45678> failed : Connection refused\n",
                 lambda d: any(f["code"] == "nccl-log-connect" and "host1" in f["hosts"]
                               for f in d["findings"])
                 and any(f["code"] == "nccl-log-nul-bytes" for f in d["findings"])),
    "hang analyze": (b'Process 41: python train.py\nThread 0x7f01 (active): "MainThread"\n',
                     b"    wait (threading.py:320)\n    train_step (train.py:41)\n",
                     lambda d: any(fr["name"] == "train_step" for p in d["processes"]
                                   for th in p.get("threads", []) for fr in th.get("frames", []))
                     or "train_step" in json.dumps(d["groups"])),
    "why": (b"[rank0]:step 100 loss 2.31\n[rank1]:step 100 loss 2.30\n",
            b"[rank1]:Traceback (most recent call last):\n"
            b'[rank1]:  File "/u/train.py", line 41, in <module>\n'
            b"[rank1]:RuntimeError: CUDA error: an illegal memory access was encountered\n",
            lambda d: d["verdict"]["culprits"] == [1] and "CUDA error" in d["verdict"]["summary"]),
}


@pytest.mark.parametrize("cmd", sorted(NUL_READERS))
def test_damaged_nul_block_in_the_other_text_readers(cmd, tmp_path, capsys):
    """row: damaged-nul-block, for nccl-log and hang analyze (py-spy text pastes): a NUL block
    glued to the next line's start made that line unreadable (nccl-log: '(no host in line)';
    hang analyze: no frames); the NULs are dropped, the line is read, a note says so."""
    head, tail, ok = NUL_READERS[cmd]
    f = tmp_path / "damaged.txt"
    f.write_bytes(head + b"\x00" * 4096 + tail)
    rc, out, err = _cli([*cmd.split(), str(f), "--json"], capsys)
    doc = json.loads(out)
    assert ok(doc), json.dumps(doc)[:3000]
    assert "NUL bytes" in json.dumps(doc), json.dumps(doc)[:3000]


def test_damaged_nul_block_before_the_last_lines_is_skipped_and_noted(tmp_path, capsys):
    """row: damaged-nul-block - a block of NULs (a crashed node's unwritten pages) before a
    rank's last lines: the log is read past it, the CUDA error after it is the verdict."""
    head = ("[rank0]:step 100 loss 2.31\n[rank1]:step 100 loss 2.30\n"
            "[rank0]:step 101 loss 2.29\n")
    tail = ("[rank1]:Traceback (most recent call last):\n"
            '[rank1]:  File "/u/train.py", line 41, in <module>\n'
            "[rank1]:    loss.backward()\n"
            f"[rank1]:{_CUDA}\n")
    clean = _write(tmp_path / "clean.log", head + tail)
    damaged = tmp_path / "job.log"
    damaged.write_bytes(head.encode() + b"\x00" * 4096 + tail.encode())
    rc_clean, out, err = _cli(["log", str(clean), "--json"], capsys)
    rc, out, err = _cli(["log", str(damaged), "--json"], capsys)
    doc = json.loads(out)
    assert rc == rc_clean and doc["culprits"] == [1], (rc, err, out[:2000])
    assert _CUDA in doc["verdict"]["title"] and "cuda" in doc["verdict"]["code"], doc["verdict"]
    assert any("4096 NUL bytes at line 4" in n for n in doc["notes"]), doc["notes"]
    rc, out, err = _cli(["log", str(damaged)], capsys)
    assert _CUDA in out and "4096 NUL bytes" in out + err and "\x00" not in out + err


def _pyspy_json(pid: int, line: str = "41", thread_id: str = "140000") -> str:
    frames = [{"name": "all_reduce", "filename": "/site-packages/torch/distributed/distributed_c10d.py",
               "short_filename": "distributed_c10d.py", "module": None, "line": 2050, "locals": None},
              {"name": "train", "filename": "/u/train.py", "short_filename": "train.py",
               "module": None, "line": "LINE", "locals": None}]
    doc = json.dumps([{"pid": pid, "thread_id": "TID", "thread_name": "MainThread",
                       "os_thread_id": pid, "active": True, "owns_gil": False, "frames": frames}])
    return doc.replace('"LINE"', line).replace('"TID"', thread_id)  # raw JSON numbers


@pytest.mark.parametrize("value", ["1e400", "-Infinity", "NaN", "true", "9" * 30])
def test_damaged_nonfinite_json_numbers_cost_one_file_not_the_run(value, tmp_path, capsys):
    """row: damaged-nonfinite-json - py-spy JSON (and a hang dump) whose frame line or
    thread_id is 1e400/-Infinity/NaN once ended the whole run in 'internal error:
    OverflowError'. The damaged file is named in one note; the good file is analysed."""
    good = _write(tmp_path / "good-100.json", _pyspy_json(100))
    bad = _write(tmp_path / "bad-101.json", _pyspy_json(101, line=value, thread_id="-Infinity"))
    dump = json.loads(_pyspy_json(102))  # the same frame line inside mldebug's own dump format
    dump_doc = json.dumps({"format": "mldebug.hang.dump/1", "host": "vm", "pid": 102,
                           "identity": {"rank": 2, "world_size": 3}, "dump": dump})
    bad_dump = _write(tmp_path / "vm-rank2-102.json", dump_doc.replace('"line": 41', f'"line": {value}'))
    rc_good, out, err = _cli(["hang", "analyze", str(good)], capsys)
    rc, out, err = _cli(["hang", "analyze", str(good), str(bad), str(bad_dump)], capsys)
    assert rc == rc_good and "pid 100" in out, (rc, out, err)
    assert "bad-101.json" in out + err and "'line'" in out + err, out
    assert "vm-rank2-102.json" in out + err, out
    rc, out, err = _cli(["hang", "analyze", str(good), str(bad), "--json"], capsys)
    doc = json.loads(out)  # strict JSON: no Infinity/NaN copied into it
    assert any(e["host"] == "bad-101.json" for e in doc["errors"]), doc["errors"]
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    # a damaged thread id alone costs nothing but a note: the stack is kept
    only_tid = _write(tmp_path / "tid-103.json", _pyspy_json(103, thread_id=value))
    rc, out, err = _cli(["hang", "analyze", str(good), str(only_tid)], capsys)
    assert "pid 103" in out and "tid-103.json" in out and "thread_id" in out, out


@pytest.mark.timeout(120)
def test_damaged_huge_rank_count_is_stated_as_a_lower_bound(tmp_path, capsys):
    """row: damaged-huge-rank-count - a 1,000,001-rank log (one line per rank) said
    '36867 ranks seen': rank prefixes are sampled (256 KiB of each 8 MiB on the grep path, 1 MiB
    in Python) and the sample stops at 65,536 ranks (the memory bound, kept). The header now
    says 'at least N ranks seen' when the sample missed ranks; a job whose ranks all show up
    early in each sample keeps its exact count."""
    from mldebug.log.collect import load

    huge = tmp_path / "huge.log"
    with huge.open("w") as f:
        f.write("[rank0]:world_size=1000001\n")
        for start in range(0, 1_000_001, 100_000):
            f.write("".join(f"[rank{r}]:step 1 loss 2.0\n"
                            for r in range(start, min(start + 100_000, 1_000_001))))
        f.write("[rank7]:Traceback (most recent call last):\n"
                '[rank7]:  File "/u/train.py", line 3, in <module>\n[rank7]:RuntimeError: boom\n')
    rc, out, err = _cli(["log", str(huge)], capsys)
    head = out.splitlines()[0]
    seen = int(head.split("at least ", 2)[2].split()[0])
    assert 0 < seen < 1_000_001 and "ranks seen (rank prefixes are sampled" in head, head
    assert "world size 1000001" in head and "RuntimeError: boom" in out, out[:2000]
    rc, out, err = _cli(["log", str(huge), "--json"], capsys)
    doc = json.loads(out)
    assert doc["ranks_lower_bound"] is True and doc["culprits"] == [7]
    assert load([str(huge)], grep_min=1 << 62).ranks_lower_bound  # the Python path too
    # 4 ranks over 5 MiB: every sample is cut, but it saw every rank early: the count is exact
    small = tmp_path / "four.log"
    small.write_text("".join(f"[rank{i % 4}]:step {i} loss 2.0\n" for i in range(250_000)))
    for kw in ({}, {"grep_min": 1 << 62}):
        parsed = load([str(small)], **kw)  # type: ignore[arg-type]
        assert len(parsed.ranks) == 4 and not parsed.ranks_lower_bound, kw
    rc, out, err = _cli(["log", str(small)], capsys)
    assert "; 4 ranks seen." in out.splitlines()[0], out


# -- class: signals --------------------------------------------------------------------------
_STAGED = """
import sys, time
from pathlib import Path
from mldebug.paths import check_out, staged
out = check_out(Path(sys.argv[1]), force=True)
with staged(out) as st:
    st.write("a/b.txt", "new")
    print("ready", flush=True)
    time.sleep(60)
"""


def _default_sigint() -> None:
    """In the child: SIGINT back to its default. A shell starts background jobs with SIGINT
    ignored and Python then never raises KeyboardInterrupt, so a test run from such a shell
    (or a CI step started with '&') would send its SIGINT to a deaf process."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("existing", [False, True])
def test_signals_during_a_write_leave_the_old_output_or_nothing(sig, existing, tmp_path):
    """rows: signals-staged - the mechanism every --out command writes through."""
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / ".mldebug-output").write_text("{}")
        (out / "old.txt").write_text("old")
    before = _tree(out) if existing else None
    p = subprocess.Popen([sys.executable, "-c", _STAGED, str(out)], stdout=subprocess.PIPE,
                         text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                         preexec_fn=_default_sigint)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        p.send_signal(sig)
        p.wait(30)
    finally:
        p.kill()
        p.wait()
    assert (_tree(out) == before) if existing else not out.exists()
    assert [x.name for x in tmp_path.iterdir() if x.name != "out"] == []


def test_signals_sigterm_during_hang_out_leaves_nothing(secret_rank, tmp_path):
    """row: signals-hang-out - SIGTERM while `hang --out` collects (--watch)."""
    p = subprocess.Popen([sys.executable, "-m", "mldebug", "hang", "--pid", str(secret_rank.pid),
                          "--watch", "30", "--out", str(tmp_path / "run")], cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(x.name.startswith(".run.tmp-") for x in tmp_path.iterdir()):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.1)
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(30)
    finally:
        p.kill()
        p.wait()
    assert rc == 143 and list(tmp_path.iterdir()) == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_make_tiny_dataset_removes_its_temporary_directory(sig, tmp_path):
    """row: signals-tiny-ds-tmp - SIGTERM while make-tiny-dataset reads its source once left
    an mldebug-tiny-ds-* directory in /tmp (#39); SIGTERM now unwinds like Ctrl-C. The source
    is large enough (40 MB of JSONL) that the run is still reading when the signal comes."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    src = tmp_path / "big.jsonl"
    block = "".join(f'{{"a": {i}, "t": "{"x" * 80}"}}\n' for i in range(1000))
    src.write_text(block * 400)
    p = subprocess.Popen([sys.executable, "-m", "mldebug", "make-tiny-dataset", str(src), "-n",
                          "1", "--out", str(tmp_path / "tiny")], cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmpdir)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 120
        while not any(x.name.startswith("mldebug-tiny-ds-") for x in tmpdir.iterdir()):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)
        assert p.poll() is None, "the run ended before the signal: make the source larger"
        p.send_signal(sig)
        rc = p.wait(60)
    finally:
        p.kill()
        p.wait()
    assert rc == (143 if sig == signal.SIGTERM else 130), (rc, p.stderr and p.stderr.read())
    assert list(tmpdir.iterdir()) == []
    assert not (tmp_path / "tiny").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_signals_ranks_exit_when_the_mldebug_that_launched_them_is_gone(tmp_path):
    """row: signals-launcher-gone - the ranks of `dist-test --nproc` watch the mldebug process
    that launched them (MLDEBUG_LAUNCHED_BY: pid and start time), not only their parent's
    death signal, which is lost when the rank asks for it after its parent died, or when a
    credential change (`unshare --user`) on the way cleared it (#39: the ranks outlived a
    SIGKILLed mldebug until their timeout). Here torchrun stays alive and the 'mldebug' (a
    sleep standing in for it) is killed: both ranks, one waiting in an all_reduce with a
    600 s timeout, are gone within seconds."""
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("torch")
    from mldebug.disttest.worker import REPORT_ENV
    from mldebug.ranks import start_time

    stand_in = subprocess.Popen(["sleep", "300"])
    env = dict(os.environ, PYTHONPATH=str(REPO), **{
        REPORT_ENV: "1", "MLDEBUG_LAUNCHED_BY": f"{stand_in.pid}:{start_time(stand_in.pid)}"})
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", "-m", "mldebug", "dist-test", "--backend", "gloo",
                          "--timeout", "600", "--fault", "skip-allreduce:1"],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    ranks: list = []
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if "skipping all_reduce" in line:
                break
        ranks = [c for c in psutil.Process(p.pid).children(recursive=True)
                 if "dist-test" in " ".join(c.cmdline())]
        assert len(ranks) == 2
        time.sleep(1.0)
        assert all(r.is_running() for r in ranks)  # rank 0 waits in its all_reduce
        stand_in.kill()
        stand_in.wait()
        gone, alive = psutil.wait_procs(ranks, timeout=20)
        assert alive == [], [a.cmdline() for a in alive]
    finally:
        for r in ranks:
            try:
                r.kill()
            except psutil.Error:
                pass
        stand_in.kill()
        p.kill()
        p.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_signals_sigkill_of_mldebug_takes_the_launched_ranks_with_it(tmp_path):
    """row: signals-sigkill-launcher - `dist-test --nproc` ranks once spun for 20 minutes after
    mldebug was gone. Rank 1 skips its all_reduce, so rank 0 waits there (timeout 600 s);
    mldebug is SIGKILLed: torchrun (PR_SET_PDEATHSIG) and the ranks (the same, from torchrun)
    are gone within seconds, far inside the ranks' own timeout."""
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("torch")
    p = subprocess.Popen([sys.executable, "-m", "mldebug", "dist-test", "--nproc", "2",
                          "--backend", "gloo", "--timeout", "600", "--fault", "skip-allreduce:1"],
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    family: list = []
    try:
        assert p.stdout is not None
        seen = []
        for line in p.stdout:  # a rank's line: both ranks are past their start-up
            seen.append(line)
            if "skipping all_reduce" in line:
                break
        ranks = [c for c in psutil.Process(p.pid).children(recursive=True)
                 if "dist-test" in " ".join(c.cmdline()) and "torch.distributed.run"
                 not in " ".join(c.cmdline())]
        assert len(ranks) >= 2, seen
        family = psutil.Process(p.pid).children(recursive=True)
        time.sleep(1.0)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        gone, alive = psutil.wait_procs(family, timeout=60)
        assert alive == [], [a.cmdline() for a in alive]
    finally:
        for c in family:
            try:
                c.kill()
            except psutil.Error:
                pass
        p.kill()
        p.wait()


def test_node_another_users_process_never_joins_the_callers_job(tmp_path, capsys, other_user):
    """row: node-other-user-rank - another user's process with the caller's MASTER_ADDR:PORT
    and RANK=1 is its own job, never a rank (or a suspect) of the caller's job."""
    base = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="10.9.8.7", MASTER_PORT="29555")
    base.pop("TORCHELASTIC_RUN_ID", None)
    code = "import time; time.sleep(120)  # mldebug-safety-table-job"
    mine = subprocess.Popen([sys.executable, "-c", code], env=dict(base, RANK="0"))
    theirs = subprocess.Popen(["setpriv", f"--reuid={other_user}", f"--regid={other_user}",
                               "--clear-groups", sys.executable, "-c", code],
                              env=dict(base, RANK="1"))
    try:
        time.sleep(1.0)
        rc, out, err = _cli(["hang", "--pattern", "mldebug-safety-table-job", "--json"], capsys)
        doc = json.loads(out)
        jobs = {p["pid"]: p["job"] for p in doc["processes"]}
        assert mine.pid in jobs and theirs.pid in jobs, (jobs, err)
        assert jobs[mine.pid] != jobs[theirs.pid]
    finally:
        for p in (mine, theirs):
            p.kill()
            p.wait()


# -- class: verdicts -------------------------------------------------------------------------
def test_verdict_a_lone_rank_selected_as_advised_is_analysed(capsys):
    """row: verdicts-lone-rank - the report says to select a lone RANK process with --pid or
    --pattern and names the command; running that command as printed analyses it (it was
    still left out as lone)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MASTER_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI"))}
    code = "import time; time.sleep(120)  # mldebug-safety-table-lone"
    p = subprocess.Popen([sys.executable, "-c", code], env=dict(env, RANK="0"))
    try:
        time.sleep(0.5)
        rc, out, err = _cli(["hang", "--json"], capsys)
        lone = json.loads(out)
        assert p.pid not in [x["pid"] for x in lone["processes"]]
        (fix,) = [f["fix"] for f in lone["findings"] if f["code"] == "lone-processes"]
        import re
        import shlex

        advised = re.search(r"mldebug (hang --pid \d+)", fix)
        assert advised and advised.group(1) == f"hang --pid {p.pid}", fix
        rc, out, err = _cli([*shlex.split(advised.group(1)), "--json"], capsys)  # as printed
        assert rc == 0 and [x["pid"] for x in json.loads(out)["processes"]] == [p.pid], fix
        for argv in (["--pid", str(p.pid)], ["--pattern", "mldebug-safety-table-lone"]):
            rc, out, err = _cli(["hang", *argv, "--json"], capsys)
            assert rc == 0 and [x["pid"] for x in json.loads(out)["processes"]] == [p.pid], argv
    finally:
        p.kill()
        p.wait()


# -- class: wrong verdicts (a real gloo job in its own pid namespace, 3 of 4 ranks frozen) --
# One torchrun job serves the rows below: it runs inside `unshare --pid --fork --mount-proc`
# (what a container does to pids: its rank 0 is pid 5 there, a five-digit pid here), its
# ranks 1-3 freeze holding the GIL in C (recipes/fr_frozen_ranks.py) while rank 0 waits
# healthily in the next all_reduce. Every rank has the flight recorder and the dump handler.
# mldebug runs from the host's namespace, as root on a node runs it beside a container.
FROZEN = (1, 2, 3)
VERDICT_COMMANDS: dict[str, Callable[[dict], list[str]]] = {
    "hang": lambda j: ["hang", "--pid", str(j["launcher"]), "--json"],
    # the frozen (or stopped) ranks never answer, so each command waits its whole --timeout:
    # long enough for the healthy rank's answer under CI's load, short for the suite
    "hang --signal": lambda j: ["hang", "--signal", "--pid", str(j["launcher"]), "--timeout",
                                "6", "--json"],
    "fr trigger": lambda j: ["fr", "trigger", "--dir", str(j["frdir"]), "--pid",
                             str(j["launcher"]), "--timeout", "6", "--analyze", "--json"],
}


@pytest.fixture(scope="module")
def ns_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("torch")
    from jobs import kill_tree

    from mldebug.ranks import ns_pids

    base = tmp_path_factory.mktemp("nsjob")
    frdir = base / "fr"
    frdir.mkdir(mode=0o700)
    log = base / "job.log"
    env = dict(os.environ, MLDEBUG_FR="1", MLDEBUG_FR_DIR=str(frdir), MLDEBUG_SIGNAL="1",
               MLDEBUG_DIR=str(base / "capture"), TORCH_FR_BUFFER_SIZE="2000",
               OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'recipes'}")
    with open(log, "wb") as out:
        p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                              sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc_per_node=4", str(REPO / "recipes" / "fr_frozen_ranks.py"),
                              "--timeout", "1800", "--freeze", "1800"],
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        import re

        while len(re.findall(r"rank \d+ pid \d+ ready", log.read_text(errors="replace"))) < 4:
            if p.poll() is not None or time.monotonic() > deadline:
                if "unshare failed" in log.read_text(errors="replace"):
                    pytest.skip(f"no pid namespaces here: {log.read_text()[-300:]}")
                pytest.fail(f"the namespaced job did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        own = {int(r): int(q) for r, q in
               re.findall(r"rank (\d+) pid (\d+) ready", log.read_text(errors="replace"))}
        ranks = {}
        for c in psutil.Process(p.pid).children(recursive=True):
            ns = ns_pids(c.pid)
            if len(ns) > 1 and ns[-1] in own.values() and "fr_frozen" in " ".join(c.cmdline()):
                ranks[next(r for r, q in own.items() if q == ns[-1])] = c.pid
        assert sorted(ranks) == [0, 1, 2, 3] and all(ranks[r] != own[r] for r in ranks), (
            ranks, own)
        time.sleep(2.0)  # rank 0 into its all_reduce, ranks 1-3 into hold_gil
        yield {"launcher": p.pid, "frdir": frdir, "ranks": ranks, "own": own, "log": log}
    finally:
        kill_tree(p)


def _need_registrations(job: dict, cmd: str) -> None:
    """`hang --signal` finds the ranks by their registry entries (~/.cache/mldebug/capture):
    a frozen rank cannot write its entry again when something else removed it (an older
    mldebug pruning from the host's namespace, where pid 6 is a kernel thread, did)."""
    if cmd != "hang --signal":
        return
    import pwd

    from mldebug.privdir import registry_dir

    reg = registry_dir(pwd.getpwuid(os.geteuid()).pw_dir)
    names = {p.name for p in reg.iterdir()} if reg.is_dir() else set()
    # this job's own entries: killed namespaced jobs leave entries named alike (every fresh
    # namespace numbers its ranks 5, 6, ...), so the namespace's inode is part of the name
    inode = "".join(c for c in os.readlink(f"/proc/{job['ranks'][0]}/ns/pid") if c.isdecimal())
    gone = [r for r, own in job["own"].items()
            if not any(n.endswith(f"-{own}-ns{inode}.json") for n in names)]
    if gone:
        pytest.skip(f"the registry entries of ranks {gone} were removed by another process "
                    f"(an mldebug without the pid-namespace check in its prune):\n"
                    f"{_registry_state(job)}")


def _run(argv: list[str], timeout: float = 120) -> tuple[int, dict, str]:
    from conftest import run_cli

    r = run_cli(*argv, timeout=timeout)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {}, r.stderr


def _registry_state(job: dict) -> str:
    """For a failure: the dump-handler registry's entries of this job's ranks, and its log."""
    import pwd

    from mldebug.privdir import registry_dir

    reg = registry_dir(pwd.getpwuid(os.geteuid()).pw_dir)
    lines = []
    for rank, own in sorted(job["own"].items()):
        for p in sorted(reg.glob(f"*-{own}-ns*.json")) if reg.is_dir() else []:
            lines.append(f"rank {rank}: {p.name} {p.read_text(errors='replace')[:300]}")
    return "\n".join(lines) + "\n" + job["log"].read_text(errors="replace")[-1500:]


def _hang_check(doc: dict, job: dict, cmd: str) -> None:
    procs = {p["pid"]: p for p in doc["processes"]}
    assert sorted(procs) == sorted(job["ranks"].values()), (cmd, sorted(procs), doc["errors"],
                                                            _registry_state(job))
    for rank, pid in job["ranks"].items():  # host pids, and the pid the rank knows itself by
        assert procs[pid]["rank"] == rank and procs[pid]["ns_pid"] == job["own"][rank], cmd
    assert len({p["job"] for p in procs.values()}) == 1, cmd  # one job, not four
    text = json.dumps(doc["errors"]) + json.dumps(doc["findings"])
    assert "exited" not in text and "is gone" not in text and "no handler" not in text, (cmd,
                                                                                         text)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cmd", sorted(VERDICT_COMMANDS))
def test_verdict_ranks_in_another_pid_namespace(cmd, ns_job):
    """row: verdicts-pid-namespace - ranks whose pids differ in their own namespace are found,
    read and named by the host's pid (with their own beside it); the fr registrations they
    wrote with their own pids are matched by start time, never by the number alone (which
    named a kernel thread here, or 'no longer runs'); --signal finds their handlers."""
    _need_registrations(ns_job, cmd)
    rc, doc, err = _run(VERDICT_COMMANDS[cmd](ns_job))
    _need_registrations(ns_job, cmd)  # still there: what the command saw
    frozen = sorted(ns_job["ranks"][r] for r in FROZEN)
    if cmd.startswith("hang"):
        _hang_check(doc, ns_job, cmd)
        if cmd == "hang":
            assert sorted(s["pid"] for s in doc["suspects"]) == frozen, doc["suspects"]
            assert all(s["ns_pid"] == ns_job["own"][s["rank"]] for s in doc["suspects"])
        else:  # every rank answered the signal: rank 0 in Python, the frozen ones in C
            assert all(p["threads"] for p in doc["processes"]), doc["errors"]
        return
    node = doc["nodes"][0]
    assert rc == 0 and [Path(f).name for f in doc["files"]] == [
        "fr-" + node["host"] + "-rank0"], (node, err)
    for r in FROZEN:  # host pid and own pid both named, alive and silent - never 'gone'
        assert any(f"rank {r} (pid {ns_job['ranks'][r]}, {ns_job['own'][r]} in its pid "
                   "namespace): did not answer" in e for e in node["errors"]), node["errors"]
    assert sorted(s["pid"] for s in node["silent"]) == frozen


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_verdict_three_frozen_ranks_never_blame_the_one_that_answered(ns_job, tmp_path):
    """row: verdicts-three-frozen - 3 of 4 ranks frozen (GIL held in C), one healthy: the
    silent ranks are the finding (alive, never read their trigger) and the rank that answered
    is no culprit, in the trigger's own finding and in the analysis of its one dump."""
    rc, doc, err = _run(["fr", "trigger", "--dir", str(ns_job["frdir"]), "--timeout", "6",
                         "--analyze", "--json", "--out", str(tmp_path / "o")])
    assert rc == 0, err
    (silent,) = [f for f in doc["findings"] if f["code"] == "fr-silent-ranks"]
    assert "rank(s) 1-3 alive but did not answer" in silent["title"], silent
    assert "never read its trigger" in silent["detail"] and "GIL" in silent["detail"]
    culprits = doc["analysis"]["culprit_ranks"]
    assert 0 not in culprits and set(culprits) <= set(FROZEN), doc["analysis"]
    assert doc["analysis"]["findings"][0]["code"] == "fr-silent-ranks"
    assert not any("rank(s) 0 " in f["title"] and f["severity"] == "error"
                   for f in doc["analysis"]["findings"])
    assert [p.name for p in (tmp_path / "o").iterdir()] == [f"fr-{doc['nodes'][0]['host']}-rank0"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cmd", sorted(VERDICT_COMMANDS))
@pytest.mark.parametrize("how", ["sigstop", "strace"])
def test_verdict_a_stopped_or_traced_rank_is_alive_never_gone(how, cmd, ns_job):
    """rows: verdicts-sigstop, verdicts-ptrace - the healthy rank 0, SIGSTOPped or held by
    `strace -p`, is alive but could not be read (with the reason and how to resume it), never
    'exited' or 'process is gone'; a command it can still answer (strace passes signals and
    lets the recorder run) reads it."""
    import shutil

    _need_registrations(ns_job, cmd)
    pid = ns_job["ranks"][0]
    tracer = None
    if how == "sigstop":
        os.kill(pid, signal.SIGSTOP)
    else:
        if shutil.which("strace") is None:
            pytest.skip("no strace here")
        tracer = _strace(pid)
    try:
        rc, doc, err = _run(VERDICT_COMMANDS[cmd](ns_job))
        _need_registrations(ns_job, cmd)  # still there (before rank 0 may write its again)
    finally:
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)  # strace detaches on SIGINT
            tracer.wait(30)
        os.kill(pid, signal.SIGCONT)
    text = json.dumps(doc)
    assert "exited" not in text and "is gone" not in text and "rank-exited" not in text, text
    if cmd == "fr trigger":
        node = doc["nodes"][0]
        if how == "sigstop":
            assert any(s["pid"] == pid and "alive but stopped" in s["why"]
                       and f"kill -CONT {pid}" in s["why"] for s in node["silent"]), node
        else:
            assert any(f.endswith("-rank0") for f in doc["files"]), node
        return
    rank0 = [p for p in doc["processes"] if p["pid"] == pid]
    errors = [e["error"] for e in doc["errors"] if e.get("pid") == pid]
    if cmd == "hang --signal" and how == "strace":
        assert rank0 and rank0[0]["threads"], errors  # the signal passes through strace
        return
    assert errors, doc["errors"]
    word = "stopped" if how == "sigstop" else "traced by pid"
    assert any(word in e for e in errors), errors
    hints = {f["code"]: f for f in doc["findings"]}
    assert "rank-unreadable" in hints and "Rank 0" in hints["rank-unreadable"]["title"], hints


def _strace(pid: int) -> subprocess.Popen:
    """`strace -p pid`, attached (TracerPid set). A rank just resumed from the SIGSTOP rows, or
    a tracer of an earlier command still detaching, can make one attach fail: up to three
    tries, each after the rank runs untraced again; the last failure is shown with strace's
    own words."""
    why = ""
    for _ in range(3):
        deadline = time.monotonic() + 15
        while (_status(pid).get("TracerPid", "0") != "0"
               or _status(pid).get("State", "").startswith(("T", "t"))):
            assert time.monotonic() < deadline, f"pid {pid} stays traced or stopped: {_status(pid)}"
            time.sleep(0.1)
        tracer = subprocess.Popen(["strace", "-qq", "-o", "/dev/null", "-p", str(pid)],
                                  stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while _status(pid).get("TracerPid", "0") == "0" and tracer.poll() is None:
            assert time.monotonic() < deadline, "strace did not attach within 30 s"
            time.sleep(0.1)
        if tracer.poll() is None:
            return tracer
        why = f"strace exited {tracer.returncode}: {tracer.communicate()[1][-500:]!r}; " \
              f"pid {pid}: {_status(pid)}"
        time.sleep(1)
    raise AssertionError(f"strace did not attach: {why}")


def _status(pid: int) -> dict[str, str]:
    from mldebug.ranks import proc_status

    return proc_status(pid)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_during_fr_trigger_out_leave_nothing(sig, ns_job, tmp_path):
    """row: signals-fr-trigger-out - SIGTERM/SIGINT while `fr trigger --out` waits for the
    ranks (here the frozen ones keep it waiting): exit 143/130 and no --out, no staging
    directory beside it (it once left a half-filled --out); a finished run leaves the whole
    output (verdicts-three-frozen)."""
    p = subprocess.Popen([sys.executable, "-m", "mldebug", "fr", "trigger", "--dir",
                          str(ns_job["frdir"]), "--timeout", "60", "--out", str(tmp_path / "o")],
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 60
        while not any(x.name.startswith(".o.tmp-") for x in tmp_path.iterdir()):
            assert time.monotonic() < deadline and p.poll() is None, p.stderr
            time.sleep(0.1)
        time.sleep(1.5)  # rank 0's dump is in; the frozen ranks are being waited for
        p.send_signal(sig)
        rc = p.wait(30)
    finally:
        p.kill()
        p.wait()
    assert rc == 128 + sig and list(tmp_path.iterdir()) == [], (rc, list(tmp_path.iterdir()))


def test_verdict_two_containers_on_one_loopback_port_are_two_jobs(capsys):
    """row: verdicts-container-loopback - two containers (own pid and network namespaces) on
    one host each run a job on 127.0.0.1:29500: two jobs, never one job whose ranks 0 and 1
    came from different containers (the loopback key is per network namespace)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("MASTER_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI"))}
    base.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    code = "import time; time.sleep(120)  # mldebug-safety-table-containers"
    procs = [subprocess.Popen(["unshare", "--net", "--pid", "--fork", "--mount-proc",
                               "--kill-child", sys.executable, "-c", code],
                              env=dict(base, RANK=str(r)), start_new_session=True)
             for r in (0, 1)]
    try:
        time.sleep(1.5)
        if any(p.poll() is not None for p in procs):
            pytest.skip("unshare --net --pid is not allowed here")
        rc, out, err = _cli(["hang", "--pattern", "mldebug-safety-table-containers", "--json"],
                            capsys)
        doc = json.loads(out)
        ranks = {p["rank"]: p for p in doc["processes"]}
        assert sorted(ranks) == [0, 1] and all(p.get("ns_pid") == 1 for p in ranks.values())
        assert ranks[0]["job"] != ranks[1]["job"], [p["job"] for p in ranks.values()]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_verdict_two_pid_namespaces_sharing_one_fr_directory(tmp_path, capsys):
    """row: verdicts-fr-shared-dir - two containers' ranks, both pid 1 in their own pid
    namespace, register in one dump directory: each keeps its own registration (the name
    carries the namespace; the second once took the first's FIFO and file) and both dump."""
    pytest.importorskip("torch")
    d = tmp_path / "fr"
    d.mkdir(mode=0o700)
    code = ("import mldebug.fr, time; mldebug.fr.enable(); print('ok', flush=True); "
            "time.sleep(120)  # mldebug-safety-table-frdir")
    env = dict(os.environ, MLDEBUG_FR_DIR=str(d), PYTHONPATH=str(REPO))
    procs = [subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                               sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True, start_new_session=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ok":
                pytest.skip("unshare --pid is not allowed here")
        assert len(list(d.glob(".mldebug-fr-*-1-ns*.json"))) == 2, sorted(os.listdir(d))
        rc, out, err = _cli(["fr", "trigger", "--dir", str(d), "--timeout", "60", "--json",
                             "--out", str(tmp_path / "o")], capsys)
        doc = json.loads(out)
        assert rc == 0 and len(doc["files"]) == 2, doc
        assert doc["nodes"][0]["errors"] == [] and doc["nodes"][0]["silent"] == []
    finally:
        for p in procs:
            p.kill()
            p.wait()
