"""mldebug pdb without a job: node answers -> sessions and findings (pure), the registry's
safety rules on real files, the CLI's errors, and attach's refusal before Python 3.14."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_cli

from mldebug.cli import main
from mldebug.debugger import registry
from mldebug.debugger.analyze import choose, session_list
from mldebug.debugger.connect import parse_spec
from mldebug.debugger.hooks import wanted_ranks
from mldebug.debugger.report import text_lines
from mldebug.errors import MldebugError, UsageError
from mldebug.findings import fold_hosts


def node_doc(host: str, *sessions: dict) -> dict:
    return {"host": host, "sessions": list(sessions), "skipped": []}


def sess(host: str, rank: int, port: int, run: str = "job1", **kw) -> dict:
    return {"kind": "pdb", "host": host, "pid": 100 + rank, "rank": rank, "port": port,
            "run_id": run, "file": "/w/train.py", "line": 42, "function": "step", **kw}


def test_sessions_errors_and_findings_from_node_answers():
    sl = session_list([
        ("node1", node_doc("node1", sess("node1", 3, 4001), sess("node1", 1, 4002)), None),
        ("node2", None, "unreachable: ssh connection refused (no sshd listening)"),
        ("node3", {"host": "node3", "sessions": [{"pid": "x"}]}, None),
        ("node4", {"host": "node4", "error": "/tmp/mldebug-pdb-0 is owned by uid 7"}, None),
    ])
    assert [(s.rank, s.target) for s in sl.sessions] == [(1, "node1:4002"), (3, "node1:4001")]
    assert [(e.host, e.reason[:20]) for e in sl.errors] == [
        ("node2", "unreachable: ssh con"), ("node3", "answered a malformed"),
        ("node4", "/tmp/mldebug-pdb-0 i")]
    [f] = sl.findings
    assert f.code == "pdb-node-error" and fold_hosts(f.hosts) == "node[2-4]" and f.fix
    doc = json.loads(json.dumps(sl.to_dict()))
    assert doc["schema"] == "mldebug.pdb.list/1" and doc["findings"][0]["code"] == "pdb-node-error"
    assert "token" not in json.dumps(doc)


def test_choose_a_rank_and_the_ambiguous_case():
    sl = session_list([("n1", node_doc("n1", sess("n1", 2, 5000), sess("n1", 2, 5001, run="job2"),
                                       sess("n1", 0, 5002)), None)])
    assert [f.code for f in sl.findings] == ["pdb-rank-ambiguous"]
    assert choose(sl.sessions, 0).port == 5002
    with pytest.raises(MldebugError, match="2 sessions of rank 2"):
        choose(sl.sessions, 2)
    with pytest.raises(MldebugError, match=r"no pdb session of rank 7 is open \(open: rank\(s\) 0,2\)"):
        choose(sl.sessions, 7)


def test_many_sessions_fold_into_one_line_per_place():
    docs = [(f"node{n}", node_doc(f"node{n}", *[sess(f"node{n}", n * 8 + r, 6000 + r)
                                               for r in range(8)]), None) for n in range(1, 1001)]
    sl = session_list(docs)
    lines = text_lines(sl)
    assert lines[0] == "8000 pdb session(s): ranks 8-8007 on node[1-1000] at train.py:42 in step"
    assert len(lines) == 2


def test_parse_spec():
    assert parse_spec("3") == (None, 3)
    assert parse_spec("node7:41234") == ("node7", 41234)
    for bad in ("node7:99999", "x", "-1", "a;b:1"):
        with pytest.raises(UsageError):
            parse_spec(bad)


def test_wanted_ranks():
    assert wanted_ranks(2) == {2} and wanted_ranks([0, 3]) == {0, 3}
    assert wanted_ranks("all") is None and wanted_ranks(None) is None
    with pytest.raises(ValueError):
        wanted_ranks("2")


def test_registry_refuses_links_foreign_modes_and_planted_files(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(registry.RegistryError, match="is a symlink"):
        registry.private_dir(str(link))
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(registry.RegistryError, match="mode 0777"):
        registry.private_dir(str(loose))
    d = registry.private_dir(str(tmp_path / "new"))
    assert os.stat(d).st_mode & 0o777 == 0o700
    doc = {"format": registry.FORMAT, "host": registry.short_host(), "pid": os.getpid(),
           "start": registry.process_start(os.getpid()), "port": 1234, "token": "t" * 32}
    path = registry.write(d, doc)
    assert os.stat(path).st_mode & 0o777 == 0o600
    # a planted symlink and a huge file among the registrations: skipped with reasons
    (tmp_path / "secret").write_text("{}")
    os.symlink(tmp_path / "secret", os.path.join(d, "evil.1.2.session.json"))
    with open(os.path.join(d, "big.1.3.session.json"), "w") as f:
        f.write(" " * (registry.MAX_FILE + 10))
    gone = dict(doc, pid=2 ** 22 + 1, port=999)
    registry.write(d, gone)
    found, skipped = registry.sessions(d)
    assert [s["port"] for s in found] == [1234]
    reasons = {s["file"]: s["reason"] for s in skipped}
    assert "evil.1.2.session.json" in reasons and "big.1.3.session.json" in reasons
    assert any(r.startswith("stale") for r in reasons.values())
    assert registry.find(d, port=1234)["token"] == "t" * 32
    with pytest.raises(registry.RegistryError, match="no open debugger session with port 1"):
        registry.find(d, port=1)


def test_cli_usage_errors(capsys):
    assert main(["pdb", "connect", "x:y:z"]) == 2
    assert "cannot read 'x:y:z' as a rank or HOST:PORT" in capsys.readouterr().err
    assert main(["pdb"]) == 2


def test_list_with_nothing_open_says_so(tmp_path):
    env = dict(os.environ, MLDEBUG_PDB_DIR=str(tmp_path / "none"))
    r = run_cli("pdb", "list", "--json", env=env)
    assert r.returncode == 1
    assert [f["code"] for f in json.loads(r.stdout)["findings"]] == ["pdb-none-open"]
    r = run_cli("pdb", "connect", "0", env=env)
    assert r.returncode == 1 and "no pdb session of rank 0 is open" in r.stderr
    assert "Traceback" not in r.stderr


def test_attach_refuses_before_python_314_with_the_way_that_works():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            stdin=subprocess.DEVNULL)
    try:
        r = run_cli("pdb", "attach", str(proc.pid))
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 1
    v = sys.version_info
    assert f"pid {proc.pid} runs Python {v[0]}.{v[1]}; attaching to a running process needs " \
           "Python 3.14+" in r.stderr
    assert "mldebug.breakpoint(rank=N)" in r.stderr


def test_a_batch_rank_with_stdin_devnull_no_longer_dies(tmp_path):
    """Was bdb.BdbQuit: now a session opens and the process waits for a debugger."""
    env = dict(os.environ, PYTHONPATH=str(REPO), MLDEBUG_PDB_DIR=str(tmp_path / "s"))
    proc = subprocess.Popen([sys.executable, "-c", "import mldebug; mldebug.breakpoint(); "
                             "print('after')"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        assert "waiting for a debugger: mldebug pdb connect" in line
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_node_script_filters_by_slurm_job_and_never_sends_tokens(tmp_path):
    from mldebug.debugger import node

    d = registry.private_dir(str(tmp_path / "s"))
    base = {"format": registry.FORMAT, "host": registry.short_host(), "pid": os.getpid(),
            "start": registry.process_start(os.getpid()), "token": "secret-token", "rank": 0}
    registry.write(d, dict(base, port=4000, slurm_job="777"))
    registry.write(d, dict(base, port=4001, slurm_job="778", rank=1))
    registry.write(d, dict(base, port=4002, host="othernode"))  # a /tmp shared with another node
    doc = node.collect(node.parser().parse_args(["--dir", d, "--slurm-job", "777"]))
    assert [s["port"] for s in doc["sessions"]] == [4000]
    doc = node.collect(node.parser().parse_args(["--dir", d]))
    assert sorted(s["port"] for s in doc["sessions"]) == [4000, 4001]
    assert "secret-token" not in json.dumps(doc)


def test_an_unsafe_session_directory_never_stops_the_rank(tmp_path):
    """A planted symlink as the session directory: the rank says why and runs on."""
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "planted")
    env = dict(os.environ, PYTHONPATH=str(REPO), MLDEBUG_PDB_DIR=str(tmp_path / "planted"))
    code = ("import mldebug\nmldebug.breakpoint()\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
            "    mldebug.post_mortem()\nprint('ran on')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60, stdin=subprocess.DEVNULL, start_new_session=True)
    assert r.returncode == 0 and r.stdout == "ran on\n"
    assert r.stderr.count("cannot open a debugger session") == 2
    assert "is a symlink" in r.stderr and not os.listdir(tmp_path / "elsewhere")
