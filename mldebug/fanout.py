"""Run a stdlib-only Python script on many nodes and collect one JSON document from each.

Engines: pdsh over ssh (through the ``sh`` package) for ``--nodes``/``--hostfile``, and
SLURM's ``srun --overlap --jobid`` for ``--slurm-job``. The script's source travels inside
the command line (base64), so nodes need only a Python 3 - not mldebug. A slow or dead node
never blocks the others: pdsh enforces connect and command timeouts, the whole call has a
deadline, and every node that did not answer gets an error saying why.

A node script prints its result as one line ``MLDEBUG-JSON {...}`` (see ``emit_line``);
anything else it prints is ignored.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError, UsageError
from mldebug.hosts import validate_host

MARKER = "MLDEBUG-JSON "

# Runs on the node: decode the script from argv[1], run it as __main__ with argv[2:].
_BOOTSTRAP = (
    "import base64,sys;s=base64.b64decode(sys.argv[1]).decode();"
    "sys.argv=[sys.argv[0]]+sys.argv[2:];"
    "exec(compile(s,'<mldebug-node>','exec'),{'__name__':'__main__'})"
)


def emit_line(doc: dict[str, Any]) -> str:
    """How a node script reports: one marked line of compact JSON."""
    return MARKER + json.dumps(doc, separators=(",", ":"), default=str)


@dataclass
class NodeResult:
    """What one node answered: its JSON document, or why there is none."""

    host: str
    data: dict[str, Any] | None = None
    error: str | None = None
    stderr: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.data is not None


@dataclass
class Target:
    """Where to run: local (no hosts), a list of hosts over pdsh, or a SLURM job."""

    hosts: list[str] = field(default_factory=list)
    slurm_job: str | None = None

    @property
    def is_local(self) -> bool:
        return not self.hosts and self.slurm_job is None


def remote_command(script_source: str, args: Sequence[str], python: str | None = None) -> str:
    """The shell command a node runs: the caller's interpreter if it exists there, else python3."""
    b64 = base64.b64encode(script_source.encode()).decode()
    py = python or sys.executable
    quoted_args = " ".join(shlex.quote(a) for a in args)
    return (
        f"P={shlex.quote(py)}; [ -x \"$P\" ] || P=python3; "
        f"exec \"$P\" -c {shlex.quote(_BOOTSTRAP)} {b64} {quoted_args}"
    )


def pdsh_argv(hosts: Sequence[str], *, fanout: int, connect_timeout: float,
              command_timeout: float) -> list[str]:
    for h in hosts:
        validate_host(h)
    return [
        "-R", "ssh", "-S",
        "-f", str(max(1, fanout)),
        "-t", str(max(1, int(round(connect_timeout)))),
        "-u", str(max(1, int(round(command_timeout)))),
        "-w", ",".join(hosts),
    ]


def srun_argv(job: str, command: str) -> list[str]:
    if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job):
        raise UsageError(f"invalid SLURM job id {job!r}.", "Pass the numeric id, e.g. --slurm-job 123456.")
    return [
        "srun", f"--jobid={job}", "--overlap", "--gres=gpu:0", "--ntasks-per-node=1",
        "--kill-on-bad-exit=0", "--quiet", "bash", "-c", command,
    ]


_PDSH_ERR = re.compile(r"^pdsh@[^:]+: (?P<host>[^:]+): (?P<msg>.*)$")
_HOST_LINE = re.compile(r"^(?P<host>[^:\s]+): (?P<rest>.*)$")


def parse_pdsh_output(stdout_lines: Sequence[str], stderr_lines: Sequence[str],
                      hosts: Sequence[str]) -> dict[str, NodeResult]:
    """Split pdsh's ``host: line`` output into one result per host (pure; tested on fixtures)."""
    results = {h: NodeResult(h) for h in hosts}
    for line in stdout_lines:
        m = _HOST_LINE.match(line)
        if not m or m["host"] not in results:
            continue
        res = results[m["host"]]
        rest = m["rest"]
        if rest.startswith(MARKER):
            try:
                res.data = json.loads(rest[len(MARKER):])
            except json.JSONDecodeError as e:
                res.error = f"answered unreadable JSON ({e.msg} at char {e.pos})"
        else:
            res.stderr.append(rest)
    for line in stderr_lines:
        m = _PDSH_ERR.match(line) or _HOST_LINE.match(line)
        if not m or m["host"] not in results:
            continue
        msg = m["msg"] if "msg" in m.groupdict() else m["rest"]
        results[m["host"]].stderr.append(msg)
    for res in results.values():
        if res.data is None and res.error is None:
            res.error = explain_failure(res.stderr)
    return results


