"""Produce flight-recorder dumps from inside a rank, on demand and on failure, any backend.

``enable()`` turns the recorder on (``TORCH_FR_BUFFER_SIZE``), wires PyTorch's native NCCL
dump paths, and starts one daemon thread per rank that waits on a FIFO in the dump directory:
writing a token to it (what ``mldebug fr trigger`` does for every rank on a node at once)
makes the rank write ``<dir>/fr_rank<RANK>``. The thread only reads the recorder's ring
buffer, so it works while the main thread is blocked inside a collective and never stops the
job. Uncaught exceptions (a gloo/NCCL timeout surfacing as ``RuntimeError``/``DistError``)
and SIGTERM (what torchrun sends the surviving ranks) dump before the process dies.

Dumps are torch's own pickle with three additions analysis uses: ``rank``, an ``mldebug``
block (host, pid, world size, reason) and ``pg_config`` filled in from the live process
groups when the backend left it empty (gloo does).
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import signal
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from mldebug.dist import identity
from mldebug.fr.node import _TOKEN, NATIVE_SUBDIR_NAME, TRIGGERED, UnsafeDir, private_dir
from mldebug.ranks import ns_tag, pid_namespace, start_time

PREFIX = "fr_rank"
NATIVE_SUBDIR = NATIVE_SUBDIR_NAME
REGISTRY_PREFIX = ".mldebug-fr-"  # .mldebug-fr-<host>-<pid>.json / .done / .trigger


def default_dir() -> Path:
    """Where dumps and triggers live unless told otherwise (same default as the node script)."""
    env = os.environ.get("MLDEBUG_FR_DIR")
    return Path(env) if env else Path(f"/tmp/mldebug-fr-{os.getuid()}")


def torch_before(major: int, minor: int) -> bool:
    """Whether the installed torch is older than ``major.minor`` (from its metadata: no torch
    import); an unknown version counts as older (its old spellings are then set too)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        parts = version("torch").split("+", 1)[0].split(".")
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) < \
            (major, minor)
    except (PackageNotFoundError, ValueError, IndexError):
        return True


def native_env(dump_dir: str | Path, buffer_size: int = 2000,
               legacy: bool | None = None) -> dict[str, str]:
    """PyTorch's own recorder settings, current names and their pre-2.9 spellings.

    ``TORCH_NCCL_TRACE_BUFFER_SIZE`` only for torch before 2.9 (``legacy``; default: the
    installed torch's version): newer torch reads ``TORCH_FR_BUFFER_SIZE`` and prints a
    deprecation warning on every rank when the old name is set (issue #40).

    NCCL dumps on a watchdog timeout to ``<dir>/nccl/fr_rank<R>`` and on a write to the pipe
    ``<dir>/nccl/fr_rank<R>.pipe``. These are read when the NCCL process group is created,
    so they must be in the environment before ``init_process_group``.
    """
    stem = str(Path(dump_dir) / NATIVE_SUBDIR / PREFIX)
    old = {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(buffer_size)} if (
        torch_before(2, 9) if legacy is None else legacy) else {}
    return {
        "TORCH_NCCL_DESYNC_DEBUG": "1",
        "TORCH_FR_BUFFER_SIZE": str(buffer_size),
        **old,  # before 2.9 (the NCCL pipe read it there)
        "TORCH_FR_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # before 2.9
        "TORCH_FR_DUMP_TEMP_FILE": stem,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": stem,  # before 2.9
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem,
    }


