"""Real distributed jobs for tests: torchrun (gloo on CPU) or srun-style independent ranks."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Job:
    """A background job whose ranks print 'rank R pid P ready'; killed as a process group."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], log: Path, nranks: int) -> None:
        self.procs = procs
        self.log = log
        self.nranks = nranks

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def rank_pids(self) -> dict[int, int]:
        return {int(r): int(p) for r, p in re.findall(r"rank (\d+) pid (\d+) ready", self.text())}

    def wait_ready(self, timeout: float = 120.0, settle: float = 2.0) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while len(self.rank_pids()) < self.nranks:
            if any(p.poll() is not None for p in self.procs[:1]) or time.monotonic() > deadline:
                raise RuntimeError(f"job did not start:\n{self.text()[-3000:]}")
            time.sleep(0.3)
        time.sleep(settle)  # let every rank reach its blocking call
        return self.rank_pids()

    def stop(self) -> None:
        """Kill every process of the job: torchrun puts workers in sessions of their own."""
        kill_tree(*self.procs)


def kill_tree(*procs: subprocess.Popen[bytes]) -> None:
    """Kill these processes and all their descendants, and reap them. A process group kill
    is not enough for torchrun: its workers run in sessions of their own and would be left
    running (burning the CPU of every later test)."""
    import psutil

    victims = []
    for p in procs:
        try:
            victims += [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for v in victims:
        try:
            v.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=30)
    for p in procs:
        p.wait(timeout=30)


def torchrun(script: str, nproc: int, log: Path, *args: str, env: dict[str, str] | None = None) -> Job:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(RECIPES / script), *args]
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    out = open(log, "wb")  # noqa: SIM115 - owned by the child
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                         start_new_session=True, stdin=subprocess.DEVNULL)
    return Job([p], log, nproc)


def independent_ranks(script: str, nproc: int, log: Path, extra_env: dict[str, str] | None = None) -> Job:
    """Start each rank as its own process with the torch.distributed variables, like srun."""
    port = free_port()
    procs = []
    out = open(log, "wb")  # noqa: SIM115
    for r in range(nproc):
        env = dict(os.environ)
        env.update({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "PYTHONPATH": str(REPO)})
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, str(RECIPES / script)], stdout=out,
                                      stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True, stdin=subprocess.DEVNULL))
    return Job(procs, log, nproc)


def slow_python(where: Path, slow_hosts: str, seconds: float, then: str = "") -> str:
    """A ``--remote-python`` that first sleeps on the named hosts (``node2|node3``: a busy or
    hung node), then runs the shell command ``then`` (e.g. to record what it sees on waking)."""
    wrapper = where / "slow-python"
    wrapper.write_text(f'#!/bin/sh\ncase "$(hostname)" in {slow_hosts}) sleep {seconds}; '
                       f'{then or ":"};; esac\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)
