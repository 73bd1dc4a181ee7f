"""Run a stdlib-only node script on many nodes and collect one JSON document from each.

One contract for every capability: a ``NodeJob`` says what runs on a node (the modules to
bundle, always with ``mldebug.nodekit``, and a typed args dataclass that becomes its argv) and
what the caller parses (``schema``); ``FanoutOptions`` says where and how (hosts or a SLURM
job, timeouts, fan-out width, remote Python, ssh options). ``run(job, options, on_result)``
hands each node's ``NodeResult`` to ``on_result`` as soon as that node has answered (and then
forgets its document), and returns one result per node, in host order.

Engines: pdsh over ssh (read line by line as nodes answer: ``PdshStream``, ``_run_streaming``) for
host lists, and SLURM's
``srun --overlap --jobid`` for a job, and ``kubectl exec`` for Kubernetes pods (``_run_k8s``:
one ``kubectl get pods`` per run, then the script on each exec's stdin; ``mldebug.k8s``). The
script travels inside the command line (zlib, then
base64: ``pack``), so nodes need only a Python 3. Every host is bounded by pdsh's own connect (``-t``) and command
(``-u``) timeouts; the whole call has a safety deadline sized for pdsh's waves of ``-f N``
hosts. A node that did not answer gets an error saying why: unreachable, timed out, not
reached before the deadline, printed nothing, or answered a document of the wrong shape.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import shlex
import sys
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from mldebug.errors import MldebugError, UsageError
from mldebug.hosts import validate_host
from mldebug.nodekit import MARKER, short_hostname

if TYPE_CHECKING:  # kubectl's parts load when --k8s/--k8s-job is used
    from mldebug.k8s import K8sTarget, Pod

# Runs on the node: inflate the script from argv[1] (zlib, base64), run it as __main__ with
# argv[2:]. Compressed, the script is a third of its base64 size: pdsh copies the command line
# into every host's ssh, whose cost grows with its length (docs/benchmarks.md, fan-out).
_BOOTSTRAP = (
    "import base64,sys,zlib;s=zlib.decompress(base64.b64decode(sys.argv[1])).decode();"
    "sys.argv=[sys.argv[0]]+sys.argv[2:];"
    "exec(compile(s,'<mldebug-node>','exec'),{'__name__':'__main__'})"
)


def pack(script_source: str) -> str:
    """The script as the bootstrap's argv[1]: zlib (level 9), then base64."""
    return base64.b64encode(zlib.compress(script_source.encode(), 9)).decode()

# Seconds added to the last wave's bound before the safety deadline ends pdsh.
_DEADLINE_SLACK = 10.0


@dataclass
class NodeResult:
    """What one node answered: its JSON document, or why there is none."""

    host: str
    data: dict[str, Any] | None = None
    error: str | None = None
    stderr: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NodeJob:
    """What runs on every node: bundled modules, typed arguments, the answer's shape.

    ``modules`` are stdlib-only modules in import order; the last one's ``main(argv)`` runs.
    ``args`` is a dataclass instance; ``to_argv`` turns its fields into ``--options``.
    ``schema`` maps each top-level key the caller reads to its type: a document without them
    becomes that node's error, so one bad node never costs the others' results.
    """

    modules: tuple[str, ...]
    args: Any
    schema: Mapping[str, type | tuple[type, ...]] = field(default_factory=dict)

    def script(self, strip: bool = False) -> str:
        """The bundled script; ``strip``: without comments and docstrings (to send it)."""
        mods = ("mldebug.nodekit", *(m for m in self.modules if m != "mldebug.nodekit"))
        return bundle(mods, self.modules[-1], strip=strip)

    def argv(self) -> list[str]:
        return to_argv(self.args)


@dataclass
class FanoutOptions:
    """Where and how to run: this host (no hosts, no job), a host list over pdsh, a SLURM job,
    or Kubernetes pods over ``kubectl exec`` (``k8s``: a ``mldebug.k8s.K8sTarget``).

    ``timeout`` bounds each node's run once connected (pdsh ``-u``); ``connect_timeout`` each
    ssh connection (pdsh ``-t``); ``fanout`` how many nodes are contacted at once (pdsh ``-f``).
    ``exclude`` hosts are left out (``-x``, as pdsh has it), for a host list or a SLURM job.
    """

    hosts: list[str] = field(default_factory=list)
    slurm_job: str | None = None
    timeout: float = 30.0
    connect_timeout: float = 10.0
    fanout: int = 64
    remote_python: str | None = None
    ssh_args: str | None = None
    exclude: list[str] = field(default_factory=list)
    k8s: K8sTarget | None = None
    # with k8s: the pods already listed (no second `kubectl get pods`), and the image of the
    # ephemeral container each is reached through instead of an exec (`kubectl debug`)
    k8s_listed: list[Pod] | None = None
    k8s_debug_image: str | None = None

    @property
    def is_local(self) -> bool:
        return not self.hosts and self.slurm_job is None and self.k8s is None

    def deadline(self, n_hosts: int) -> float:
        """Safety bound on a whole run: pdsh works through ``fanout`` hosts at a time, each
        bounded by connect + command timeouts, so ``waves`` of those plus some slack."""
        waves = max(1, math.ceil(n_hosts / max(1, self.fanout)))
        return waves * (self.connect_timeout + self.timeout) + _DEADLINE_SLACK


