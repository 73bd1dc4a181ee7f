"""The per-node part of ``mldebug hang``: find the rank processes here and py-spy each one.

Stdlib only (it imports nothing of mldebug but ``mldebug.ranks``, ``mldebug.dist`` and ``mldebug.errors``, which
are stdlib-only and travel with it), so it runs on nodes where mldebug is not installed: the fan-out sends this
file's source and ``dist.py``'s inside the command line. It prints one JSON document (see
``mldebug.nodekit.emit``). Run by hand: ``bin/mldebug-collect --help``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

from mldebug.errors import NO_PTRACE_ROUTE, PTRACE_FIX
from mldebug.nodekit import ArgumentParser, emit, find_py_spy, for_each, short_hostname
from mldebug.ranks import (
    find_ranks,
    hidden_ranks,
    list_processes,
    proc_sample,
    proc_status,
    read_text,
    resolve_user,
)

NODE_VERSION = 1
# No floor between the two /proc samples: the dumps' own time is the interval (a spinning
# main thread is runnable at both samples; ticks of 10 ms confirm it when there are some).
MIN_SAMPLE_INTERVAL = 0.0
# One snapshot cannot tell slow from stuck: when it would name a rank (ranks at different
# places, or one outside any collective), every rank is dumped and sampled once more after
# this pause (without --watch, which does it with its own interval).
RECHECK_SECONDS = 0.5


def sample_all(targets: list[dict[str, Any]]) -> None:
    """Append one /proc sample to every target and its workers (a few microseconds each)."""
    for t in targets:
        for info in (t, *t.get("workers", ())):
            s = proc_sample(info["pid"])
            if s is not None:
                info.setdefault("samples", []).append(s)


def needs_recheck(targets: list[dict[str, Any]]) -> bool:
    """Whether one snapshot would say more than it can tell: every snapshot with a stack
    read. Ranks at different places, or one outside torch.distributed, would name a suspect;
    every rank in one collective would blame the network, and a healthy job whose step is
    mostly one big all_reduce is found there at most instants. Only a second dump tells
    stuck from slow."""
    return any(t.get("dump") is not None for t in targets)


# Syscall numbers of the waits worth naming (Linux x86_64 and aarch64's generic table).
_SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 2: "open", 7: "poll", 17: "pread64", 19: "readv",
               23: "select", 34: "pause", 35: "nanosleep", 42: "connect", 43: "accept",
               45: "recvfrom", 47: "recvmsg", 61: "wait4", 72: "fcntl", 73: "flock",
               202: "futex", 219: "restart_syscall", 230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid",
               257: "openat", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
               288: "accept4"},
    "aarch64": {63: "read", 64: "write", 56: "openat", 98: "futex", 101: "nanosleep",
                115: "clock_nanosleep", 32: "flock", 25: "fcntl", 207: "recvfrom",
                212: "recvmsg", 128: "restart_syscall", 73: "ppoll", 72: "pselect6", 22: "epoll_pwait", 260: "wait4",
                67: "pread64", 65: "readv", 202: "accept", 242: "accept4", 203: "connect",
                95: "waitid"},
}
_FD_SYSCALLS = frozenset({"read", "write", "pread64", "readv", "recvfrom", "recvmsg", "flock",
                          "fcntl", "accept", "accept4", "connect"})


def kernel_wait(pid: int) -> dict[str, Any] | None:
    """Where the main thread waits in the kernel: the system call it is blocked in (from
    /proc/PID/syscall, readable with the same rights py-spy needs), the file its first
    argument names for an fd call, and the kernel function it sleeps in (wchan). None when
    it runs or nothing is readable. Three small reads."""
    import platform

    out: dict[str, Any] = {}
    wchan = read_text(f"/proc/{pid}/wchan")
    if wchan and wchan.strip() not in ("", "0"):
        out["wchan"] = wchan.strip()[:64]
    raw = read_text(f"/proc/{pid}/syscall")
    parts = (raw or "").split()
    if parts and parts[0].lstrip("-").isdigit() and int(parts[0]) >= 0:
        nr = int(parts[0])
        name = _SYSCALLS.get(platform.machine(), {}).get(nr)
        out["syscall"] = name or f"syscall {nr}"
        if name in _FD_SYSCALLS and len(parts) > 1:
            try:
                fd = int(parts[1], 16)
                out["fd"] = fd
                out["file"] = os.readlink(f"/proc/{pid}/fd/{fd}")[:300]
            except (ValueError, OSError):
                pass
    return out or None


def lock_holders(waiters: list[dict[str, Any]]) -> None:
    """For each target blocked in flock/fcntl (its ``kernel`` entry), the lock it waits for
    from /proc/locks: a blocked request is a ``->`` line under the lock that holds it, both
    on the same device:inode; the holder's pid and command are added to ``kernel["lock"]``."""
    text = read_text("/proc/locks")
    if not text:
        return
    held: dict[str, tuple[str, int, str]] = {}  # lock id -> (kind, holder pid, dev:inode)
    blocked: dict[int, tuple[str, str]] = {}  # waiting pid -> (lock id, dev:inode)
    for line in text.splitlines()[:20000]:
        parts = line.split()
        if len(parts) < 6 or not parts[0].endswith(":"):
            continue
        lid = parts[0][:-1]
        if parts[1] == "->":
            try:
                blocked.setdefault(int(parts[5]), (lid, parts[6] if len(parts) > 6 else ""))
            except (ValueError, IndexError):
                pass
            continue
        try:
            held.setdefault(lid, (parts[1], int(parts[4]), parts[5]))
        except ValueError:
            pass
    for t in waiters:
        k = t.get("kernel") or {}
        hit = blocked.get(t["pid"])
        if hit is None or hit[0] not in held:
            continue
        kind, holder, inode = held[hit[0]]
        comm = (read_text(f"/proc/{holder}/comm") or "").strip()[:64] if holder > 0 else ""
        k["lock"] = {"kind": kind, "holder": holder, "holder_comm": comm, "inode": inode}
        t["kernel"] = k