def _log(msg: str) -> None:
    try:
        sys.stderr.write(f"mldebug.fr: {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass


@dataclass
class Recorder:
    dump_dir: Path
    rank: int | None
    host: str
    pid: int = field(default_factory=os.getpid)
    # "-ns<inode>" in a nested pid namespace: pid 5 of one container and pid 5 of another
    # sharing the directory never take each other's registration (mldebug.ranks.ns_tag)
    tag: str = field(default_factory=ns_tag)
    dumps: list[Path] = field(default_factory=list)
    raw_copy: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _dumping_thread: int | None = None
    _terminate_after: bool = False
    _prev_excepthook: Any = None
    _prev_thread_hook: Any = None
    _prev_sigterm: Any = None
    # the directory, opened and checked once (owner, mode, no link) and kept for the recorder's
    # life: every write goes through this fd, so a path swapped for a link later (another user
    # owning the parent) never sends a dump into their directory
    _dir_fd: int | None = None
    _guard: Any = None  # the SIGTERM guard process (_start_guard)

    def dir_fd(self) -> int:
        if self._dir_fd is None:
            from mldebug.privdir import open_dir

            self._dir_fd = open_dir(self.dump_dir, what="flight-recorder directory")
        return self._dir_fd

    def _write(self, parts: tuple[str, ...], name: str, data: bytes) -> None:
        """``data`` to ``<dir>/<parts...>/<name>`` through the pinned directory fd."""
        from mldebug.privdir import subdir_at, write_atomic_at

        fds: list[int] = []
        try:
            fd = self.dir_fd()
            for part in parts:
                fd = subdir_at(fd, part, what="flight-recorder directory")
                fds.append(fd)
            write_atomic_at(fd, name, data)
        finally:
            for f in fds:
                os.close(f)

    # -- paths ---------------------------------------------------------------------------
    @property
    def fifo(self) -> Path:
        return self.dump_dir / f"{REGISTRY_PREFIX}{self.host}-{self.pid}{self.tag}.trigger"

    @property
    def registry(self) -> Path:
        return self.dump_dir / f"{REGISTRY_PREFIX}{self.host}-{self.pid}{self.tag}.json"

    @property
    def done(self) -> Path:
        return self.dump_dir / f"{REGISTRY_PREFIX}{self.host}-{self.pid}{self.tag}.done"

    def current_rank(self) -> int:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:
            pass
        return self.rank if self.rank is not None else 0

    # -- dumping -------------------------------------------------------------------------
    def dump(self, reason: str, token: str | None = None,
             where: dict[str, Any] | None = None) -> Path | None:
        """Write this rank's dump now; never raises (a failed dump must not hurt the job).

        With a trigger ``token`` the dump goes to ``<dir>/triggered/<token>/fr_rank<R>`` (one
        folder per trigger, so a later dump on failure never overwrites it) and the token is
        acknowledged in ``.done``."""
        me = threading.get_ident()
        if self._dumping_thread == me:
            return None  # re-entered from a signal handler while dumping
        with self._lock:
            self._dumping_thread = me
            try:
                if where is None and me != threading.main_thread().ident:
                    where = main_thread_call()
                path = self._dump(reason, token, where)
                if token is not None:
                    self._write((), self.done.name, json.dumps(
                        {"token": token, "file": str(path) if path else None,
                         "rank": self.current_rank(), "pid": self.pid}).encode())
                return path
            except Exception as e:  # noqa: BLE001 - report, never propagate
                _log(f"could not write the flight-recorder dump ({type(e).__name__}: {e})")
                if token is not None:
                    try:
                        self._write((), self.done.name, json.dumps(
                            {"token": token, "file": None, "error": str(e)}).encode())
                    except OSError:
                        pass
                return None
            finally:
                self._dumping_thread = None
                if self._terminate_after:
                    self._unregister()
                    _die_by(signal.SIGTERM)

    def _dump(self, reason: str, token: str | None = None,
              where: dict[str, Any] | None = None) -> Path:
        parts: tuple[str, ...] = ()
        if token is not None:
            if not _TOKEN.match(token):
                raise ValueError(f"malformed trigger token {token[:80]!r}")
            parts = (TRIGGERED, token)
        folder = self.dump_dir.joinpath(*parts)
        raw = _raw_trace()
        from mldebug.safeload import safe_loads

        doc = safe_loads(raw)
        rank = self.current_rank()
        if self.raw_copy:  # torch's bytes untouched, e.g. to report a bug upstream
            self._write(("raw",), f"{PREFIX}{rank}", raw)
        doc["rank"] = rank
        doc["mldebug"] = {"rank": rank, "world_size": _world_size(), "host": self.host,
                          "pid": self.pid, "reason": reason, "time": time.time()}
        if where:
            doc["mldebug"]["blocked_in"] = where
        _fill_pg_config(doc)
        path = folder / f"{PREFIX}{rank}"
        self._write(parts, path.name, pickle.dumps(doc, protocol=4))
        self.dumps.append(path)
        _log(f"rank {rank} wrote {path} ({len(doc.get('entries', []))} entries; {reason})")
        return path

    # -- trigger thread ------------------------------------------------------------------
    def prune_siblings(self, limit: int = 256) -> int:
        """``prune_stale`` in the other job folders beside this one (the default directory's
        ``<job>/`` folders, newest ``limit``): a job that ended by SIGKILL leaves its
        registrations there, and no later job uses that folder again. Only folders this user
        owns (``privdir.subdir_at``); dumps are evidence and stay."""
        from mldebug.fr.node import HOME_INFO, job_homes, open_in
        from mldebug.privdir import open_dir

        parent = self.dump_dir.parent
        try:
            os.stat(HOME_INFO, dir_fd=self.dir_fd(), follow_symlinks=False)
        except OSError:
            return 0  # not in a job folder: a directory somebody chose has no siblings of ours
        gone = 0
        pfd = open_dir(parent, what="flight-recorder directory")
        try:
            for home in job_homes(str(parent), limit):
                name = os.path.basename(home)
                if name == self.dump_dir.name:
                    continue
                try:
                    hfd = open_in(pfd, name, os.geteuid(), "dir")
                except (OSError, ValueError):
                    continue
                try:
                    gone += self.prune_stale(dfd=hfd)
                    empty = _ended_and_empty(hfd)
                finally:
                    os.close(hfd)
                if empty:  # a job that ended without a dump: nothing of it to keep
                    try:
                        os.rmdir(name, dir_fd=pfd)
                    except OSError:
                        pass
        finally:
            os.close(pfd)
        return gone

    def prune_stale(self, limit: int = 10000, dfd: int | None = None) -> int:
        """Remove the registrations (and their FIFO and .done) that ranks of this host and pid
        namespace left when they died without unregistering (SIGKILL, OOM): a process that no
        longer runs, or another process now holding its pid (start time). Only files this user
        owns, with mldebug's names, are touched. Returns how many ranks' files went.
        ``dfd``: another directory than this recorder's (``prune_siblings``)."""
        dfd = self.dir_fd() if dfd is None else dfd
        head = f"{REGISTRY_PREFIX}{self.host}-"
        gone = 0
        try:
            names = os.listdir(dfd)[:limit]
        except OSError:
            return 0
        for name in names:
            stem = name[:-len(".json")] if name.endswith(".json") else None
            if stem is None or not stem.startswith(head):
                continue
            pid_part = stem[len(head):]
            if self.tag:
                if not pid_part.endswith(self.tag):
                    continue
                pid_part = pid_part[:-len(self.tag)]
            if not pid_part.isdecimal() or int(pid_part) == self.pid:
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 16:
                    continue
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                with open(fd, "rb") as f:
                    doc = json.loads(f.read(1 << 16) or b"{}")
            except (OSError, ValueError):
                continue
            pid = int(pid_part)
            started = doc.get("start_time") if isinstance(doc, dict) else None
            try:
                os.kill(pid, 0)
                alive = not isinstance(started, int) or start_time(pid) in (None, started)
            except ProcessLookupError:
                alive = False
            except OSError:  # another user's process holds the pid now: not ours to judge
                alive = True
            if alive:
                continue
            for suffix in (".json", ".trigger", ".done"):
                try:
                    st = os.stat(stem + suffix, dir_fd=dfd, follow_symlinks=False)
                    if st.st_uid == os.geteuid():
                        os.unlink(stem + suffix, dir_fd=dfd)
                except OSError:
                    pass
            gone += 1
        return gone

    def start_trigger_thread(self) -> None:
        for prune in (self.prune_stale, self.prune_siblings):
            try:
                prune()
            except (OSError, UnsafeDir):
                pass
        try:
            dfd = self.dir_fd()
            try:  # a previous process with this pid (private dir)
                os.unlink(self.fifo.name, dir_fd=dfd)
            except FileNotFoundError:
                pass
            os.mkfifo(self.fifo.name, 0o600, dir_fd=dfd)
        except (OSError, UnsafeDir) as e:
            _log(f"no trigger FIFO in {self.dump_dir} ({getattr(e, 'strerror', None) or e}); "
                 "dumps on failure only")
            return
        self._write((), self.registry.name, json.dumps(
            {"pid": self.pid, "host": self.host, "rank": self.rank,
             # the pid is this namespace's; its start time finds it from the node's (fr/node)
             "start_time": start_time(self.pid), "pidns": pid_namespace(),
             "fifo": str(self.fifo), "done": str(self.done),
             "dump_dir": str(self.dump_dir)}).encode())
        threading.Thread(target=self._serve, name="mldebug-fr-trigger", daemon=True).start()
        atexit.register(self._unregister)

    def _unregister(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child exiting: the registration is its parent's
        for p in (self.registry, self.fifo, self.done):
            try:
                os.unlink(p.name, dir_fd=self.dir_fd())
            except (OSError, UnsafeDir):
                pass

    def _serve(self) -> None:
        while True:
            try:  # blocks until a writer opens it; never a symlink, only our FIFO
                fd = os.open(self.fifo.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=self.dir_fd())
                with open(fd, "rb") as f:
                    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                        raise OSError(f"{self.fifo} is not a FIFO")
                    data = f.read(4096)
            except (OSError, UnsafeDir):
                time.sleep(1.0)
                continue
            for token in data.decode(errors="replace").split():
                self.dump("triggered", token=token)

    # -- failure hooks -------------------------------------------------------------------
    def install_failure_hooks(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook
        if threading.current_thread() is threading.main_thread():
            try:
                prev = signal.getsignal(signal.SIGTERM)
                if prev in (signal.SIG_DFL, None):
                    self._prev_sigterm = prev
                    signal.signal(signal.SIGTERM, self._on_sigterm)
                    self._watch_wakeup_fd()
            except (ValueError, OSError):
                pass

    def _excepthook(self, tp: type[BaseException], value: BaseException,
                    tb: TracebackType | None) -> None:
        if not issubclass(tp, KeyboardInterrupt):
            frames = []
            t = tb
            while t is not None:
                frames.append(t.tb_frame)
                t = t.tb_next
            self.dump(f"uncaught {tp.__name__}: {str(value).splitlines()[0][:200] if str(value) else ''}",
                      where=call_in(frames[::-1]))
        (self._prev_excepthook or sys.__excepthook__)(tp, value, tb)

    def _thread_excepthook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            self.dump(f"uncaught {args.exc_type.__name__} in thread "
                      f"{getattr(args.thread, 'name', '?')}")
        (self._prev_thread_hook or threading.__excepthook__)(args)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._dumping_thread is not None:
            self._terminate_after = True  # the dump in progress re-raises when it ends
            return
        self.dump("SIGTERM", where=call_in(_stack(frame)))
        self._unregister()  # no atexit after a signal: the registration goes now
        _die_by(signum)

    def _watch_wakeup_fd(self) -> None:
        """Dump on SIGTERM even while the main thread is blocked inside a collective.

        Python runs signal handlers only when the main thread returns to the interpreter; a
        rank blocked in a C++ wait would be SIGKILLed by the launcher first. The C-level
        handler writes the signal number to the wakeup fd, which this thread watches.
        """
        r, w = socket.socketpair()
        r.setblocking(True)
        w.setblocking(False)
        try:
            old = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            r.close()
            w.close()
            return
        if old != -1:  # someone (asyncio) owns it: leave theirs in place
            signal.set_wakeup_fd(old)
            r.close()
            w.close()
            return
        self._wakeup = (r, w)
        try:  # a fork (a DataLoader worker) must not wake this process's watcher
            os.register_at_fork(after_in_child=_drop_wakeup_fd)
        except (AttributeError, ValueError):
            pass
        notice = self._start_guard(r)

        def watch() -> None:
            while True:
                try:
                    data = (notice or r).recv(64)
                except OSError:
                    return
                if not data:
                    return
                if notice is not None and data == b"T" or \
                        notice is None and signal.SIGTERM in data:
                    if notice is not None:
                        try:
                            notice.send(b"A")  # Python runs here: the guard stands down
                        except OSError:
                            pass
                    self.dump("SIGTERM")
                    self._unregister()
                    # The job is being terminated with the default disposition; finish the
                    # way it would have, without waiting for the blocked main thread.
                    os._exit(128 + signal.SIGTERM)

        threading.Thread(target=watch, name="mldebug-fr-signal", daemon=True).start()

    def _start_guard(self, r: socket.socket) -> socket.socket | None:
        """A small process that reads the signal wakeup fd for this rank: on SIGTERM it tells
        the watch thread, which acknowledges and dumps. No acknowledgement within
        GUARD_ACK_S means no Python thread can run (the rank is frozen in C holding the GIL):
        the Python handler installed here would then keep the rank alive until the
        scheduler's SIGKILL, where without it SIGTERM would have ended it at once - so the
        guard ends it (SIGKILL) as SIGTERM's default would have. It never acts on anything
        but a SIGTERM this rank received; it exits with the rank (PR_SET_PDEATHSIG, EOF).
        Returns the watch thread's end of the notice channel, or None (no guard: the watch
        thread reads the wakeup fd itself, as before)."""
        import subprocess

        ours, theirs = socket.socketpair()
        try:
            self._guard = subprocess.Popen(
                [sys.executable, "-S", "-I", "-c", "import sys; exec(sys.stdin.read())",
                 "mldebug-fr-guard", str(r.fileno()), str(theirs.fileno()), str(os.getpid()),
                 str(GUARD_ACK_S), str(GUARD_DUMP_S)],
                pass_fds=(r.fileno(), theirs.fileno()), env={}, stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, cwd="/")
            assert self._guard.stdin is not None
            self._guard.stdin.write(_GUARD.encode())
            self._guard.stdin.close()
        except (OSError, ValueError) as e:
            _log(f"no SIGTERM guard ({e}); a rank frozen holding the GIL ignores SIGTERM")
            ours.close()
            theirs.close()
            return None
        theirs.close()
        r.close()  # the guard reads it now
        return ours


GUARD_ACK_S = 3.0  # a rank whose Python cannot answer the guard within this is frozen
GUARD_DUMP_S = 60.0  # the longest a rank that answered may take to dump and end

# the guard (Recorder._start_guard), run with ``python -S -I -c``: standard library only
_GUARD = """
import os, select, signal, socket, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a killpg of the job reaches it too
signal.signal(signal.SIGINT, signal.SIG_IGN)
# argv: -c mldebug-fr-guard WAKE_FD NOTICE_FD RANK_PID ACK_S DUMP_S
wake = socket.socket(fileno=int(sys.argv[2]))
notice = socket.socket(fileno=int(sys.argv[3]))
rank, ack_s, dump_s = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != rank:
    sys.exit(0)
while True:
    data = wake.recv(64)
    if not data:
        sys.exit(0)
    if bytes([signal.SIGTERM]) not in data:
        continue
    try:
        notice.send(b"T")
    except OSError:
        sys.exit(0)
    if select.select([notice], [], [], ack_s)[0]:
        if notice.recv(1) != b"A":
            sys.exit(0)
        end = time.monotonic() + dump_s  # Python runs: the rank dumps and ends itself
        while (left := end - time.monotonic()) > 0 and os.getppid() == rank:
            if select.select([wake], [], [], min(left, 1.0))[0] and not wake.recv(64):
                sys.exit(0)
    if os.getppid() == rank:  # still the rank's child: the rank has not ended
        os.kill(rank, signal.SIGKILL)
    sys.exit(0)
"""


def _drop_wakeup_fd() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass


# torch.distributed calls a rank can be blocked in, and the arguments that name a peer or root
_C10D_CALLS = {
    "send": ("dst", "group_dst"), "recv": ("src", "group_src"),
    "isend": ("dst", "group_dst"), "irecv": ("src", "group_src"),
    "broadcast": ("src", "group_src"), "reduce": ("dst", "group_dst"),
    "gather": ("dst", "group_dst"), "scatter": ("src", "group_src"),
    "all_reduce": None, "all_gather": None, "all_gather_into_tensor": None,
    "reduce_scatter": None, "reduce_scatter_tensor": None, "all_to_all": None,
    "all_to_all_single": None, "barrier": None, "monitored_barrier": None,
    "batch_isend_irecv": None, "all_reduce_coalesced": None,
}


def _stack(frame: FrameType | None) -> list[FrameType]:
    """A frame and its callers, innermost first (bounded)."""
    out: list[FrameType] = []
    while frame is not None and len(out) < 256:
        out.append(frame)
        frame = frame.f_back
    return out


def main_thread_call() -> dict[str, Any] | None:
    """What the main thread is in now (read from another thread: a trigger or SIGTERM)."""
    try:
        frame = sys._current_frames().get(threading.main_thread().ident or -1)
    except Exception:
        return None
    return call_in(_stack(frame))


def call_in(frames: list[FrameType]) -> dict[str, Any] | None:
    """The torch.distributed call a stack (innermost first) is in, with the peer or root it
    names as a global rank, and the user's frames that called it: ``{"op", "peer",
    "frames": [[name, file, line], ...]}``; None when it is in none. Where a rank waits and
    for whom is what the flight recorder lacks for gloo's send/recv (never recorded) and for
    a broadcast's root (no field)."""
    try:
        outer = None
        for i, f in enumerate(frames):
            if (f.f_code.co_name in _C10D_CALLS
                    and f.f_code.co_filename.endswith("distributed_c10d.py")):
                outer = i  # the outermost public call (send, not the isend it calls)
        if outer is None:
            return None
        f = frames[outer]
        op = f.f_code.co_name
        out: dict[str, Any] = {"op": op, "peer": None, "frames": []}
        names = _C10D_CALLS[op]
        if names:
            loc = f.f_locals
            glob, local = loc.get(names[0]), loc.get(names[1])
            if isinstance(glob, int) and not isinstance(glob, bool):
                out["peer"] = glob
            elif isinstance(local, int) and not isinstance(local, bool):
                try:
                    import torch.distributed as dist

                    group: Any = loc.get("group")
                    out["peer"] = int(dist.get_global_rank(group, local))
                except Exception:
                    pass
        for g in frames[outer + 1:]:
            name = g.f_code.co_filename
            if "/torch/" in name.replace("\\", "/") or name.endswith("typing_extensions.py"):
                continue
            out["frames"].append([g.f_code.co_name, name, g.f_lineno])
            if len(out["frames"]) >= 4:
                break
        return out
    except Exception:  # noqa: BLE001 - a dump never fails for this
        return None


ENDED_AFTER_S = 600.0  # an empty job folder untouched this long, its launcher gone: removed


def _ended_and_empty(hfd: int) -> bool:
    """Whether the job folder ``hfd`` holds nothing but what ``enable()`` made in it (its
    ``.mldebug-fr-job.json`` and an empty ``nccl/``) and its launcher no longer runs; then
    those two are removed here (this user's, no link followed) and True: the caller removes
    the folder. A folder with anything else - a dump, a registration, a file of the user's -
    stays whole. Pruning this keeps /tmp/mldebug-fr-<uid> from gathering one empty folder per
    job that never dumped."""
    from mldebug.fr.node import HOME_INFO

    try:
        names = os.listdir(hfd)
        if time.time() - os.fstat(hfd).st_mtime < ENDED_AFTER_S:
            return False  # a rank whose launcher died may still be finishing its dump
    except OSError:
        return False
    if not set(names) <= {HOME_INFO, NATIVE_SUBDIR} or HOME_INFO not in names:
        return False
    try:
        st = os.stat(HOME_INFO, dir_fd=hfd, follow_symlinks=False)
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 16:
            return False
        fd = os.open(HOME_INFO, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=hfd)
        with open(fd, "rb") as f:
            info = json.loads(f.read(1 << 16) or b"{}")
        launcher = info.get("launcher_pid") if isinstance(info, dict) else None
        started = info.get("created") if isinstance(info, dict) else None
        if isinstance(launcher, int) and not isinstance(launcher, bool) and 0 < launcher < 1 << 31:
            try:
                os.kill(launcher, 0)
                return False  # still running (or a pid we cannot judge): the job may dump yet
            except ProcessLookupError:
                pass
            except OSError:
                return False
        elif not (isinstance(started, (int, float)) and time.time() - started > 86400):
            return False  # no launcher to ask: only a day-old folder is taken for ended
        if NATIVE_SUBDIR in names:
            nst = os.stat(NATIVE_SUBDIR, dir_fd=hfd, follow_symlinks=False)
            if not stat.S_ISDIR(nst.st_mode) or nst.st_uid != os.geteuid():
                return False
            os.rmdir(NATIVE_SUBDIR, dir_fd=hfd)  # only when empty: ENOTEMPTY otherwise
        os.unlink(HOME_INFO, dir_fd=hfd)
        return True
    except (OSError, ValueError):
        return False


def _die_by(signum: int) -> None:
    try:
        signal.signal(signum, signal.SIG_DFL)
    except ValueError:  # not the main thread
        os._exit(128 + signum)
    os.kill(os.getpid(), signum)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write through a random, exclusively created (O_EXCL, O_NOFOLLOW) 0600 temporary file
    renamed over ``path``: a symlink planted at ``path`` is replaced, never written through."""
    from mldebug.nodekit import atomic_write

    atomic_write(str(path), data)


def _raw_trace() -> bytes:
    """torch's dump of this process's recorder(s).

    CUDA builds keep NCCL work in their own recorder (``_dump_nccl_trace``); CPU backends
    (gloo) use ``_dump_fr_trace``. When both hold entries they are merged by creation time.
    """
    import torch

    c10d = torch._C._distributed_c10d
    dumps = [bytes(fn()) for fn in (getattr(c10d, "_dump_nccl_trace", None),
                                    getattr(c10d, "_dump_fr_trace", None)) if fn is not None]
    if not dumps:
        raise RuntimeError("this torch build has no flight recorder (_dump_fr_trace); "
                           "torch >= 2.5 is needed")
    if len(dumps) == 1:
        return dumps[0]
    from mldebug.safeload import safe_loads

    docs = [safe_loads(d) for d in dumps]
    full = [d for d in docs if isinstance(d, dict) and d.get("entries")]
    if len(full) <= 1:
        return pickle.dumps(full[0] if full else docs[0], protocol=4)
    return pickle.dumps(merge_dumps(full), protocol=4)


def merge_dumps(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One dump from several recorders of one process (entries ordered by creation time)."""
    out = dict(docs[0])
    entries = [e for d in docs for e in d.get("entries", [])]
    entries.sort(key=lambda e: e.get("time_created_ns") or 0)
    out["entries"] = entries
    for key in ("pg_config", "pg_status"):
        merged: dict[str, Any] = {}
        for d in docs:
            if isinstance(d.get(key), dict):
                merged.update(d[key])
        out[key] = merged
    return out


def _world_size() -> int | None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        pass
    return identity().world_size


def _fill_pg_config(doc: dict[str, Any]) -> None:
    """Add every live process group's members to pg_config under the name its entries use.

    gloo writes one placeholder group named '' that no entry refers to (and torchfrtrace
    stops with a KeyError on it); the live groups give the real names, descs and ranks.
    """
    cfg = doc.get("pg_config")
    if not isinstance(cfg, dict):
        cfg = {}
    try:
        from torch.distributed import distributed_c10d as c10d

        if not c10d.is_initialized():
            return
        for pg, name in list(c10d._world.pg_names.items()):
            if str(name) in cfg:
                continue
            try:
                ranks = sorted(c10d.get_process_group_ranks(pg))
            except Exception:
                continue
            desc = getattr(pg, "group_desc", None) or "undefined"
            cfg[str(name)] = {"name": str(name), "desc": str(desc), "ranks": str(ranks)}
        if "" in cfg and len(cfg) > 1:
            del cfg[""]
        doc["pg_config"] = cfg
    except Exception:
        pass


_RECORDER: Recorder | None = None


def enable(dump_dir: str | Path | None = None, trigger: bool = True, on_failure: bool = True,
           buffer_size: int = 2000, native: bool = True, raw_copy: bool = False) -> Recorder:
    """Turn the flight recorder on for this rank and make it dumpable from outside.

    Call once, before or after ``init_process_group``. Returns the recorder; calling again
    returns the same one. ``dump_dir`` defaults to ``$MLDEBUG_FR_DIR`` or, when neither is
    given, this job's own folder ``/tmp/mldebug-fr-<uid>/<job>/`` (``mldebug.ranks.job_home``:
    the job key and the launcher; ``mldebug fr trigger`` looks in every job's folder and
    ``--list`` lists them), so one job never replaces another's dumps. ``raw_copy`` (or
    ``MLDEBUG_FR_RAW=1``) also keeps torch's unmodified bytes in ``<dir>/raw/``.
    """
    global _RECORDER
    if _RECORDER is not None:
        return _RECORDER
    chosen = dump_dir is not None or bool(os.environ.get("MLDEBUG_FR_DIR"))
    d = Path(dump_dir) if dump_dir is not None else default_dir()
    try:
        private_dir(str(d))
    except (UnsafeDir, OSError) as e:
        if dump_dir is not None:
            from mldebug.errors import MldebugError

            raise MldebugError(f"mldebug.fr.enable(): {e}") from None
        # the default place is taken (another user made it): a private one beside it, which
        # `mldebug fr trigger` also finds, rather than killing the training job
        from mldebug.privdir import private_dir as fresh_private_dir

        d = fresh_private_dir(d, fallback=True, what="flight-recorder directory")
        chosen = False
    home_key: str | None = None
    in_home = False
    if not chosen:  # the default: one folder per job in it, so no job replaces another's dumps
        from mldebug.ranks import job_home, job_of

        me0 = identity()
        home_key = job_of(dict(os.environ), me0.host, None)["key"]
        home = d / job_home(dict(os.environ), me0.host, os.getpid(), os.getppid())
        try:
            private_dir(str(home))
            d, in_home = home, True
        except (UnsafeDir, OSError) as e:
            _log(f"no job folder in {d} ({e}); dumps go to {d} itself")
        os.environ["MLDEBUG_FR_DIR"] = str(d)  # this process's children: the same folder
    if not (os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        os.environ["TORCH_FR_BUFFER_SIZE"] = str(buffer_size)
    if native:
        size = (os.environ.get("TORCH_FR_BUFFER_SIZE")
                or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or str(buffer_size))
        env = native_env(d, int(size) if size.isdecimal() else buffer_size)
        for key, value in env.items():
            os.environ.setdefault(key, value)
        try:
            private_dir(str(d / NATIVE_SUBDIR))
        except (UnsafeDir, OSError) as e:
            _log(f"no native NCCL dump folder: {e}")
    me = identity()  # any launcher's variables; torch.distributed's rank wins below
    rec = Recorder(dump_dir=d, rank=me.rank, host=me.host,
                   raw_copy=raw_copy or os.environ.get("MLDEBUG_FR_RAW") == "1")
    try:
        rec.dir_fd()  # checked on the fd now and kept: a later swap of the path changes nothing
        if in_home:
            from mldebug.fr.node import HOME_INFO

            rec._write((), HOME_INFO, json.dumps(
                {"key": home_key, "launcher_pid": os.getppid() if home_key else None,
                 "host": me.host, "created": time.time()}).encode())
    except (UnsafeDir, OSError) as e:
        _log(f"cannot open {d} ({e}); no dump will be written")
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rec.rank = int(dist.get_rank())
    except ImportError:
        pass
    if trigger:
        rec.start_trigger_thread()
    if on_failure:
        rec.install_failure_hooks()
    _RECORDER = rec
    return rec


def dump(reason: str = "requested") -> Path | None:
    """Dump this rank now (after ``enable()``); returns the file, or None if it failed."""
    return (_RECORDER or enable()).dump(reason)
