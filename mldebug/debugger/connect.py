"""``mldebug pdb connect`` / ``attach``: find the session, then talk to it on its node.

On the session's own host the client runs in this process; on another host it runs there
through ``ssh -t`` (the registration, with its token, is read on the node as the user who
owns it), so nothing ever listens beyond 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from typing import Any

from mldebug.debugger import registry
from mldebug.debugger.analyze import choose, session_list
from mldebug.debugger.collect import NodeArgs, node_answers, node_command
from mldebug.dist import short_hostname
from mldebug.errors import MldebugError, UsageError
from mldebug.fanout import FanoutOptions
from mldebug.hosts import validate_host

_HOST_PORT = re.compile(r"(?P<host>[^:\s]+):(?P<port>[0-9]{1,5})")


def parse_spec(spec: str) -> tuple[str | None, int]:
    """``RANK`` -> (None, rank); ``HOST:PORT`` -> (host, port)."""
    m = _HOST_PORT.fullmatch(spec)
    if m:
        port = int(m["port"])
        if not 0 < port < 65536:
            raise UsageError(f"port {port} is out of range.", "Copy HOST:PORT from mldebug pdb list.")
        return validate_host(m["host"]), port
    if spec.isdecimal():
        return None, int(spec)
    raise UsageError(f"cannot read {spec!r} as a rank or HOST:PORT.",
                     "Pass a rank number (mldebug pdb connect 2) or HOST:PORT from mldebug pdb list.")


def list_sessions(target: FanoutOptions, directory: str | None) -> Any:
    return session_list(node_answers(target, NodeArgs(directory, target.slurm_job)))


def _ssh(host: str, command: str, ssh_args: str | None) -> int:
    opts = shlex.split(os.environ.get("PDSH_SSH_ARGS_APPEND", "")) + shlex.split(ssh_args or "")
    try:
        return subprocess.call(["ssh", "-t", *opts, host, command])
    except FileNotFoundError:
        raise MldebugError("ssh is not installed here; it is needed to reach another node.",
                           "Install openssh-client, or run mldebug pdb connect on the node.") from None


def connect(spec: str, target: FanoutOptions, *, directory: str | None) -> int:
    """Open the terminal on the session named by ``spec`` (a rank, or HOST:PORT)."""
    host, number = parse_spec(spec)
    if host is None:
        sessions = list_sessions(target, directory)
        chosen = choose(sessions.sessions, number)
        host, port = chosen.host, chosen.port
    else:
        port = number
    if target.k8s is not None:  # stage 1 of #45 lists the pods' sessions; connect is ssh's
        raise MldebugError(f"mldebug pdb connect does not reach pod {host} yet: it connects "
                           "over ssh, not kubectl exec.",
                           f"The session is {host}:{port}; open a shell in the pod (kubectl "
                           f"exec -it {host} -- sh) and connect to that port there "
                           "(docs/k8s.md).")
    if host == short_hostname():
        from mldebug.debugger import client

        try:
            doc = registry.find(directory, port=port)
        except (registry.RegistryError, OSError) as e:
            raise MldebugError(str(e), "Run it as the user who owns the job; mldebug pdb list "
                                       "shows the open sessions.") from None
        return client.run(doc["port"], doc["token"],
                          reconnect_hint=f"mldebug pdb connect {host}:{port}")
    args = ["--port", str(port)] + (["--dir", directory] if directory else [])
    return _ssh(host, node_command("client", args, target.remote_python), target.ssh_args)


def attach(pid: int, host: str | None, *, remote_python: str | None, ssh_args: str | None) -> int:
    """pdb in a running process without a breakpoint (Python 3.14+ in the target)."""
    if host is None or validate_host(host) == short_hostname():
        from mldebug.debugger.attach import AttachError, command

        try:
            argv = command(pid)
        except AttachError as e:
            raise MldebugError(str(e)) from None
        return subprocess.call(argv)
    return _ssh(host, node_command("attach", [str(pid)], remote_python), ssh_args)