def kernel_all(targets: list[dict[str, Any]]) -> None:
    """Every target's kernel wait (``kernel_wait``), and the holder of a lock it waits on."""
    for t in targets:
        k = kernel_wait(t["pid"])
        if k is not None:
            t["kernel"] = k
    waiting = [t for t in targets if (t.get("kernel") or {}).get("syscall") in ("flock", "fcntl")
               or "lock" in (t.get("kernel") or {}).get("wchan", "")]
    if waiting:
        lock_holders(waiting)


def pyspy_said(stderr: str, limit: int = 160) -> str:
    """py-spy's error on one line: its message and causes ("Error: Failed to get stack traces /
    0: Failed to suspend process / 1: EPERM: Operation not permitted"), without the "Caused
    by:" header, repeated causes and the Rust backtrace."""
    parts: list[str] = []
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("Stack backtrace:"):
            break
        text = line.split(":", 1)[1].strip() if line[:1].isdigit() and ":" in line else line
        if line and line != "Caused by:" and text not in (p.split(":", 1)[-1].strip()
                                                          for p in parts):
            parts.append(line)
    return " / ".join(parts)[:limit]


def explain_pyspy_error(pid: int, stderr: str, rc: int,
                        status: dict[str, str] | None = None, euid: int | None = None) -> str:
    """One line saying why py-spy failed on ``pid`` and what to do: a stopped or already
    traced process is named as such, never as "ptrace denied, run as root" to root."""
    low = stderr.lower()
    if not os.path.exists(f"/proc/{pid}"):
        return f"process {pid} exited during the dump"
    st = proc_status(pid) if status is None else status
    if st.get("State", "").startswith(("Z", "X")):  # gone, its parent has not reaped it yet
        return f"process {pid} exited during the dump (State {st['State']})"
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        tracer = st.get("TracerPid", "0")
        if tracer not in ("", "0"):
            comm = (read_text(f"/proc/{tracer}/comm") or "?").strip()
            return (f"py-spy could not attach to pid {pid}: it is already traced by pid "
                    f"{tracer} ({comm}), a debugger or another py-spy. Detach that tracer "
                    "(quit gdb/pdb, let the other dump finish) and run again.")
        if st.get("State", "").startswith(("T", "t")):
            return (f"py-spy could not attach to pid {pid}: the process is stopped (State "
                    f"{st['State']}), by SIGSTOP or a job-control stop. Resume it with "
                    f"kill -CONT {pid} if you stopped it, then run again.")
        if (os.geteuid() if euid is None else euid) == 0:
            return (f"py-spy could not attach to pid {pid} although running as root "
                    f"(ptrace denied: {pyspy_said(stderr)}). Containers: "
                    "--cap-add=SYS_PTRACE, or a seccomp/LSM profile that blocks ptrace. "
                    + NO_PTRACE_ROUTE)
        return f"py-spy could not attach to pid {pid} (ptrace denied). {PTRACE_FIX}"
    if "no such process" in low:
        return f"process {pid} exited during the dump"
    if "failed to find python version" in low or "failed to get python version" in low:
        return f"pid {pid} is not a Python process py-spy can read ({stderr.strip()[:200]})"
    text = stderr.strip().splitlines()
    return f"py-spy failed on pid {pid} (exit code {rc}): {text[-1] if text else 'no message'}"