def to_argv(args: Any) -> list[str]:
    """A node's argv from its args dataclass: ``field_name=v`` -> ``--field-name v``.

    ``True`` -> a bare flag; ``False``/``None``/an empty list/``0.0`` -> nothing (the node's
    default applies: a zero duration means "off", e.g. hang's ``watch``); a list -> the option
    repeated; floats are written without trailing zeros.
    """
    argv: list[str] = []
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        flag = "--" + f.name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                argv += [flag, str(v)]
        elif isinstance(value, float):
            if not value:
                continue
            argv += [flag, f"{value:g}"]
        else:
            argv += [flag, str(value)]
    return argv


def check_document(data: Any, schema: Mapping[str, type | tuple[type, ...]]) -> str | None:
    """Why ``data`` is not the document the caller parses, or None when it is."""
    if not isinstance(data, dict):
        return f"answered a {type(data).__name__}, not a JSON object"
    if set(data) == {"host", "error"} or (data.get("error") and not set(schema) <= set(data)):
        return str(data.get("error"))[:300]
    for key, typ in schema.items():
        if key not in data:
            return f"answered a document without {key!r}"
        if not isinstance(data[key], typ):
            want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
            return (f"answered a wrongly typed document: {key!r} is "
                    f"{type(data[key]).__name__}, expected {want}")
    return None


def remote_command(script_source: str, args: Sequence[str], python: str | None = None) -> str:
    """The shell command a node runs: the caller's interpreter if it exists there, else python3."""
    b64 = pack(script_source)
    py = python or sys.executable
    quoted_args = " ".join(shlex.quote(a) for a in args)
    return (
        f"P={shlex.quote(py)}; [ -x \"$P\" ] || P=python3; "
        f"exec \"$P\" -c {shlex.quote(_BOOTSTRAP)} {b64} {quoted_args}"
    )


def pdsh_argv(hostfile: str, *, fanout: int, connect_timeout: float,
              command_timeout: float) -> list[str]:
    """pdsh options; hosts come from a file (``-w ^FILE``) so no host count exceeds ARG_MAX."""
    return [
        "-R", "ssh", "-S",
        "-f", str(max(1, fanout)),
        "-t", str(max(1, math.ceil(connect_timeout))),
        "-u", str(max(1, math.ceil(command_timeout))),
        "-w", "^" + hostfile,
    ]


def srun_argv(job: str, command: str, exclude: Sequence[str] = ()) -> list[str]:
    if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job):
        raise UsageError(f"invalid SLURM job id {job!r}.", "Pass the numeric id, e.g. --slurm-job 123456.")
    extra = [f"--exclude={','.join(validate_host(h) for h in exclude)}"] if exclude else []
    named = f'echo "{_NODE_LINE}${{SLURMD_NODENAME:-$(hostname -s)}}"; {command}'
    return [
        "srun", f"--jobid={job}", "--overlap", "--gres=gpu:0", "--ntasks-per-node=1",
        "--kill-on-bad-exit=0", "--quiet", "--label", *extra, "bash", "-c", named,
    ]


_PDSH_ERR = re.compile(r"^pdsh@[^:]+: (?P<host>[^:]+): (?P<msg>.*)$")
_HOST_LINE = re.compile(r"^(?P<host>[^:\s]+): (?P<rest>.*)$")


