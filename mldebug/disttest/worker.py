"""The distributed smoke test every rank runs (``mldebug dist-test``), and the local launch.

Init the process group, all_reduce ones and check the sum equals the world size, barrier,
allocate on the device, and print one ``[host:local_rank] OK (global rank r/ws)`` line per
rank. A collective that times out is reported as a timeout naming the collective. Under
``--nproc`` each rank also prints its ``RankResult`` as one ``MLDEBUG-JSON`` line for the
launching process (``REPORT_ENV``).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from mldebug.dist import identity
from mldebug.disttest.report import NCCL_WITHOUT_CUDA, RankResult
from mldebug.printing import printflock

# Set by the launching process: each rank then also prints its result as a marked JSON line.
REPORT_ENV = "MLDEBUG_DISTTEST_REPORT"

TIMEOUT_MARKERS = ("timed out", "timeout", "deadline exceeded")


@dataclass
class Options:
    backend: str | None = None
    timeout: float = 60.0
    fault: str | None = None  # "skip-allreduce:RANK" - for tests: that rank skips the all_reduce
    quiet: bool = False  # --json without a launch: no human lines on stdout


def _is_timeout(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(m in text.lower() for m in TIMEOUT_MARKERS) or isinstance(exc, TimeoutError)


def _fault_rank(fault: str | None, kind: str) -> int | None:
    if not fault:
        return None
    name, _, rank = fault.partition(":")
    return int(rank) if name == kind and rank.isdecimal() else None


def run_worker(opts: Options) -> RankResult:
    """Run the checks in this rank; its result (also printed, see ``REPORT_ENV``)."""
    if os.environ.get(REPORT_ENV) == "1":  # launched by `mldebug dist-test --nproc`
        from mldebug.lifetime import die_with_parent, exit_with_launcher

        die_with_parent()  # torchrun gone (mldebug SIGKILLed): this rank goes too
        exit_with_launcher()  # and mldebug gone, however the signal above was lost
    ident = identity()
    result = RankResult(rank=ident.rank if ident.rank is not None else 0,
                        world_size=ident.world_size if ident.world_size is not None else 1,
                        host=ident.host,
                        local_rank=ident.local_rank if ident.local_rank is not None else 0)
    _checks(opts, result, (lambda line: None) if opts.quiet else printflock)
    if os.environ.get(REPORT_ENV) == "1":
        from dataclasses import asdict

        from mldebug.nodekit import emit

        emit(asdict(result))
    return result


def nccl_without_cuda(backend: str | None) -> str | None:
    """Why ``backend`` cannot run here (nccl on a torch that sees no GPU), or None."""
    import torch

    if backend == "nccl" and not torch.cuda.is_available():
        return f"{NCCL_WITHOUT_CUDA} (torch.cuda.is_available() is False)"
    return None


def _checks(opts: Options, result: RankResult, printflock: Any) -> None:
    import torch
    import torch.distributed as dist

    rank, local_rank, world = result.rank, result.local_rank, result.world_size
    tag = f"[{result.host}:{local_rank}]"
    where = f"(global rank {rank}/{world})"

    backend = opts.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    why = nccl_without_cuda(backend)
    if why:
        result.status, result.step, result.message = "fail", "init_process_group", why
        printflock(f"{tag} FAIL {where}: {why}")
        return
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    step = "init_process_group"
    try:
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = device
        dist.init_process_group(
            backend=backend, timeout=datetime.timedelta(seconds=opts.timeout), **kwargs
        )
        if _fault_rank(opts.fault, "skip-allreduce") == rank:
            printflock(f"{tag} skipping all_reduce on purpose (--fault) {where}")
            time.sleep(opts.timeout + 30)  # stay alive so the others time out, not error
            result.status, result.step, result.message = "fail", "all_reduce", "skipped (--fault)"
            return
        step = "all_reduce"
        t = torch.ones(4, device=device)
        dist.all_reduce(t)
        if not torch.all(t == world):
            result.status, result.step = "fail", step
            result.message = f"all_reduce of ones gave {t.tolist()}, expected {world}"
            printflock(f"{tag} FAIL {where}: {result.message}")
            return
        step = "barrier"
        dist.barrier()
        step = "device allocation"
        x = torch.empty(1 << 20, dtype=torch.uint8, device=device)
        x.fill_(1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # report, never hang or dump a raw trace at the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        result.step = step
        if _is_timeout(exc):
            result.status = "timeout"
            result.message = f"{type(exc).__name__}: {first}"
            printflock(
                f"{tag} TIMEOUT {where}: {step} did not complete within {opts.timeout:g}s - "
                f"another rank never joined it ({type(exc).__name__}: {first})"
            )
        else:
            result.status, result.message = "fail", f"{type(exc).__name__}: {first}"
            printflock(f"{tag} FAIL {where}: {step} failed: {type(exc).__name__}: {first}")
            if os.environ.get("MLDEBUG_VERBOSE"):
                traceback.print_exc()
        return

    printflock(f"{tag} OK {where}")
    if rank == 0:
        cuda = torch.version.cuda or "none"
        nccl = "none"
        if torch.cuda.is_available():
            try:
                nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
            except Exception:
                nccl = "unknown"
        result.versions = {"torch": torch.__version__, "cuda": cuda, "nccl": nccl,
                           "backend": backend}
        printflock(
            f"{tag} torch {torch.__version__}, CUDA {cuda}, NCCL {nccl}, backend {backend}, "
            f"world size {world}"
        )
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def private_network() -> list[str]:
    """A command prefix that runs the launch in its own network namespace with only a loopback
    interface, so the rendezvous store (which torch binds to every interface) and gloo's sockets
    are reachable from this host's loopback only; [] when no namespace can be made here."""
    import shutil
    import subprocess

    if not (shutil.which("unshare") and shutil.which("ip")):
        return []
    up = ["sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    for prefix in (["unshare", "--net", "--"], ["unshare", "--user", "--map-root-user", "--net", "--"]):
        try:
            ok = subprocess.run([*prefix, *up, "true"], capture_output=True, timeout=10,
                                stdin=subprocess.DEVNULL).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return [*prefix, *up, "env", "GLOO_SOCKET_IFNAME=lo", "NCCL_SOCKET_IFNAME=lo"]
    return []


def launcher_command(nproc: int, opts: Options, prefix: list[str] | None = None) -> list[str]:
    """The torchrun command line ``mldebug dist-test --nproc N`` runs (after ``prefix``)."""
    cmd = [
        *(prefix or []),
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", "-m", "mldebug", "dist-test",
        "--timeout", f"{opts.timeout:g}",
    ]
    if opts.backend:
        cmd += ["--backend", opts.backend]
    if opts.fault:
        cmd += ["--fault", opts.fault]
    return cmd


def launch(nproc: int, opts: Options, on_line: Any) -> tuple[list[RankResult], int, bool]:
    """Run ``nproc`` ranks here; pass their lines to ``on_line``; their results, torchrun's
    exit code, and whether the launch had a private network namespace."""
    import json
    import subprocess

    from mldebug.nodekit import MARKER

    prefix = private_network()
    from mldebug.lifetime import LAUNCHED_BY, launcher_tag

    env = dict(os.environ, **{REPORT_ENV: "1", LAUNCHED_BY: launcher_tag()})
    if prefix:  # reverse lookups fail without DNS in the namespace; c10d warns on each
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from mldebug.lifetime import kill_group, popen_owned, sigterm_unwinds

    # torchrun in a process group of its own that dies with us (even on SIGKILL); killed on
    # error, Ctrl-C and SIGTERM; its ranks die with it (run_worker)
    with sigterm_unwinds():
        proc = popen_owned(launcher_command(nproc, opts, prefix), stdout=subprocess.PIPE,
                           text=True, errors="replace", env=env, stdin=subprocess.DEVNULL)
        try:
            assert proc.stdout is not None
            results: list[RankResult] = []
            for line in proc.stdout:
                if line.startswith(MARKER):
                    try:
                        results.append(RankResult.from_dict(json.loads(line[len(MARKER):])))
                        continue
                    except (ValueError, KeyError, TypeError):
                        pass
                on_line(line)
            return results, proc.wait(), bool(prefix)
        finally:
            if proc.poll() is None:
                kill_group(proc)