def explain_failure(lines: Sequence[str]) -> str:
    """Turn what pdsh/ssh/the shell said about a node into one actionable sentence."""
    text = "\n".join(lines)
    low = text.lower()
    if "command timeout" in low:
        return "did not finish within the command timeout (node busy or hung); raise --timeout"
    if "connect timeout" in low or "connection timed out" in low or "timed out during banner" in low:
        return "unreachable: ssh connection timed out; check the host is up and reachable"
    if "connection refused" in low:
        return "unreachable: ssh connection refused (no sshd listening)"
    if "could not resolve hostname" in low or "name or service not known" in low:
        return "unknown host: the name does not resolve; check the host list"
    if "permission denied" in low:
        return "ssh permission denied: set up key-based login (ssh-copy-id) for this user"
    if "python3: not found" in low or "python3: command not found" in low:
        return "no Python on the node: neither the caller's interpreter nor python3 exists there; pass --remote-python"
    if "exited with exit code 255" in low:
        return "ssh failed (exit code 255): " + (_last_meaningful(lines) or "see ssh -v")
    if text.strip():
        return "no result; the node said: " + _last_meaningful(lines)
    return "no answer (the node printed nothing)"


def _last_meaningful(lines: Sequence[str]) -> str:
    for line in reversed(lines):
        if line.strip() and "exited with exit code" not in line:
            return line.strip()[:300]
    return ""


def _script_source(script: str | Path) -> str:
    return Path(script).read_text() if isinstance(script, Path) else script


def run_script(
    script: str | Path,
    args: Sequence[str],
    target: Target,
    *,
    timeout: float = 30.0,
    connect_timeout: float = 10.0,
    fanout: int = 64,
    remote_python: str | None = None,
    ssh_args: str | None = None,
    on_result: Callable[[NodeResult], None] | None = None,
) -> list[NodeResult]:
    """Run ``script`` with ``args`` on every target node; one result per node, in host order.

    ``timeout`` bounds the script's run on each node; the whole call ends within about
    ``connect_timeout + timeout + 5`` seconds whatever the nodes do.
    """
    source = _script_source(script)
    if target.is_local:
        return [_run_local(source, args, timeout, remote_python)]
    command = remote_command(source, args, remote_python)
    if target.slurm_job is not None:
        return _run_srun(target.slurm_job, command, timeout + connect_timeout + 5)
    argv = pdsh_argv(target.hosts, fanout=fanout, connect_timeout=connect_timeout,
                     command_timeout=timeout)
    env = dict(os.environ)
    env["PDSH_RCMD_TYPE"] = "ssh"
    if ssh_args:
        env["PDSH_SSH_ARGS_APPEND"] = (env.get("PDSH_SSH_ARGS_APPEND", "") + " " + ssh_args).strip()
    out_lines, err_lines = _run_streaming(
        ["pdsh", *argv, command], env, connect_timeout + timeout + 5,
        target.hosts, on_result,
    )
    results = parse_pdsh_output(out_lines, err_lines, target.hosts)
    return [results[h] for h in target.hosts]