def run_many(cmds: list[list[str]], timeout: float, width: int,
             started: Callable[[], None] | None = None) -> list[Any]:
    """Run every command, at most ``width`` at once, each with stdin /dev/null and bounded by
    ``timeout`` seconds; per command its ``(exit code, stdout, stderr)``, or the exception
    that stands for it (``TimeoutError``: killed at the timeout; ``OSError``: not started).
    ``started`` is called once the first ``width`` commands run (a local ``mldebug hang``
    then loads its analysis: had it started before, its imports would hold the GIL between
    the spawns, and the last dump of 8 started 20-30 ms after the first).

    One thread spawns them (``os.posix_spawnp``) and reads every pipe in one ``poll`` loop:
    with a thread per dump, each thread had to start in turn, waiting for the GIL that a local
    run's imports held, and the last dump of 8 started 50 ms after the first; ``subprocess``
    itself cost about what a dump does to import. Python without posix_spawnp (before 3.8):
    ``subprocess`` on a few threads."""
    results: list[Any] = [None] * len(cmds)
    if not hasattr(os, "posix_spawnp"):
        if started is not None:
            started()
        _run_many_threads(cmds, timeout, width, results)
        return results
    import select

    poll = select.poll()
    running: dict[int, list[Any]] = {}  # index -> [pid, {fd: chunks}, deadline, open fds]
    owner: dict[int, int] = {}  # fd -> index

    def start(i: int) -> None:
        out_r, out_w = os.pipe()  # close-on-exec: the other children never inherit them
        err_r, err_w = os.pipe()
        try:
            pid = os.posix_spawnp(cmds[i][0], cmds[i], os.environ, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)])
        except OSError as e:
            os.close(out_r)
            os.close(err_r)
            results[i] = e
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        running[i] = [pid, {out_r: [], err_r: []}, time.monotonic() + timeout, 2]
        for fd in (out_r, err_r):
            poll.register(fd, select.POLLIN)
            owner[fd] = i

    def finish(i: int, error: BaseException | None = None) -> None:
        pid, chunks, _, _ = running.pop(i)
        for fd in chunks:
            if owner.pop(fd, None) is not None:
                poll.unregister(fd)
            os.close(fd)
        if error is not None:  # timed out or interrupted: never leave py-spy attached
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
            results[i] = error
            return
        _, status = os.waitpid(pid, 0)
        code = -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
        out, err = (b"".join(c).decode(errors="replace") for c in chunks.values())
        results[i] = (code, out, err)

    todo = 0
    try:
        while todo < len(cmds) or running:
            while todo < len(cmds) and len(running) < max(1, width):
                start(todo)
                todo += 1
            if started is not None:
                started()
                started = None
            now = time.monotonic()
            for i in [i for i, r in running.items() if r[2] <= now]:
                finish(i, TimeoutError())
            if not running:
                continue
            wait = min(r[2] for r in running.values()) - now
            for fd, _ in poll.poll(max(0.0, wait) * 1000 + 1):
                i = owner[fd]
                b = os.read(fd, 1 << 16)
                if b:
                    running[i][1][fd].append(b)
                    continue
                poll.unregister(fd)
                del owner[fd]
                running[i][3] -= 1
                if running[i][3] == 0:
                    finish(i)
    finally:
        for i in list(running):
            finish(i, KeyboardInterrupt())
    return results