class PdshStream:
    """Turns pdsh's ``host: line`` output into one ``NodeResult`` per host AS LINES ARRIVE.

    A node is complete when its ``MLDEBUG-JSON`` line arrives (its one answer), or some time
    after pdsh says its ssh failed (``exit code``/``timeout``: ``settle`` seconds, so that
    lines still on their way - the marker on the other pipe, ssh's reason - are not lost), or
    when the run ends. Each complete result goes to ``deliver`` at once and nothing of it is
    kept here: memory holds the nodes still running, not every answer.
    """

    _KEEP = 200  # lines kept per unanswered node: enough to say why, bounded

    def __init__(self, hosts: Sequence[str], deliver: Callable[[NodeResult], None], *,
                 schema: Mapping[str, type | tuple[type, ...]] | None = None,
                 settle: float = 1.0) -> None:
        self.pending = {h: NodeResult(h) for h in hosts}
        self.deliver = deliver
        self.schema = schema
        self.settle = settle
        self.ending: dict[str, float] = {}  # host -> when pdsh said it failed

    def out(self, line: str) -> None:
        m = _HOST_LINE.match(line)
        if not m or m["host"] not in self.pending:
            return
        res = self.pending[m["host"]]
        rest = m["rest"]
        if not rest.startswith(MARKER):
            self._said(res, rest)
            return
        try:
            res.data = json.loads(rest[len(MARKER):])
        except (json.JSONDecodeError, ValueError, RecursionError) as e:
            res.error = f"answered unreadable JSON ({str(e)[:200]})"
        self._complete(res.host)

    def err(self, line: str, now: float = 0.0) -> None:
        m = _PDSH_ERR.match(line) or _HOST_LINE.match(line)
        if not m or m["host"] not in self.pending:
            return
        msg = m["msg"] if "msg" in m.groupdict() else m["rest"]
        self._said(self.pending[m["host"]], msg)
        if "msg" in m.groupdict() and ("exit code" in msg or "timeout" in msg):
            self.ending.setdefault(m["host"], now)

    def oversized(self, host: str) -> None:
        """``host`` printed a line over ``MAX_LINE``: cut unread; the node's answer is refused
        with that reason (the other nodes are unaffected)."""
        res = self.pending.get(host)
        if res is None:
            return
        res.data = None
        res.error = (f"answered a line over {MAX_LINE >> 20} MiB: cut and not read (a node "
                     "answer is far smaller; something else printed on the node's stdout)")
        self._complete(host)

    def tick(self, now: float) -> None:
        """Complete the nodes pdsh said failed at least ``settle`` seconds ago."""
        for host in [h for h, t in self.ending.items() if now - t >= self.settle]:
            self._complete(host)

    def finish(self, deadline_s: float | None = None) -> None:
        """The run ended: every node not complete yet is, with the reason it has no answer.
        ``deadline_s``: the run was cut at that overall deadline."""
        for host in list(self.pending):
            self._complete(host, deadline_s)

    def _said(self, res: NodeResult, text: str) -> None:
        res.stderr.append(text)
        if len(res.stderr) > 2 * self._KEEP:
            del res.stderr[:-self._KEEP]

    def _complete(self, host: str, deadline_s: float | None = None) -> None:
        res = self.pending.pop(host, None)
        self.ending.pop(host, None)
        if res is None:
            return
        if res.data is not None and self.schema is not None:
            why = check_document(res.data, self.schema)
            if why is not None:
                res.data, res.error = None, why
        if res.data is None and res.error is None:
            if deadline_s is not None and not res.stderr:
                res.error = (f"not reached before the overall deadline of {deadline_s:.0f}s "
                             "(pdsh contacts --fanout hosts at a time); raise --fanout or "
                             "--timeout")
            else:
                res.error = explain_failure(res.stderr)
        self.deliver(res)


def parse_pdsh_output(stdout_lines: Sequence[str], stderr_lines: Sequence[str],
                      hosts: Sequence[str], *, deadline_s: float | None = None,
                      schema: Mapping[str, type | tuple[type, ...]] | None = None,
                      ) -> dict[str, NodeResult]:
    """Split pdsh's ``host: line`` output into one result per host (pure; tested on fixtures).
    The same parser as a live run (``PdshStream``), fed all lines at once.

    ``deadline_s`` says the run was cut at that overall deadline: a host that said nothing was
    then not reached in time, which is different from a host that ran and printed nothing.
    """
    results: dict[str, NodeResult] = {}
    stream = PdshStream(hosts, lambda r: results.__setitem__(r.host, r), schema=schema)
    for line in stdout_lines:
        stream.out(line)
    for line in stderr_lines:
        stream.err(line)
    stream.finish(deadline_s)
    return {h: results[h] for h in hosts}


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
    return "no answer (the node ran and printed nothing)"


def _last_meaningful(lines: Sequence[str]) -> str:
    for line in reversed(lines):
        if line.strip() and "exited with exit code" not in line:
            return line.strip()[:300]
    return ""


OnResult = Callable[[NodeResult], None]


