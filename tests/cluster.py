"""A local cluster for tests: each node is an sshd in its own UTS + PID (+ mount) namespace.

Nodes listen on their own loopback address (127.0.1.N), have their own host name, and see
only their own processes - as on real hardware. pdsh reaches them through a generated ssh
config (``PDSH_SSH_ARGS_APPEND=-F CONFIG``). Everything lives under one work directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# Inside each node (its own mount namespace) root's ~/.bashrc is hidden: an ssh login would
# otherwise run this machine's `pyenv init`, whose rehash lock, left behind when a node is
# killed mid-login, stalls every later login for a minute. Real nodes have no such rc file.
_HIDE_RC = "[ -f /root/.bashrc ] && mount --bind /dev/null /root/.bashrc;"


class ClusterUnavailable(RuntimeError):
    """The cluster cannot start here (missing sshd/pdsh/unshare, no privileges)."""


@dataclass
class Node:
    name: str
    address: str
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_requirements() -> list[str]:
    missing = []
    for tool in ("pdsh", "ssh", "ssh-keygen", "unshare"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if not Path("/usr/sbin/sshd").exists():
        missing.append("/usr/sbin/sshd")
    if os.geteuid() != 0:
        missing.append("root (namespaces)")
    return missing


class LocalCluster:
    def __init__(self, workdir: Path, names: list[str],
                 node_env: dict[str, dict[str, str]] | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = _free_port()
        self.nodes = {
            name: Node(name, f"127.0.1.{i + 1}", env=(node_env or {}).get(name, {}))
            for i, name in enumerate(names)
        }
        self.ssh_config = self.workdir / "ssh_config"
        self.key = self.workdir / "id_ed25519"

    # -- lifecycle -----------------------------------------------------------------
    def start(self, wait: float = 20.0) -> LocalCluster:
        missing = missing_requirements()
        if missing:
            raise ClusterUnavailable("missing: " + ", ".join(missing))
        self.workdir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        for key in (self.key, self.workdir / "host_ed25519"):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                               check=True)
        shutil.copy(f"{self.key}.pub", self.workdir / "authorized_keys")
        self._write_client_config()
        for node in self.nodes.values():
            self._start_node(node)
        deadline = time.monotonic() + wait
        for node in self.nodes.values():
            while True:
                r = self.ssh(node.name, "hostname", check=False, timeout=10)
                if r.returncode == 0 and r.stdout.strip() == node.name:
                    break
                if node.proc is not None and node.proc.poll() is not None:
                    log = (self.workdir / f"{node.name}.log").read_text(errors="replace")
                    raise ClusterUnavailable(f"{node.name} exited: {log[-2000:]}")
                if time.monotonic() > deadline:
                    raise ClusterUnavailable(f"{node.name} did not answer ssh: {r.stderr[-500:]}")
                time.sleep(0.2)
        return self

    def _write_client_config(self) -> None:
        lines = []
        for node in self.nodes.values():
            lines += [
                f"Host {node.name}",
                f"  HostName {node.address}",
                f"  Port {self.port}",
                "  User root",
                f"  IdentityFile {self.key}",
                "  IdentitiesOnly yes",
                "  StrictHostKeyChecking no",
                "  UserKnownHostsFile /dev/null",
                "  LogLevel ERROR",
                "  BatchMode yes",
                "  ConnectTimeout 5",
                "",
            ]
        self.ssh_config.write_text("\n".join(lines))

    def _start_node(self, node: Node) -> None:
        conf = self.workdir / f"sshd_{node.name}.conf"
        setenv = ""
        if node.env:
            setenv = "SetEnv " + " ".join(f"{k}={v}" for k, v in node.env.items()) + "\n"
        conf.write_text(
            f"Port {self.port}\n"
            f"ListenAddress {node.address}\n"
            f"HostKey {self.workdir / 'host_ed25519'}\n"
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}\n"
            f"PidFile {self.workdir / (node.name + '.pid')}\n"
            "PermitRootLogin yes\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPrintMotd no\nUseDNS no\nMaxStartups 100:30:200\n"
            "MaxSessions 100\n" + setenv
        )
        log = open(self.workdir / f"{node.name}.log", "wb")  # noqa: SIM115
        # bash is the node's PID 1 so orphans are reaped; --kill-child ends the node with us.
        node.proc = subprocess.Popen(
            ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child",
             "bash", "-c", f"hostname {node.name}; {_HIDE_RC} /usr/sbin/sshd -D -e -f {conf} & wait"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop_node(self, name: str) -> None:
        """Kill a node and everything in it (SIGKILL: unshare --fork ignores SIGTERM)."""
        node = self.nodes[name]
        if node.proc is not None and node.proc.poll() is None:
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=10)

    def freeze_node(self, name: str) -> None:
        """Stop (SIGSTOP) every process of a node: it accepts TCP but never answers."""
        self._signal_tree(name, signal.SIGSTOP)

    def thaw_node(self, name: str) -> None:
        self._signal_tree(name, signal.SIGCONT)

    def _signal_tree(self, name: str, sig: signal.Signals) -> None:
        import psutil

        node = self.nodes[name]
        assert node.proc is not None
        root = psutil.Process(node.proc.pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def stop(self) -> None:
        for name in self.nodes:
            try:
                self.thaw_node(name)
            except Exception:
                pass
            self.stop_node(name)

    # -- using it --------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment for pdsh/ssh/mldebug to reach the nodes."""
        env = dict(os.environ)
        env["PDSH_RCMD_TYPE"] = "ssh"
        env["PDSH_SSH_ARGS_APPEND"] = f"-F {self.ssh_config}"
        return env

    def ssh(self, node: str, command: str, *, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-F", str(self.ssh_config), node, command],
            capture_output=True, text=True, check=check, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def spawn(self, node: str, command: str, log: str) -> None:
        """Leave a job running on a node (detached; ssh returns at once)."""
        self.ssh(node, f"cd /tmp; setsid nohup {command} >{log} 2>&1 </dev/null &")
