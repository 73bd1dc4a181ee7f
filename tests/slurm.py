"""A one-node SLURM cluster for tests: munged, slurmctld and slurmd with a private config."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path


class SlurmUnavailable(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalSlurm:
    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.conf = self.workdir / "slurm.conf"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.munged: subprocess.Popen[bytes] | None = None  # only when we started it

    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self, wait: float = 30.0) -> LocalSlurm:
        for tool in ("slurmctld", "slurmd", "srun", "sbatch", "munged", "munge"):
            if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
                raise SlurmUnavailable(f"{tool} is not installed")
        if os.geteuid() != 0:
            raise SlurmUnavailable("needs root")
        if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
            for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
                Path(d).mkdir(parents=True, exist_ok=True)
            # in the foreground, as our child: stop() ends it (a machine that already ran
            # munged keeps its own)
            self.munged = subprocess.Popen(["/usr/sbin/munged", "--force", "--foreground"],
                                           stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 10
            while subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
                if self.munged.poll() is not None or time.monotonic() > deadline:
                    self._stop_munged()
                    raise SlurmUnavailable("munged did not start")
                time.sleep(0.2)
        host = socket.gethostname().split(".")[0]
        w = self.workdir
        for sub in ("state", "spool", "log"):
            (w / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            f"ClusterName=mldebugtest\nSlurmctldHost={host}\nSlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nStateSaveLocation={w}/state\nSlurmdSpoolDir={w}/spool\n"
            f"SlurmctldPidFile={w}/slurmctld.pid\nSlurmdPidFile={w}/slurmd.pid\n"
            f"SlurmctldLogFile={w}/log/slurmctld.log\nSlurmdLogFile={w}/log/slurmd.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\n"
            "MpiDefault=none\nSwitchType=switch/none\nJobAcctGatherType=jobacct_gather/none\n"
            f"SlurmctldPort={_free_port()}\nSlurmdPort={_free_port()}\n"
            # job ids unlike any earlier run's: a leftover process of "job 1" must not match
            f"FirstJobId={random.randint(100_000, 60_000_000)}\n"  # MaxJobId: 67,043,328
            f"NodeName={host} CPUs={os.cpu_count() or 2} RealMemory=2000 State=UNKNOWN\n"
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:8\n")
        env = self.env()
        for daemon in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd"):
            self.procs.append(subprocess.Popen([daemon, "-D", "-f", str(self.conf)], env=env,
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL,
                                               start_new_session=True))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                               env=env)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc"):
                return self
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        logs = "".join((w / "log" / f).read_text()[-800:] for f in ("slurmctld.log", "slurmd.log")
                       if (w / "log" / f).exists())
        raise SlurmUnavailable(f"slurm did not come up: {logs}")

    def sbatch(self, command: str, out: Path) -> str:
        r = subprocess.run(["sbatch", "--parsable", "-n", "1", "-o", str(out), "--wrap", command],
                           capture_output=True, text=True, env=self.env(), check=True)
        return r.stdout.strip().split(";")[0]

    def scancel(self, job: str) -> None:
        subprocess.run(["scancel", job], env=self.env(), capture_output=True)

    def stop(self) -> None:
        """Cancel every job, wait for it to end, then stop the daemons and any leftover."""
        import psutil

        env = self.env()
        if self.procs and all(p.poll() is None for p in self.procs):
            subprocess.run(["scancel", "--partition", "debug"], env=env, capture_output=True)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                r = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True)
                if r.returncode != 0 or not r.stdout.strip():
                    break
                time.sleep(0.5)
        for p in self.procs:
            p.kill()
            p.wait(timeout=10)
        # a job step killed with its daemon can leave its processes behind: they carry our
        # SLURM_CONF in their environment (sbatch exports the submitter's)
        me = os.getpid()
        for proc in psutil.process_iter():
            try:
                if proc.pid != me and proc.environ().get("SLURM_CONF") == str(self.conf):
                    proc.kill()
            except (psutil.Error, OSError):
                pass
        self._stop_munged()

    def _stop_munged(self) -> None:
        if self.munged is not None:
            self.munged.terminate()
            try:
                self.munged.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.munged.kill()
                self.munged.wait(timeout=10)
            self.munged = None
