"""Host lists, hostfiles, and the fan-out's command building and output parsing."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field

import pytest

from mldebug.errors import UsageError
from mldebug.fanout import (
    MARKER,
    FanoutOptions,
    NodeJob,
    check_document,
    parse_pdsh_output,
    remote_command,
    run,
    srun_argv,
    to_argv,
)
from mldebug.hang.collect import NODE_MODULES
from mldebug.hosts import collapse, expand, parse_hostfile
from mldebug.nodekit import short_hostname


def test_expand_and_collapse():
    assert expand("node[1-3,7],gpu01") == ["node1", "node2", "node3", "node7", "gpu01"]
    assert collapse(["node1", "node2", "node3", "node7"]) == "node[1-3,7]"
    assert expand("n[01-02]") == ["n01", "n02"]


@pytest.mark.parametrize("bad", ["node[1-", "a;rm -rf /", "-oProxyCommand=x", "a b", "$(id)"])
def test_bad_host_lists_are_refused(bad):
    with pytest.raises(UsageError):
        expand(bad)


def test_hostfile_formats():
    text = "# comment\nnode1 slots=8\nnode2:8\n\nnode[3-4]\nnode1\n"
    assert parse_hostfile(text) == ["node1", "node2", "node3", "node4"]
    with pytest.raises(UsageError, match="hostfile:1"):
        parse_hostfile("node1:x\n")


def test_pdsh_output_parsing():
    out = ["node1: noise", f'node1: {MARKER}{{"host": "node1", "processes": []}}',
           f"node2: {MARKER}{{broken", "node3: Traceback (most recent call last):",
           "node3: ModuleNotFoundError: x"]
    err = ["pdsh@head: node4: ssh exited with exit code 255",
           "node4: ssh: connect to host 10.0.0.4 port 22: Connection refused",
           "pdsh@head: node5: command timeout"]
    res = parse_pdsh_output(out, err, ["node1", "node2", "node3", "node4", "node5", "node6"])
    assert res["node1"].data == {"host": "node1", "processes": []}
    assert "unreadable JSON" in (res["node2"].error or "")
    assert res["node3"].error == "no result; the node said: ModuleNotFoundError: x"
    assert "connection refused" in (res["node4"].error or "")
    assert "command timeout" in (res["node5"].error or "")
    assert res["node6"].error == "no answer (the node ran and printed nothing)"


def test_remote_command_quotes_everything_and_runs_in_a_shell():
    src = "import sys, json\nprint('MLDEBUG-JSON ' + json.dumps(sys.argv[1:]))\n"
    cmd = remote_command(src, ["a b", "$(touch /tmp/pwned)", "'q'"], python="/no/such/python")
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
    assert r.stdout.strip() == MARKER + '["a b", "$(touch /tmp/pwned)", "\'q\'"]'
    assert shlex.split(cmd)  # a well-formed shell word list


def _node_modules() -> list[str]:
    """Every module some capability sends to the nodes."""
    import importlib

    sets = [("mldebug.hang.collect", "NODE_MODULES"), ("mldebug.env.collect", "NODE_MODULES"),
            ("mldebug.fr.collect", "NODE_MODULES"), ("mldebug.debugger.collect", "NODE_MODULES"),
            ("mldebug.memory.top", "NODE_MODULES"), ("mldebug.hang.signal_node", "MODULES")]
    return sorted({m for mod, name in sets
                   for m in getattr(importlib.import_module(mod), name)})


def test_stripped_node_modules_are_the_same_program_on_the_same_lines():
    import ast
    import importlib.util
    from pathlib import Path

    from mldebug.fanout import strip_source

    def without_docstrings(tree: ast.AST) -> str:
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                                  ast.ClassDef)) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                body[0].value.value = ""
        return ast.dump(tree)  # no line numbers: compared below, line by line

    modules = _node_modules()
    assert "mldebug.hang.node" in modules and "mldebug.nodekit" in modules
    for name in modules:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        src = Path(spec.origin).read_text()
        stripped = strip_source(src)
        assert len(stripped) < len(src), name
        assert without_docstrings(ast.parse(stripped)) == without_docstrings(ast.parse(src)), name
        old_lines = {(type(n).__name__, n.lineno) for n in ast.walk(ast.parse(src))
                     if isinstance(n, ast.stmt)}
        new_lines = {(type(n).__name__, n.lineno) for n in ast.walk(ast.parse(stripped))
                     if isinstance(n, ast.stmt)}
        assert old_lines == new_lines, name  # a node's traceback names the real lines


def test_remote_command_carries_the_script_compressed_and_runs_it():
    job = NodeJob(NODE_MODULES, _NoArgs(), {"host": str, "processes": list})
    full = remote_command(job.script(), job.argv())
    cmd = remote_command(job.script(strip=True), job.argv())
    assert len(cmd) < len(full) < len(job.script())  # zlib: a third of the plain base64
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    res = parse_pdsh_output([f"n1: {line}" for line in r.stdout.splitlines()],
                            [f"n1: {line}" for line in r.stderr.splitlines()], ["n1"],
                            schema=job.schema)["n1"]
    assert res.error is None and res.data is not None and res.data["processes"] == []


@dataclass
class _EchoArgs:
    word: str
    times: int = 1
    loud: bool = False
    quiet: bool = False
    extra: list[str] = field(default_factory=list)
    pause: float = 0.0
    budget: float = 1.5


def test_args_dataclass_becomes_argv():
    assert to_argv(_EchoArgs("hi", 2, loud=True, extra=["a b", "c"])) == [
        "--word", "hi", "--times", "2", "--loud", "--extra", "a b", "--extra", "c",
        "--budget", "1.5"]


def test_local_target_runs_a_bundled_job_here():
    job = NodeJob(NODE_MODULES, _NoArgs(), {"host": str, "processes": list})
    (res,) = run(job, FanoutOptions(timeout=30))
    assert res.error is None and res.data is not None
    assert res.data["processes"] == [] and res.host == short_hostname()


@dataclass
class _NoArgs:
    pattern: str = "^no-such-process-mldebug$"


def test_a_bad_node_argument_is_that_nodes_error():
    job = NodeJob(NODE_MODULES, _EchoArgs("x"), {"host": str, "processes": list})
    (res,) = run(job, FanoutOptions(timeout=30))
    assert res.data is None
    assert res.error is not None and res.error.startswith("bad node arguments: unrecognized")


@pytest.mark.parametrize(("doc", "why"), [
    ([1, 2], "answered a list, not a JSON object"),
    ({"host": "n1"}, "answered a document without 'processes'"),
    ({"host": "n1", "processes": "x"},
     "answered a wrongly typed document: 'processes' is str, expected list"),
    ({"host": "n1", "error": "bad node arguments: x"}, "bad node arguments: x"),
])
def test_documents_of_the_wrong_shape_are_named(doc, why):
    assert check_document(doc, {"host": str, "processes": list}) == why
    assert check_document({"host": "n1", "processes": []}, {"host": str, "processes": list}) is None


def test_one_wrongly_typed_document_costs_only_its_node():
    out = [f'node1: {MARKER}{{"host": "node1", "processes": []}}',
           f'node2: {MARKER}{{"host": "node2", "processes": 7}}']
    res = parse_pdsh_output(out, [], ["node1", "node2"], schema={"processes": list})
    assert res["node1"].data == {"host": "node1", "processes": []}
    assert res["node2"].data is None and "'processes' is int" in (res["node2"].error or "")


def test_a_host_cut_by_the_deadline_is_not_reached_not_silent():
    res = parse_pdsh_output([], ["pdsh@head: node1: command timeout"], ["node1", "node2"],
                            deadline_s=50)
    assert "command timeout" in (res["node1"].error or "")
    assert (res["node2"].error or "").startswith("not reached before the overall deadline of 50s")


def test_the_deadline_counts_pdsh_waves():
    opts = FanoutOptions(timeout=20, connect_timeout=10, fanout=64)
    assert opts.deadline(64) == 30 + 10
    assert opts.deadline(2048) == 32 * 30 + 10


def test_srun_argv_validates_the_job_id():
    assert srun_argv("123", "true")[:3] == ["srun", "--jobid=123", "--overlap"]
    assert "--exclude=n1,n2" in srun_argv("123", "true", ["n1", "n2"])
    with pytest.raises(UsageError):
        srun_argv("123;reboot", "true")


def test_every_line_arrives_before_the_reader_returns():
    """With sh, wait(timeout) returned before its reader threads delivered the last lines (up
    to 8 of 512 node answers went missing). Each of five runs must see all of them."""
    import sys

    from mldebug.fanout import PdshStream, _run_streaming

    producer = ("import sys\nfor i in range(512): "
                "sys.stdout.write(f'node{i}: MLDEBUG-JSON {{\"n\": {i}}}' + ' ' * 4000 + '\\n')\n")
    hosts = [f"node{i}" for i in range(512)]
    for _ in range(5):
        got: dict[str, object] = {}
        cut = _run_streaming(["-c", producer], {}, 60,
                             PdshStream(hosts, lambda r, g=got: g.__setitem__(r.host, r.data)),
                             program=sys.executable)
        assert got == {f"node{i}": {"n": i} for i in range(512)} and not cut


def test_a_slurm_jobs_nodes_come_from_its_node_list(monkeypatch):
    from mldebug.fanout import slurm_job_hosts

    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-03],login1")
    assert slurm_job_hosts("77") == ["gpu01", "gpu02", "gpu03", "login1"]


def test_srun_output_is_keyed_by_slurm_node_names():
    from mldebug.fanout import parse_srun_output

    lines = ["0: MLDEBUG-NODE gpu01", '0: MLDEBUG-JSON {"host": "ip-10-0-', '0: 0-1", "proc',
             '0: esses": []}',
             " 1: MLDEBUG-NODE gpu02", "1: Traceback (most recent call last):",
             "1: ModuleNotFoundError: x", "2: MLDEBUG-NODE gpu03",
             '2: MLDEBUG-JSON {"host": "gpu03", "processes": {}}', "srun: warning: noise"]
    res = parse_srun_output(lines, {"host": str, "processes": list})
    assert list(res) == ["gpu01", "gpu02", "gpu03"]
    assert res["gpu01"].data == {"host": "ip-10-0-0-1", "processes": []}
    assert res["gpu02"].error == "no result; the node said: ModuleNotFoundError: x"
    assert "'processes' is dict, expected list" in (res["gpu03"].error or "")


def test_twenty_thousand_hosts_never_hit_the_argument_size_limit(tmp_path, monkeypatch):
    """A host list far beyond what an exec argument list holds (~15,000 long names made
    'Argument list too long') travels to pdsh in a private file: a stand-in pdsh on PATH that
    answers for every host of its -w ^FILE proves every host is reached and answered."""
    import json as _json
    import os as _os

    from mldebug import fanout
    from mldebug.hang.collect import NODE_MODULES, NODE_SCHEMA, CollectOptions

    fake = tmp_path / "pdsh"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import sys\n"
        "w = sys.argv[sys.argv.index('-w') + 1]\n"
        "assert w.startswith('^'), w\n"
        "for h in open(w[1:]).read().split():\n"
        "    print(h + ': MLDEBUG-JSON ' + '{\"host\": \"%s\", \"processes\": []}' % h)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{_os.pathsep}{_os.environ['PATH']}")
    hosts = [f"gpu-node-with-a-long-name-{i:05d}.cluster.example" for i in range(20_000)]
    assert len(",".join(hosts)) > 131_072  # one '-w a,b,...' argument: over MAX_ARG_STRLEN
    got: list[str] = []
    results = fanout.run(fanout.NodeJob(NODE_MODULES, CollectOptions(), NODE_SCHEMA),
                         fanout.FanoutOptions(hosts=hosts, fanout=1024, timeout=5),
                         lambda r: got.append(r.host), progress=False)
    assert len(results) == len(hosts) and not [r for r in results if r.error]
    assert sorted(got) == sorted(hosts)
    _json.dumps([r.host for r in results])


def test_an_oversized_answer_is_cut_and_named_and_the_others_are_read(monkeypatch):
    """A node printing one line over the limit (200 MB in the issue) is refused with that
    reason, not reported as 'not reached'; its neighbours' answers still arrive, and the
    caller never holds the whole line."""
    import sys

    from mldebug import fanout
    from mldebug.fanout import PdshStream, _run_streaming

    monkeypatch.setattr(fanout, "MAX_LINE", 1 << 20)
    producer = ("import sys\n"
                "sys.stdout.write('a: MLDEBUG-JSON {\"n\": 1}\\n')\n"
                "sys.stdout.write('big: MLDEBUG-JSON \"' + 'x' * (5 << 20) + '\"\\n')\n"
                "sys.stdout.write('b: MLDEBUG-JSON {\"n\": 2}\\n')\n")
    got: dict[str, object] = {}
    _run_streaming(["-c", producer], {}, 60,
                   PdshStream(["a", "big", "b"], lambda r: got.__setitem__(r.host, r)),
                   program=sys.executable)
    assert got["a"].data == {"n": 1} and got["b"].data == {"n": 2}  # type: ignore[attr-defined]
    assert got["big"].data is None  # type: ignore[attr-defined]
    assert "over 1 MiB: cut and not read" in got["big"].error  # type: ignore[attr-defined]
