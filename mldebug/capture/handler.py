"""Dumps on a signal, without ptrace: ``install_dump_handler()``.

Two routes answer one signal. At C level, ``faulthandler.register`` writes every thread's
Python stack into a private file from the signal handler itself - it needs no GIL, so a rank
blocked in a collective or holding the GIL in a C call still answers. At Python level, a
daemon thread that wakes every ``poll`` seconds sees that file grow and writes the richer dump
(thread names, locals when asked) in the format of ``mldebug hang --out``. ``mldebug hang
--signal`` uses the richer one when it arrives and parses the C one otherwise; each dump says
which route produced it.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mldebug.privdir import (
    default_dir,
    open_private,
    own_registry_dir,
    private_dir,
    read_bounded,
    write_atomic,
)
from mldebug.ranks import ns_tag, pid_namespace, start_time
from mldebug.stacks import parse_faulthandler, python_threads

DUMP_FORMAT = "mldebug.hang.dump/1"  # mldebug.hang.collect.DUMP_FORMAT (a test pins it)
REGISTRY_FORMAT = "mldebug.capture.registry/1"


def _log(msg: str) -> None:
    try:
        sys.stderr.write(f"mldebug.capture: {msg}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - logging must never hurt the job
        pass


def _signum(sig: int | str) -> int:
    if isinstance(sig, int):
        return sig
    name = sig.upper()
    return int(getattr(signal, name if name.startswith("SIG") else "SIG" + name))


class DumpHandler:
    """Dump this process's stacks into ``dir`` on ``signum`` (and on demand with ``dump()``)."""

    thread_name = "mldebug-capture"

    def __init__(self, dir: str | Path | None = None, signum: int | str = signal.SIGUSR1,
                 locals: bool = False, poll: float = 1.0) -> None:
        from mldebug.dist import identity

        # the default place may be taken by another user: a fresh private dir then, said on stderr
        self.dir = private_dir(dir if dir is not None else default_dir(),
                               fallback=dir is None, what="dump directory").resolve()
        self.dumps_dir = private_dir(self.dir / "dumps")
        self.fh_dir = private_dir(self.dir / "faulthandler")
        self.signum = _signum(signum)
        current = signal.getsignal(self.signum)
        if callable(current):  # e.g. Lightning's SLURM requeue on SIGUSR1: never take it over
            from mldebug.errors import MldebugError

            name = signal.Signals(self.signum).name
            raise MldebugError(
                f"{name} already has a handler in this process "
                f"({getattr(current, '__qualname__', current)!r}); mldebug would replace it.",
                "Pass another signal: mldebug.watchdog(signum=\"SIGUSR2\") and "
                "mldebug hang --signal SIGUSR2.")
        self.locals = locals
        self.poll = poll
        self.pid = os.getpid()
        ident = identity()
        self.identity = ident.to_dict()
        self.host = ident.host
        rank = ident.rank
        self.stem = f"{self.host}-rank{rank}-{self.pid}" if rank is not None else f"{self.host}-{self.pid}"
        self.dump_path = self.dumps_dir / f"{self.stem}.json"
        self.fh_path = self.fh_dir / f"{self.stem}.txt"
        self._fh_fd = open_private(self.fh_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._fh_seen = os.fstat(self._fh_fd).st_size
        self._first: list[dict[str, Any]] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.dumps = 0
        faulthandler.register(self.signum, file=self._fh_fd, all_threads=True, chain=False)
        self.registry_path = self._register()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        atexit.register(self._unregister)

    # -- registry: how `mldebug hang --signal` finds us without reading our environment ------
    def _register(self) -> Path | None:
        entry = {"format": REGISTRY_FORMAT, "pid": self.pid, "host": self.host,
                 "start_time": start_time(self.pid), "pidns": pid_namespace(),
                 "dir": str(self.dir),
                 "dump": str(self.dump_path), "faulthandler": str(self.fh_path),
                 "signal": self.signum, "poll": self.poll,
                 "main_ident": threading.main_thread().ident,
                 "identity": self.identity, "cmdline": [sys.executable, *sys.argv],
                 "python_path": [p for p in sys.path if p]}
        try:
            reg = own_registry_dir()
            path = reg / f"{self.host}-{self.pid}{ns_tag()}.json"
            with _registry_lock(reg):
                _prune(reg, self.host)
                write_atomic(path, json.dumps(entry).encode())
            return path
        except Exception as e:  # noqa: BLE001 - dumps still work; only discovery suffers
            _log(f"could not register for 'mldebug hang --signal' ({e})")
            return None

    def close(self) -> None:
        """Stop the thread, unregister the signal and the registry entry."""
        self._stop.set()
        try:
            faulthandler.unregister(self.signum)
        except Exception:  # noqa: BLE001
            pass
        self._unregister()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll * 2 + 1)
        try:
            os.close(self._fh_fd)
        except OSError:
            pass

    def _unregister(self) -> None:
        """Remove our registry entry (at exit too; a killed rank's stale entry is ignored by
        the collector, whose pid + start time check fails)."""
        if self.registry_path is not None:
            try:
                os.unlink(self.registry_path)
            except OSError:
                pass
            self.registry_path = None

    # -- the thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._tick()
            except Exception as e:  # noqa: BLE001 - the job must never die of its watchdog
                _log(f"{type(e).__name__}: {e}")

    def _tick(self) -> None:
        if (self.registry_path is not None and not self._stop.is_set()
                and not os.path.lexists(self.registry_path)):
            # another rank's prune can race with our registration when our pid was reused
            # (another node's pid namespace, a restarted job): register again
            self.registry_path = self._register()
        size = os.fstat(self._fh_fd).st_size
        if size > self._fh_seen:  # a signal came: faulthandler has written its part
            self._fh_seen = size
            self.dump(reason="signal", route="python")

    # -- dumping ---------------------------------------------------------------------------
    def _meta(self, reason: str, route: str, **extra: Any) -> dict[str, Any]:
        return {"reason": reason, "route": route, "time": time.time(),
                "signal": signal.Signals(self.signum).name, "seq": self.dumps, **extra}

    def _rank(self) -> dict[str, Any]:
        ident = dict(self.identity)
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                ident["rank"] = int(dist.get_rank())
                ident["world_size"] = int(dist.get_world_size())
        except Exception:  # noqa: BLE001
            pass
        return ident

    def write(self, threads: list[dict[str, Any]], meta: dict[str, Any],
              later: bool = False, samples: list[dict[str, Any]] | None = None,
              again: bool = False) -> Path:
        """Write the dump file: the first dump, and with ``later`` the newest one beside it
        (``mldebug hang --watch``'s shape, so the analysis tells stuck from slow).
        ``again``: the same dump rewritten with more of its ``capture`` block."""
        with self._lock:
            self.dumps += not again
            if not later or self._first is None:
                self._first, latest = threads, None
            else:
                latest = threads
            doc = {"format": DUMP_FORMAT, "host": self.host, "pid": self.pid,
                   "ppid": os.getppid(), "cmdline": [sys.executable, *sys.argv],
                   "identity": self._rank(), "dump": self._first, "dump_later": latest,
                   "error": None, "capture": meta}
            if samples and not later:
                doc["samples"] = samples  # the main thread's state and CPU around the dump
            write_atomic(self.dump_path, json.dumps(doc, default=str).encode())
        return self.dump_path

    def dump(self, reason: str = "requested", route: str = "python", later: bool = False,
             **extra: Any) -> Path | None:
        """Dump every thread's stack now (Python route); never raises."""
        try:
            first = self._sample()
            threads = python_threads(self.locals, skip={threading.get_ident()}
                                     if threading.current_thread().name == self.thread_name
                                     else None)
            extra.update(self._extras(reason))
            samples = None
            if first is not None:  # as mldebug hang samples a rank: spinning or blocked
                time.sleep(max(0.0, 0.1 - (time.monotonic() - first["t"])))
                second = self._sample()
                samples = [first, second] if second is not None else None
            meta = self._meta(reason, route, **extra)
            path = self.write(threads, meta, later=later, samples=samples)
            # the flight recorder's dump comes second: torch's first dump in a process
            # imports torch._inductor (seconds), and whoever asked for the stacks and the
            # ring (`mldebug hang --signal`, `mldebug trace show`) must not wait for it
            fr = self._fr_extra(reason)
            if fr:
                path = self.write(threads, {**meta, **fr}, later=later, samples=samples,
                                  again=True)
            return path
        except Exception as e:  # noqa: BLE001
            _log(f"could not write the stack dump ({type(e).__name__}: {e})")
            return None

    def _sample(self) -> dict[str, Any] | None:
        """The main thread's /proc sample (mldebug.ranks.proc_sample), or None."""
        from mldebug.ranks import proc_sample

        main = threading.main_thread()
        if main is threading.current_thread():
            return None  # dumping from the main thread itself says nothing of its state
        return proc_sample(self.pid, main.native_id)

    def dump_faulthandler_text(self, text: str, reason: str, later: bool = False,
                               **extra: Any) -> Path | None:
        """Turn a C-level faulthandler dump into the hang format (the GIL was held)."""
        threads = parse_faulthandler(text, self.pid, threading.main_thread().ident,
                                     {t.ident: t.name for t in threading.enumerate()
                                      if t.ident is not None})
        threads = [t for t in threads if t["thread_name"] != self.thread_name]
        if not threads:
            return None
        return self.write(threads, self._meta(reason, "faulthandler", **extra), later=later)

    def _fr_extra(self, reason: str) -> dict[str, Any]:
        """The flight recorder's dump (after mldebug.fr.enable()): its path, for the dump's
        ``capture`` block."""
        rec_mod = sys.modules.get("mldebug.fr.recorder")
        if rec_mod is None or getattr(rec_mod, "_RECORDER", None) is None:
            return {}
        fr = rec_mod._RECORDER.dump(f"mldebug.capture: {reason}")
        return {"flight_recorder": str(Path(fr).resolve()) if fr else None}

    def _extras(self, reason: str) -> dict[str, Any]:
        """The trace ring's tail and the debug server's port, for the dump's ``capture``
        block (fast: written with the stacks; the flight recorder's dump follows)."""
        out: dict[str, Any] = {}
        ring = sys.modules.get("mldebug.trace.ring")
        if ring is not None and ring.active() is not None:
            tr = ring.write(private_dir(self.dir / "trace"), reason=reason)
            out["trace"] = str(tr) if tr else None
        port = debug_server_port()
        if port is not None:
            out["debug_server"] = port
        return out