def run(job: NodeJob, options: FanoutOptions, on_result: OnResult | None = None, *,
        progress: bool = True) -> list[NodeResult]:
    """Run ``job`` on every node of ``options``; one result per node, in host order.

    ``on_result(result)`` is called on the caller's thread with each node's parsed result the
    moment that node's answer is complete (over pdsh, as its answer line arrives; over srun
    and on this host, when the run ends). The fan-out then keeps nothing of it: with
    ``on_result`` the returned list says only ``host`` and ``error`` (``data`` is None), so
    memory holds one answer at a time, not every node's. Without ``on_result`` the returned
    results carry their documents. ``progress``: show nodes answered / total and failures so
    far on stderr when it is a terminal (``mldebug.progress``).
    """
    kept: list[NodeResult] = []

    def keep(r: NodeResult) -> None:
        if on_result is None:
            kept.append(r)
            return
        on_result(r)
        kept.append(NodeResult(r.host, error=r.error))  # the document is the caller's now

    source, args = job.script(strip=not options.is_local), job.argv()
    if options.is_local:
        keep(_run_local(source, args, options, job.schema))
        return kept
    if options.k8s is not None:
        pods = options.k8s_listed if options.k8s_listed is not None else k8s_pods(options)
        from mldebug.progress import fanout_progress

        with fanout_progress(len(pods), shown=progress) as bar:
            def deliver_pod(r: NodeResult) -> None:
                bar(r.host, r.data is not None)
                keep(r)

            _run_k8s(pods, source, args, options, job.schema, deliver_pod)
        pod_order = {p.name: i for i, p in enumerate(pods)}
        return sorted(kept, key=lambda r: pod_order.get(r.host, len(pod_order)))
    command = remote_command(source, args, options.remote_python)
    if options.slurm_job is not None:
        for r in _run_srun(options, command, job.schema):
            keep(r)
        return kept
    excluded = set(options.exclude)
    hosts = [validate_host(h) for h in options.hosts if h not in excluded]
    if not hosts:
        raise UsageError("every host of the list is excluded.", "Check --exclude.")
    from mldebug.progress import fanout_progress

    with fanout_progress(len(hosts), shown=progress) as bar:
        def deliver(r: NodeResult) -> None:
            bar(r.host, r.data is not None)
            keep(r)

        _run_pdsh(hosts, command, options, job.schema, deliver)
    order = {h: i for i, h in enumerate(hosts)}
    return sorted(kept, key=lambda r: order[r.host])


def _run_pdsh(hosts: list[str], command: str, options: FanoutOptions,
              schema: Mapping[str, type | tuple[type, ...]], deliver: OnResult) -> None:
    env = dict(os.environ)
    env["PDSH_RCMD_TYPE"] = "ssh"
    env.pop("WCOLL", None)  # the host list is ours; pdsh must not add its default one
    if options.ssh_args:
        env["PDSH_SSH_ARGS_APPEND"] = (env.get("PDSH_SSH_ARGS_APPEND", "") + " "
                                       + options.ssh_args).strip()
    import tempfile

    deadline = options.deadline(len(hosts))
    with tempfile.NamedTemporaryFile("w", prefix="mldebug-hosts-", suffix=".txt") as f:
        f.write("\n".join(hosts) + "\n")
        f.flush()
        argv = pdsh_argv(f.name, fanout=options.fanout, connect_timeout=options.connect_timeout,
                         command_timeout=options.timeout)
        _run_streaming([*argv, command], env, deadline, PdshStream(hosts, deliver, schema=schema))


_EOF = None  # a reader's last item on the queue
MAX_LINE = 64 << 20  # characters of one node's answer line; a longer one is cut and refused
_CUT = "\x00cut\x00"  # a reader's item for a line over MAX_LINE: _CUT + the line's host prefix


