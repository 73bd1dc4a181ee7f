"""Host lists, hostfiles, and the fan-out's command building and output parsing."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from mldebug.errors import UsageError
from mldebug.fanout import MARKER, Target, parse_pdsh_output, remote_command, run_script, srun_argv
from mldebug.hosts import collapse, expand, parse_hostfile


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
    assert res["node6"].error == "no answer (the node printed nothing)"


def test_remote_command_quotes_everything_and_runs_in_a_shell():
    src = "import sys, json\nprint('MLDEBUG-JSON ' + json.dumps(sys.argv[1:]))\n"
    cmd = remote_command(src, ["a b", "$(touch /tmp/pwned)", "'q'"], python="/no/such/python")
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
    assert r.stdout.strip() == MARKER + '["a b", "$(touch /tmp/pwned)", "\'q\'"]'
    assert shlex.split(cmd)  # a well-formed shell word list


def test_local_target_runs_the_script_here():
    (res,) = run_script("import json\nprint('MLDEBUG-JSON ' + json.dumps({'ok': 1}))\n", [],
                        Target(), timeout=30)
    assert res.data == {"ok": 1}


def test_srun_argv_validates_the_job_id():
    assert srun_argv("123", "true")[:3] == ["srun", "--jobid=123", "--overlap"]
    with pytest.raises(UsageError):
        srun_argv("123;reboot", "true")