def debug_server_port() -> int | None:
    """The port of torch's debug worker server in this process when the job called
    ``torch.distributed.debug.start_debug_server()`` (PyTorch 2.13+): read from that module's
    ``_WORKER_SERVER`` global, a private name, only if the module is already imported."""
    mod = sys.modules.get("torch.distributed.debug")
    server = getattr(mod, "_WORKER_SERVER", None) if mod is not None else None
    try:
        return int(server.port) if server is not None else None
    except Exception:  # noqa: BLE001 - a changed private API: just not said
        return None


@contextmanager
def _registry_lock(reg: Path, wait: float = 2.0) -> Iterator[None]:
    """The registry's ranks register one at a time. Without it, rank A's prune could read a
    stale entry under rank B's file name (the same pid in a recycled pid namespace: every
    fresh namespace numbers its ranks alike), and unlink it just after B renamed its live
    entry there; B, frozen, would never register again. Bounded: after ``wait`` s (a holder
    stopped mid-registration) it goes on unlocked - registering must never hold up the job."""
    import fcntl

    from mldebug.printing import open_lock_file

    try:
        fd = open_lock_file(str(reg / ".lock"))  # ours, a regular file, no link followed
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # releases the lock


def _prune(reg: Path, host: str) -> None:
    """Remove this host's registry entries whose process is gone (killed ranks leave them)."""
    ours = pid_namespace()
    for name in os.listdir(reg):
        if not (name.startswith(host + "-") and name.endswith(".json")):
            continue
        try:
            before = os.lstat(reg / name)
            entry = json.loads(read_bounded(reg / name, 1 << 20))
            if entry.get("format") != REGISTRY_FORMAT:
                continue
            if entry.get("pidns", ours) != ours:
                continue  # another pid namespace's rank: its pid means nothing in this /proc
            if start_time(int(entry["pid"])) != entry.get("start_time"):
                # a rank that reuses the pid (another node's namespace, a restarted job) may
                # have replaced this stale file with its own entry meanwhile: only the file
                # read is removed (the live rank's rename makes a new inode)
                now = os.lstat(reg / name)
                if (now.st_ino, now.st_mtime_ns) == (before.st_ino, before.st_mtime_ns):
                    os.unlink(reg / name)
        except (OSError, ValueError, KeyError, TypeError):
            continue


_HANDLER: DumpHandler | None = None


def install_dump_handler(dir: str | Path | None = None, signum: int | str = signal.SIGUSR1,
                         locals: bool = False, poll: float = 1.0) -> DumpHandler:
    """Dump every thread's stack into ``dir`` (default ``$MLDEBUG_DIR``, else the job's
    directory under ~/.local/state/mldebug/capture: privdir.default_dir) whenever this process gets ``signum``; what ``mldebug hang --signal`` asks for. Calling
    again returns the installed handler."""
    global _HANDLER
    if _HANDLER is None:
        _HANDLER = DumpHandler(dir, signum, locals, poll)
    return _HANDLER