def _run_streaming(argv: list[str], env: dict[str, str], deadline_s: float,
                   stream: PdshStream, program: str = "pdsh") -> bool:
    """Run pdsh in its own process group and feed its lines to ``stream`` as they arrive, on
    this thread (so ``stream.deliver`` - the caller's ``on_result`` - runs here, and what it
    raises ends pdsh); end the group at the deadline. Returns whether the deadline cut the run.

    Two reader threads hand lines over through a short queue: a slow consumer holds pdsh back
    instead of piling up answers. A plain ``subprocess`` reader, not ``sh``: side by side on
    512 node answers, parsing included, ``sh`` spent 3.3x the CPU even with its logging off
    (15x for the reading alone), and ``sh``'s
    ``wait(timeout=...)`` returned before its reader threads had delivered the last lines
    (benchmarks/bench_fanout.py, docs/benchmarks.md).
    """
    import queue
    import shutil
    import signal
    import subprocess
    import time

    exe = shutil.which(program, path=env.get("PATH", os.environ.get("PATH")))
    if exe is None:
        raise MldebugError(
            "pdsh is not installed on this machine; it is needed for --nodes/--hostfile.",
            "Install it (apt-get install pdsh / yum install pdsh) or use --slurm-job.",
        )
    lines: queue.Queue[tuple[bool, str | None]] = queue.Queue(maxsize=64)
    proc = subprocess.Popen([exe, *argv], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)

    def pump(src: Any, is_out: bool) -> None:
        try:
            while True:
                line = src.readline(MAX_LINE)
                if not line:
                    break
                if len(line) >= MAX_LINE and not line.endswith("\n"):
                    while True:  # the rest of that line is dropped unread, a MiB at a time
                        rest = src.readline(1 << 20)
                        if not rest or rest.endswith("\n"):
                            break
                    lines.put((is_out, _CUT + line[:256].split(":", 1)[0]))
                    continue
                lines.put((is_out, line.rstrip("\n").rstrip("\r")))
        finally:
            lines.put((is_out, _EOF))

    readers = [threading.Thread(target=pump, args=(proc.stdout, True), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, False), daemon=True)]
    for t in readers:
        t.start()
    end = time.monotonic() + deadline_s
    cut, open_streams = False, 2

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # pdsh and the ssh clients it started
        except ProcessLookupError:
            pass

    try:
        while open_streams:
            now = time.monotonic()
            if now >= end and not cut:
                cut = True
                kill()
                end = now + 10  # a leftover ssh holding the pipe cannot keep us here
            elif now >= end:
                break
            try:
                is_out, line = lines.get(timeout=min(0.25, max(0.01, end - now)))
            except queue.Empty:
                stream.tick(time.monotonic())
                continue
            if line is _EOF:
                open_streams -= 1
            elif line.startswith(_CUT):
                stream.oversized(line[len(_CUT):])
            elif is_out:
                stream.out(line)
            else:
                stream.err(line, time.monotonic())
            stream.tick(time.monotonic())
        try:
            proc.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:  # pipes closed, pdsh still there: end it
            cut = True
            kill()
            proc.wait(timeout=10)
    except BaseException:  # Ctrl-C, or the caller's on_result raised: leave no pdsh behind
        kill()
        proc.wait()
        raise
    stream.finish(deadline_s if cut else None)
    return cut


def _run_local(source: str, args: Sequence[str], options: FanoutOptions,
               schema: Mapping[str, type | tuple[type, ...]]) -> NodeResult:
    import subprocess

    host = short_hostname()
    try:
        r = subprocess.run(
            [options.remote_python or sys.executable, "-c", _BOOTSTRAP,
             pack(source), *args],
            capture_output=True, text=True, timeout=options.timeout + 5,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return NodeResult(host, error=f"did not finish within {options.timeout + 5:.0f}s; "
                                      "raise --timeout")
    lines = [f"{host}: {line}" for line in r.stdout.splitlines()]
    errs = [f"{host}: {line}" for line in r.stderr.splitlines()]
    return parse_pdsh_output(lines, errs, [host], schema=schema)[host]


def _kubectl() -> str:
    import shutil

    from mldebug import k8s

    exe = shutil.which("kubectl")
    if exe is None:
        raise k8s.kubectl_missing()
    return exe


def k8s_pods(options: FanoutOptions) -> list[Pod]:
    """The pods of ``options.k8s`` from ONE ``kubectl get pods -o json`` (read up to
    ``MAX_PODS_JSON`` bytes, within ``GET_TIMEOUT`` s), less ``--exclude``d ones."""
    from mldebug import k8s

    assert options.k8s is not None
    t = k8s.check_target(options.k8s)
    exe = _kubectl()
    run = run_bounded([exe, *k8s.get_pods_argv(t)], timeout=k8s.GET_TIMEOUT + 5,
                      limit=k8s.MAX_PODS_JSON + 1)
    if run.size > k8s.MAX_PODS_JSON:
        raise MldebugError(f"kubectl get pods answered over {k8s.MAX_PODS_JSON >> 20} MiB "
                           "of JSON; not read.",
                           "Narrow it: --k8s with a label selector, or --namespace.")
    out, rc, stderr = run.out, run.rc, run.err
    if run.timed_out:
        stderr += f"\nno answer within {k8s.GET_TIMEOUT + 5:.0f}s"
    if rc != 0:
        raise k8s.get_failure(stderr, t)
    pods = k8s.select(t, k8s.parse_pods(out.decode(errors="replace")))
    excluded = set(options.exclude)
    pods = [p for p in pods if p.name not in excluded]
    if not pods:
        raise UsageError("every pod is excluded.", "Check --exclude.")
    return pods


@dataclass
class Bounded:
    """What ``run_bounded`` got: stdout (kept, or written to the sink), its size, whether it
    was cut at the limit or the time, the exit status and stderr's first MiB."""

    out: bytes
    size: int
    rc: int | None
    err: str
    timed_out: bool
    cut: bool


def run_bounded(argv: Sequence[str], *, timeout: float, limit: int,
                sink: BinaryIO | None = None, stderr_limit: int = 1 << 20) -> Bounded:
    """Run a client of ours (kubectl) in a session of its own, stdin /dev/null: at most
    ``limit`` bytes of its stdout (kept, or written to ``sink``), its stderr drained (the first
    ``stderr_limit`` bytes kept); its process group SIGKILLed once over ``limit`` or after
    ``timeout`` seconds. One bounded read for every outside command's answer."""
    import subprocess

    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    err: list[bytes] = []
    reader = threading.Thread(
        target=lambda: err.append(_read_bounded(proc.stderr, stderr_limit, drain=True)),
        daemon=True)
    reader.start()
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _killpg(proc.pid)

    timer = threading.Timer(timeout, expire)
    timer.start()
    kept: list[bytes] = []
    size, cut = 0, False
    try:
        src: Any = proc.stdout
        while chunk := src.read1(1 << 20):
            if size + len(chunk) > limit:
                chunk, cut = chunk[:limit - size], True
            (sink.write if sink is not None else kept.append)(chunk)
            size += len(chunk)
            if cut:
                _killpg(proc.pid)
                break
        rc: int | None = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            _killpg(proc.pid)
            proc.wait()
        reader.join(5)
    return Bounded(b"".join(kept), size, rc, (err[0] if err else b"").decode(errors="replace"),
                   expired.is_set(), cut)


def _read_bounded(src: Any, limit: int, drain: bool = False) -> bytes:
    """Up to ``limit`` bytes of ``src``; the rest is left unread, or with ``drain`` read and
    dropped (so the writer never blocks on a full pipe)."""
    chunks, n = [], 0
    while True:
        b = src.read1(1 << 20)
        if not b:
            break
        if n < limit:
            chunks.append(b[:limit - n])
            n += len(chunks[-1])
        if n >= limit and not drain:
            break
    return b"".join(chunks)


def _killpg(pid: int) -> None:
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)  # kubectl (never a rank: it is our own client)
    except (ProcessLookupError, PermissionError):
        pass