def _run_streaming(argv: list[str], env: dict[str, str], deadline_s: float,
                   hosts: Sequence[str],
                   on_result: Callable[[NodeResult], None] | None) -> tuple[list[str], list[str]]:
    """Run pdsh via ``sh``, collecting lines as they arrive; kill it at the deadline."""
    try:
        import sh
    except ImportError:  # pragma: no cover - sh is a core dependency
        raise MldebugError("the 'sh' package is missing.", "pip install sh") from None
    try:
        pdsh = sh.Command("pdsh")
    except sh.CommandNotFound:
        raise MldebugError(
            "pdsh is not installed on this machine; it is needed for --nodes/--hostfile.",
            "Install it (apt-get install pdsh / yum install pdsh) or use --slurm-job.",
        ) from None
    out_lines: list[str] = []
    err_lines: list[str] = []
    lock = threading.Lock()

    def on_out(line: str) -> None:
        line = line.rstrip("\n")
        with lock:
            out_lines.append(line.rstrip("\r"))
        if on_result is not None:
            m = _HOST_LINE.match(line)
            if m and m["rest"].startswith(MARKER):
                on_result(NodeResult(m["host"], data={}))

    def on_err(line: str) -> None:
        with lock:
            err_lines.append(line.rstrip("\n").rstrip("\r"))

    proc = pdsh(*argv[1:], _env=env, _out=on_out, _err=on_err, _bg=True,
                _ok_code=list(range(256)), _tty_out=False, _tty_in=False, _new_session=True,
                _bg_exc=False)
    start = time.monotonic()
    try:
        proc.wait(timeout=deadline_s)
    except sh.TimeoutException:
        try:
            proc.kill_group()
        except Exception:
            pass
        with lock:
            err_lines.append(f"pdsh@local: *: overall deadline of {deadline_s:.0f}s reached")
    except sh.SignalException:
        pass
    _ = time.monotonic() - start
    with lock:
        return list(out_lines), list(err_lines)


def _run_local(source: str, args: Sequence[str], timeout: float,
               python: str | None) -> NodeResult:
    import socket

    host = socket.gethostname().split(".")[0]
    try:
        r = subprocess.run(
            [python or sys.executable, "-c", _BOOTSTRAP,
             base64.b64encode(source.encode()).decode(), *args],
            capture_output=True, text=True, timeout=timeout + 5, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return NodeResult(host, error=f"did not finish within {timeout + 5:.0f}s")
    lines = [f"{host}: {line}" for line in r.stdout.splitlines()]
    errs = [f"{host}: {line}" for line in r.stderr.splitlines()]
    return parse_pdsh_output(lines, errs, [host])[host]


def _run_srun(job: str, command: str, deadline_s: float) -> list[NodeResult]:
    argv = srun_argv(job, command)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s,
                           stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise MldebugError(
            "srun is not on PATH; --slurm-job needs the SLURM client tools.",
            "Run mldebug on a login node of the cluster, or use --nodes with pdsh.",
        ) from None
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        r = subprocess.CompletedProcess(argv, 124, out, "srun: overall deadline reached")
    results: list[NodeResult] = []
    for line in r.stdout.splitlines():
        if line.startswith(MARKER):
            try:
                doc = json.loads(line[len(MARKER):])
            except json.JSONDecodeError:
                continue
            results.append(NodeResult(str(doc.get("host", "?")), data=doc))
    if not results:
        results.append(NodeResult(f"slurm-job-{job}", error=(
            "srun returned no result: " + (r.stderr.strip().splitlines() or ["no output"])[-1])))
    return results


def bundle(modules: Sequence[str], main: str, main_func: str = "main") -> str:
    """One self-contained script from stdlib-only package modules, for ``run_script``.

    Each module's source is registered in ``sys.modules`` under its own name (parent
    packages become empty stubs), then ``main.main_func()`` runs. So a node script can
    ``from mldebug.dist import ...`` on a node where mldebug is not installed.
    """
    import importlib.util

    lines = ["import sys, types", "def _pkg(n):",
             "    if n not in sys.modules:",
             "        m = types.ModuleType(n); m.__path__ = []; sys.modules[n] = m"]
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise MldebugError(f"cannot find module {name} to send to the nodes.",
                               "Reinstall mldebug.")
        source = Path(spec.origin).read_text()
        parts = name.split(".")
        for i in range(1, len(parts)):
            lines.append(f"_pkg({'.'.join(parts[:i])!r})")
        lines.append(f"_m = types.ModuleType({name!r}); sys.modules[{name!r}] = _m")
        lines.append(f"exec(compile({source!r}, {spec.origin!r}, 'exec'), _m.__dict__)")
    lines.append(f"sys.exit(sys.modules[{main!r}].{main_func}())")
    return "\n".join(lines) + "\n"