def _run_many_threads(cmds: list[list[str]], timeout: float, width: int,
                      results: list[Any]) -> None:
    import subprocess

    def one(i: int) -> None:
        try:
            r = subprocess.run(cmds[i], capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
            results[i] = (r.returncode, r.stdout, r.stderr)
        except subprocess.TimeoutExpired:
            results[i] = TimeoutError()
        except OSError as e:
            results[i] = e

    for_each(range(len(cmds)), one, width)


def dump_cmd(pid: int, py_spy: str, *, native: bool, nonblocking: bool,
             with_locals: bool) -> list[str]:
    cmd = [py_spy, "dump", "--pid", str(pid), "--json"]
    if native:
        cmd.append("--native")
    if nonblocking:
        cmd.append("--nonblocking")
    if with_locals:
        cmd.append("--locals")
    return cmd


def dump_result(pid: int, py_spy: str, timeout: float, outcome: Any
                ) -> tuple[list[Any] | None, str | None]:
    """A dump's stacks, or the error that says why there are none, from ``run_many``'s
    outcome of its py-spy."""
    if isinstance(outcome, TimeoutError):
        return None, (f"py-spy did not finish within {timeout:g}s on pid {pid} (the process may "
                      "be in uninterruptible sleep, state D); raise --timeout or try --nonblocking")
    if isinstance(outcome, OSError):
        return None, f"could not run py-spy ({py_spy}): {outcome.strerror}"
    if isinstance(outcome, BaseException):
        raise outcome
    rc, stdout, stderr = outcome
    if rc != 0:
        return None, explain_pyspy_error(pid, stderr, rc)
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        return None, f"py-spy printed unreadable output for pid {pid}: {stdout[:200]!r}"
    return data, None


def dump(pid: int, py_spy: str, *, native: bool, nonblocking: bool, with_locals: bool,
         timeout: float) -> tuple[list[Any] | None, str | None]:
    cmd = dump_cmd(pid, py_spy, native=native, nonblocking=nonblocking, with_locals=with_locals)
    return dump_result(pid, py_spy, timeout, run_many([cmd], timeout, 1)[0])


def dump_jobs(opts: argparse.Namespace) -> int:
    """Dumps at once on this node: --jobs, or from this node's own CPUs (py-spy --native is
    CPU-heavy, one per CPU; plain dumps mostly wait on the target, several per CPU)."""
    if opts.jobs > 0:
        return int(opts.jobs)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 2
    return max(2, min(64, cpus * (1 if opts.native else 4)))


def dump_all(targets: list[dict[str, Any]], py_spy: str, opts: argparse.Namespace,
             key: str, started: Callable[[], None] | None = None) -> None:
    """py-spy on every target (``key``: "dump", or "dump_later" for --watch's second round)
    and, the first time, on the DataLoader workers under it; at most ``dump_jobs`` at once.
    ``started``: called when the first dumps run (``run_many``)."""
    jobs: list[tuple[dict[str, Any], bool]] = []  # (process, is a rank)
    for info in targets:
        jobs.append((info, True))
        jobs += [(w, False) for w in (info.get("workers", ()) if key == "dump" else ())]
    cmds = [dump_cmd(p["pid"], py_spy, native=opts.native, nonblocking=opts.nonblocking,
                     with_locals=opts.locals and rank) for p, rank in jobs]
    outcomes = run_many(cmds, opts.timeout, dump_jobs(opts), started)
    for (p, rank), outcome in [(jobs[i], outcomes[i]) for i in range(len(jobs))]:
        data, err = dump_result(p["pid"], py_spy, opts.timeout, outcome)
        if rank:
            p[key] = data
            if err:
                p.setdefault("error", err)
        else:
            p["dump"], p["error"] = data, err


def _gpu_poll_async(opts: argparse.Namespace, polls: list[dict[str, Any]]
                    ) -> threading.Thread | None:
    """Start the first GPU poll (nvidia-smi, ncclras) on a thread when either is here."""
    import shutil

    if not (opts.nvidia_smi or opts.ncclras or shutil.which("nvidia-smi")
            or shutil.which("ncclras")):
        return None
    from mldebug.hang import gpu

    t = threading.Thread(target=lambda: polls.append(
        gpu.poll(opts.gpu_timeout, opts.nvidia_smi, opts.ncclras)), daemon=True)
    t.start()
    return t


def select_targets(opts: argparse.Namespace, host: str) -> tuple[
        dict[int, dict[str, Any]], list[dict[str, Any]] | None, list[dict[str, Any]], int | None]:
    """The process table, the rank processes this run looks at (``--pid``, ``--pattern``,
    ``--user``/``--all-users``, ``--slurm-job``), their errors, and the uid filter. Targets are
    None when ``--user`` names nobody on this host."""
    procs = list_processes(root=opts.pid)  # with --pid: only that process's part of the table
    uid = None if opts.all_users or os.geteuid() == 0 else os.geteuid()
    if opts.user:
        uid = resolve_user(opts.user)
        if uid is None:
            return procs, None, [{"pid": None, "error": f"no user {opts.user!r} on {host}"}], None
    targets, errors = find_ranks(procs, pid=opts.pid, pattern=opts.pattern, uid=uid, host=host,
                                 slurm_job=opts.slurm_job)
    return procs, targets, errors, uid


def debug_server_route(targets: list[dict[str, Any]], procs: dict[int, dict[str, Any]],
                       opts: argparse.Namespace, host: str, uid: int | None,
                       errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The second route (``mldebug.hang.debugserver``): torch's debug server answers for the
    ranks py-spy could not read, and for ranks whose environment cannot be read at all. The
    targets it answered are marked; the ranks found only through it are returned. The route's
    module (sockets, the store protocol) is loaded only when some rank needs it."""
    hidden = hidden_ranks(procs, targets, uid, opts)
    if not hidden and all(t.get("dump") is not None for t in targets):
        return []
    from mldebug.hang import debugserver

    try:
        found = debugserver.answer(targets, procs, opts, host, uid, errors, hidden)
    except debugserver.RouteError as e:  # anything the route's steps did not catch
        errors.append({"pid": None, "error": f"debug-server route: {e}"})
        return []
    for t in targets:
        if t.get("dump") is None and t.get("route_error"):
            t["error"] = (f"{t['error']} " if t.get("error") else "") + \
                f"Debug-server route: {t.pop('route_error')}"[:800]
    return found


def collect(opts: argparse.Namespace, dumping: Callable[[], None] | None = None
            ) -> dict[str, Any]:
    """Find and dump the ranks on this node; the JSON document the caller receives. The
    routes, per rank: py-spy; where it cannot read a rank, torch's debug server.
    ``dumping`` is called when the ranks are found and their first dumps started (a local
    ``mldebug hang`` then loads the analysis while py-spy runs, not while /proc is read or
    the dumps are spawned)."""
    start = time.monotonic()
    host = short_hostname()
    doc: dict[str, Any] = {"host": host, "node_version": NODE_VERSION, "processes": [],
                           "errors": [], "python": sys.executable,
                           "clk_tck": os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100}
    procs, targets, errors, uid = select_targets(opts, host)
    doc["errors"].extend(errors)
    if targets is None:
        doc["seconds"] = round(time.monotonic() - start, 3)
        return doc
    py_spy = find_py_spy(opts.py_spy)
    doc["py_spy"] = py_spy
    if py_spy is None:
        found = debug_server_route(targets, procs, opts, host, uid, doc["errors"])
        targets.extend(found)
        if any(t.get("dump") is None for t in targets):
            doc["errors"].append({"pid": None, "error": (
                f"py-spy was not found on {host} (looked beside {sys.executable} and on PATH). "
                "Install it next to the job's Python (pip install py-spy) or pass --py-spy "
                "PATH.")})
        if opts.watch and any(t.get("route") == "debug-server" for t in targets):
            from mldebug.hang import debugserver

            time.sleep(opts.watch)
            debugserver.again(targets, opts, "dump_later")
    else:
        gpu_polls: list[dict[str, Any]] = []
        gpu_thread = None
        if targets:
            # CPU time and state before and after the dumps (spinning or blocked), and after
            # the second round with --watch (progress): free but for a floor on the first
            # interval
            sample_all(targets)
            first = time.monotonic()
            gpu_thread = _gpu_poll_async(opts, gpu_polls)  # the first poll while dumps run
            dump_all(targets, py_spy, opts, "dump", started=dumping)
            time.sleep(max(0.0, MIN_SAMPLE_INTERVAL - (time.monotonic() - first)))
            sample_all(targets)
            kernel_all(targets)
            for t in targets:
                if t.get("dump") is not None:
                    t["route"] = "py-spy"
        # the ranks py-spy could not read, and those whose environment hides them
        found = debug_server_route(targets, procs, opts, host, uid, doc["errors"])
        targets.extend(found)
        if gpu_thread is not None:
            gpu_thread.join()
            from mldebug.hang import gpu

            gpu_polls.append(gpu.poll(opts.gpu_timeout, opts.nvidia_smi, opts.ncclras,
                                      skip=gpu.hung(gpu_polls)))
            doc["gpu"] = gpu_polls
        if opts.watch and targets:
            time.sleep(opts.watch)
            alive = [t for t in targets if t.get("route") == "py-spy"]
            dump_all(alive, py_spy, opts, "dump_later")
            sample_all(alive)
            from mldebug.hang import debugserver

            debugserver.again(targets, opts, "dump_later")
        elif targets and needs_recheck(targets):  # slow or stuck? look once more
            time.sleep(RECHECK_SECONDS)
            alive = [t for t in targets if t.get("route") == "py-spy"]
            dump_all(alive, py_spy, opts, "dump_later")
            sample_all(alive)
            for t in alive:
                t["recheck"] = RECHECK_SECONDS
    for t in targets:
        doc["processes"].append({
            "pid": t["pid"], "ppid": t["ppid"], "cmdline": t["cmdline"], "ns_pid": t.get("ns_pid"),
            "identity": t["identity"], "job": t.get("job"), "dump": t.get("dump"),
            "dump_later": t.get("dump_later"), "error": t.get("error"),
            "samples": t.get("samples", []), "route": t.get("route"),
            "route_detail": t.get("route_detail"), "pyspy_error": t.get("pyspy_error"),
            "kernel": t.get("kernel"), "recheck": t.get("recheck"),
            "workers": [{"pid": w["pid"], "ppid": w["ppid"], "cmdline": w["cmdline"],
                         "identity": w["identity"], "dump": w.get("dump"),
                         "samples": w.get("samples", []),
                         "error": w.get("error")} for w in t.get("workers", ())],
        })
    doc["seconds"] = round(time.monotonic() - start, 3)
    return doc


# The options whose defaults ``fast_opts`` gives without argparse (tests/test_hang_early.py
# checks them against ``parser()``): the local fast path's flags, and every default
DEFAULTS: dict[str, Any] = {
    "pid": None, "pattern": None, "all_users": False, "user": None, "slurm_job": None,
    "native": False, "nonblocking": False, "locals": False, "py_spy": None, "timeout": 20.0,
    "watch": 0.0, "jobs": 0, "nvidia_smi": None, "ncclras": None, "gpu_timeout": 5.0,
    "store": None, "pretty": False,
}
FAST_FLAGS = ("--native", "--nonblocking", "--locals", "--all-users")


def fast_opts(pid: int | None, flags: Sequence[str] = ()) -> Any:
    """What ``parser().parse_args`` gives for ``[--pid PID] FLAG...`` (flags from
    ``FAST_FLAGS``), without loading argparse: the local ``mldebug hang`` starts its dumps
    from these before it parses the whole command line. Compared by ``vars()``."""
    import types

    opts = dict(DEFAULTS, pid=pid)
    for f in flags:
        if f not in FAST_FLAGS:
            raise ValueError(f"not a fast-path flag: {f}")
        opts[f[2:].replace("-", "_")] = True
    return types.SimpleNamespace(**opts)


def parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    p = ArgumentParser(prog="mldebug-collect",
                       description="Dump the stacks of the rank processes on this node "
                                   "as one JSON document (stdlib + py-spy only).")
    p.add_argument("--pid", type=int, help="this process (or its rank-carrying descendants)")
    p.add_argument("--pattern", help="regular expression on the command line")
    p.add_argument("--all-users", action="store_true", help="not only this user's processes")
    p.add_argument("--user", help="only this user's processes (name or uid)")
    p.add_argument("--slurm-job", help="only processes of this SLURM job (SLURM_JOB_ID)")
    p.add_argument("--native", action="store_true")
    p.add_argument("--nonblocking", action="store_true")
    p.add_argument("--locals", action="store_true")
    p.add_argument("--py-spy", help="py-spy binary (default: beside python, then PATH)")
    p.add_argument("--timeout", type=float, default=d["timeout"], help="seconds per py-spy dump")
    p.add_argument("--watch", type=float, default=d["watch"],
                   help="dump again after this many seconds")
    p.add_argument("--jobs", type=int, default=d["jobs"],
                   help="dumps in parallel (default 0: from this node's CPU count)")
    p.add_argument("--nvidia-smi", help="nvidia-smi binary (default: on PATH, if any)")
    p.add_argument("--ncclras", help="ncclras binary (default: on PATH, if any)")
    p.add_argument("--gpu-timeout", type=float, default=d["gpu_timeout"],
                   help="seconds each nvidia-smi / ncclras run may take")
    p.add_argument("--store", help="the job's TCPStore as HOST:PORT, for the debug-server route "
                                   "(default: the ranks' MASTER_ADDR/PORT, or their launcher's)")
    p.add_argument("--pretty", action="store_true", help="indented JSON without the marker")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    doc = collect(opts)
    if opts.pretty:
        print(json.dumps(doc, indent=2))
    else:
        emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