def _run_k8s(pods: Sequence[Pod], source: str, args: Sequence[str], options: FanoutOptions,
             schema: Mapping[str, type | tuple[type, ...]], deliver: OnResult) -> None:
    """``kubectl exec -i`` into each pod, ``options.fanout`` at a time, each bounded by
    ``timeout + connect_timeout``; ``deliver`` (on this thread) gets each pod's result as that
    pod answers. Pods that are not Running, or lack ``--container``, are answered at once with
    why. The whole run has the pdsh route's safety deadline (waves of ``--fanout`` pods)."""
    import queue
    import time

    from mldebug import k8s

    assert options.k8s is not None
    t = options.k8s
    exe = _kubectl()
    program = k8s.node_program(source, args).encode()
    per_pod = options.timeout + options.connect_timeout
    todo: queue.Queue[Pod] = queue.Queue()
    done: queue.Queue[NodeResult] = queue.Queue()
    waiting = set()
    for p in pods:
        why = k8s.not_running_error(p) if not p.runnable else k8s.container_error(t, p)
        if why is not None:
            deliver(NodeResult(p.name, error=why))
        else:
            todo.put(p)
            waiting.add(p.name)
    if not waiting:
        return
    stop = threading.Event()
    running: dict[int, Any] = {}
    lock = threading.Lock()

    def worker() -> None:
        while not stop.is_set():
            try:
                pod = todo.get_nowait()
            except queue.Empty:
                return
            if options.k8s_debug_image:  # an ephemeral container, named by this run
                import secrets

                argv = k8s.debug_argv(t, pod, options.k8s_debug_image, options.remote_python,
                                      k8s.debug_container_name(secrets.token_hex(3)))
            else:
                argv = k8s.exec_argv(t, pod, options.remote_python)
            try:
                res = _exec_pod(exe, argv, program, per_pod, pod.name, schema,
                                options.remote_python or "python3", running, lock,
                                debug=bool(options.k8s_debug_image))
            except Exception as e:  # one pod's failure is that pod's result, never the run's
                res = NodeResult(pod.name, error=f"kubectl exec failed: {str(e)[:300]}")
            done.put(res)

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(min(max(1, options.fanout), len(waiting)))]
    for th in threads:
        th.start()
    deadline = options.deadline(len(waiting))
    end = time.monotonic() + deadline
    try:
        while waiting:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                res = done.get(timeout=min(0.5, left))
            except queue.Empty:
                continue
            if res.host in waiting:
                waiting.discard(res.host)
                deliver(res)
    finally:
        stop.set()
        with lock:
            for pid in list(running):
                _killpg(pid)
    for name in [p.name for p in pods if p.name in waiting]:
        deliver(NodeResult(name, error=f"not reached before the overall deadline of "
                                       f"{deadline:.0f}s (kubectl exec runs --fanout pods at a "
                                       "time); raise --fanout or --timeout"))


def _exec_pod(exe: str, argv: list[str], program: bytes, timeout: float, pod: str,
              schema: Mapping[str, type | tuple[type, ...]], python: str,
              running: dict[int, Any], lock: threading.Lock, debug: bool = False) -> NodeResult:
    """One pod: the program on kubectl's stdin, its stdout read line by line (a line at most
    ``MAX_LINE``), at most ``_KEEP`` lines of what else it said; killed after ``timeout``."""
    import collections
    import subprocess

    from mldebug import k8s

    proc = subprocess.Popen([exe, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    with lock:
        running[proc.pid] = proc
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        _killpg(proc.pid)

    timer = threading.Timer(timeout, expire)
    timer.start()
    said: collections.deque[str] = collections.deque(maxlen=PdshStream._KEEP)

    def feed() -> None:
        try:
            assert proc.stdin is not None
            proc.stdin.write(program)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def errors() -> None:
        assert proc.stderr is not None
        for raw in iter(lambda: proc.stderr.readline(1 << 16), b""):  # type: ignore[union-attr]
            said.append(raw.decode(errors="replace").rstrip("\r\n"))

    helpers = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=errors, daemon=True)]
    for h in helpers:
        h.start()
    answer: bytes | None = None
    oversized = False
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline(MAX_LINE)
            if not line:
                break
            if len(line) >= MAX_LINE and not line.endswith(b"\n"):
                oversized = True
                while True:  # the rest of that line is dropped unread, a MiB at a time
                    rest = proc.stdout.readline(1 << 20)
                    if not rest or rest.endswith(b"\n"):
                        break
                continue
            if line.startswith(MARKER.encode()):
                answer = line[len(MARKER):]
            else:
                said.append(line.decode(errors="replace").rstrip("\r\n"))
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _killpg(proc.pid)
        proc.wait()
    finally:
        timer.cancel()
        with lock:
            running.pop(proc.pid, None)
    for h in helpers:
        h.join(5)
    res = NodeResult(pod, stderr=list(said))
    if answer is not None:
        try:
            res.data = json.loads(answer)
        except (json.JSONDecodeError, ValueError, RecursionError, UnicodeDecodeError) as e:
            res.error = f"answered unreadable JSON ({str(e)[:200]})"
        if res.data is not None:
            res.error = check_document(res.data, schema)
            if res.error is not None:
                res.data = None
            elif isinstance(res.data, dict) and res.data.get("host") not in (None, pod):
                # the container's host name need not be the pod's (JobSet sets its own): the
                # answer is filed under the pod kubectl reached, its name kept beside
                res.data["pod_hostname"] = res.data["host"]
                res.data["host"] = pod
    elif oversized:
        res.error = (f"answered a line over {MAX_LINE >> 20} MiB: cut and not read (a node "
                     "answer is far smaller; something else printed on the pod's stdout)")
    elif timed_out.is_set():
        res.error = (f"did not finish within {timeout:.0f}s (kubectl exec, the pod busy or "
                     "hung); raise --timeout")
    elif debug:
        res.error = k8s.explain_debug_failure(res.stderr, pod, python)
    else:
        res.error = k8s.explain_exec_failure(res.stderr, pod, python)
    return res


def slurm_job_hosts(job: str) -> list[str]:
    """The nodes of a SLURM job (to name the ones srun got no answer from), or [] if unknown.

    Inside the job, ``SLURM_JOB_NODELIST``; elsewhere ``squeue -h -j JOB -o %N``.
    """
    import subprocess

    from mldebug.hosts import expand

    nodelist = ""
    if os.environ.get("SLURM_JOB_ID") == job:
        nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        try:
            r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True,
                               text=True, timeout=15, stdin=subprocess.DEVNULL)
            nodelist = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
        except (OSError, subprocess.SubprocessError):
            return []
    try:
        return expand(nodelist) if nodelist else []
    except UsageError:
        return []


def _run_srun(options: FanoutOptions, command: str,
              schema: Mapping[str, type | tuple[type, ...]]) -> list[NodeResult]:
    import subprocess  # not at the top: a local `mldebug hang` never needs it

    job = str(options.slurm_job)
    argv = srun_argv(job, command, options.exclude)
    deadline = options.connect_timeout + options.timeout + _DEADLINE_SLACK
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=deadline,
                           stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise MldebugError(
            "srun is not on PATH; --slurm-job needs the SLURM client tools.",
            "Run mldebug on a login node of the cluster, or use --nodes with pdsh.",
        ) from None
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        r = subprocess.CompletedProcess(argv, 124, out,
                                        f"srun: overall deadline of {deadline:.0f}s reached")
    results = parse_srun_output(r.stdout.splitlines(), schema)
    last = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
    excluded = set(options.exclude)
    for host in slurm_job_hosts(job):
        if host not in results and host not in excluded:
            results[host] = NodeResult(host, error=f"no answer from srun on this node: {last}")
    if not results:
        results[f"slurm-job-{job}"] = NodeResult(f"slurm-job-{job}",
                                                 error=f"srun returned no result: {last}")
    return list(results.values())


_SRUN_LINE = re.compile(r"^\s*(?P<task>\d+): (?P<rest>.*)$")
_NODE_LINE = "MLDEBUG-NODE "


def parse_srun_output(lines: Sequence[str], schema: Mapping[str, type | tuple[type, ...]],
                      ) -> dict[str, NodeResult]:
    """One result per node from ``srun --label`` output (pure; tested on fixtures).

    Each task (one per node) first prints ``MLDEBUG-NODE $SLURMD_NODENAME``, so answers are
    keyed by SLURM's node names - the names the job's node list uses - even where a node's
    own host name differs. The answer is a node script's last line, so every later piece of
    that task (srun cuts long lines into labelled pieces of about 1 KB) belongs to it.
    """
    node_of: dict[str, str] = {}
    answer: dict[str, str] = {}
    said: dict[str, list[str]] = {}
    for line in lines:
        m = _SRUN_LINE.match(line)
        if m is None:
            continue
        task, rest = m["task"], m["rest"]
        if task in answer:  # srun labels each ~1 KB piece of a long line: join them again
            answer[task] += rest
        elif rest.startswith(_NODE_LINE):
            node_of[task] = rest[len(_NODE_LINE):].strip()
        elif rest.startswith(MARKER):
            answer[task] = rest[len(MARKER):]
        else:
            said.setdefault(task, []).append(rest)
    results: dict[str, NodeResult] = {}
    for task in sorted(set(node_of) | set(answer), key=int):
        host = node_of.get(task) or f"task{task}"
        res = NodeResult(host, stderr=said.get(task, []))
        if task in answer:
            try:
                res.data = json.loads(answer[task])
                res.error = check_document(res.data, schema)
            except (json.JSONDecodeError, ValueError, RecursionError) as e:
                res.error = f"answered unreadable JSON ({str(e)[:200]})"
            if res.error is not None:
                res.data = None
        else:
            res.error = explain_failure(res.stderr)
        results[host] = res
    return results


def bundle(modules: Sequence[str], main: str, main_func: str = "main", *,
           strip: bool = False) -> str:
    """One self-contained script from stdlib-only package modules (see ``NodeJob.script``).

    Each module's source is registered in ``sys.modules`` under its own name (parent
    packages become empty stubs), then ``main.main_func(sys.argv[1:])`` runs. So a node
    script can ``from mldebug.nodekit import ...`` on a node where mldebug is not installed.
    ``strip``: each module without its comments and docstrings (``strip_source``).
    """
    import importlib.util
    from pathlib import Path

    lines = ["import sys, types", "def _pkg(n):",
             "    if n not in sys.modules:",
             "        m = types.ModuleType(n); m.__path__ = []; sys.modules[n] = m"]
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise MldebugError(f"cannot find module {name} to send to the nodes.",
                               "Reinstall mldebug.")
        source = Path(spec.origin).read_text()
        if strip:
            source = strip_source(source)
        parts = name.split(".")
        for i in range(1, len(parts)):
            lines.append(f"_pkg({'.'.join(parts[:i])!r})")
        lines.append(f"_m = types.ModuleType({name!r}); sys.modules[{name!r}] = _m; "
                     f"_m.__file__ = {spec.origin!r}")  # as imported (the path is the caller's)
        lines.append(f"exec(compile({source!r}, {spec.origin!r}, 'exec'), _m.__dict__)")
    lines.append(f"sys.exit(sys.modules[{main!r}].{main_func}(sys.argv[1:]))")
    return "\n".join(lines) + "\n"


def strip_source(source: str) -> str:
    """``source`` without comments and docstrings, every line where it was (a node's
    traceback names the same lines): a quarter less to send, compressed."""
    import ast
    import io
    import tokenize

    lines = source.splitlines(keepends=True)
    spans: list[tuple[int, int, int, int, str]] = []  # (row, col, end row, end col, new text)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str) and first.end_lineno is not None
                    and first.end_col_offset is not None):
                spans.append((first.lineno, first.col_offset, first.end_lineno,
                              first.end_col_offset, '""'))  # still a docstring: __future__ ok
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:  # with the blanks before it
            row, col = tok.start
            line = lines[row - 1]
            spans.append((row, len(line[:col].rstrip()) if line[:col].strip() else 0,
                          *tok.end, ""))
    for row, col, end_row, end_col, text in sorted(spans, reverse=True):
        head, tail = lines[row - 1][:col] + text, lines[end_row - 1][end_col:]
        if row == end_row:
            lines[row - 1] = head + tail
        else:
            lines[row - 1:end_row] = [head + "\n", *["\n"] * (end_row - row - 1), tail]
    return "".join(lines)  # trailing blanks stay: a line inside a string literal is data
