"""Trigger every rank's flight-recorder dump on this node and return the dumps (stdlib only).

This file is sent to each node by ``mldebug fr trigger --nodes`` (through mldebug.fanout), so
it imports nothing outside the standard library and nodes need no mldebug install. It is
also imported by ``mldebug.fr.collect`` for the local case.

Ranks that called ``mldebug.fr.enable()`` register in the dump directory
(``.mldebug-fr-<host>-<pid>.json`` and a FIFO ``.mldebug-fr-<host>-<pid>.trigger``; the host
is in the name because pids repeat across nodes sharing one directory). For each registration of
a live process on this host the script writes a fresh token into the FIFO (non-blocking: a
rank that is not listening is reported, never waited on), then waits until the rank writes
``.mldebug-fr-<host>-<pid>.done`` naming that token and its dump file. When no rank registered but
PyTorch's native NCCL pipes exist (``<dir>/nccl/*.pipe``), it pokes those instead.

Output: one line ``MLDEBUG-JSON {"host":..., "ranks":[{"rank", "pid", "file", "data"|"error"}],
"notes":[...]}`` with each dump zlib-compressed and base64-encoded.
"""

from __future__ import annotations

import base64
import errno
import glob
import json
import os
import sys
import time
import zlib
from typing import Any

from mldebug.nodekit import ArgumentParser, emit, short_hostname

REGISTRY_PREFIX = ".mldebug-fr-"


def default_dir() -> str:
    return os.environ.get("MLDEBUG_FR_DIR") or f"/tmp/mldebug-fr-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _poke(path: str, token: str, deadline: float) -> str | None:
    """Write the token into a FIFO without ever blocking; returns an error or None."""
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO and time.monotonic() < deadline:
                time.sleep(0.05)  # the listener is between two reads (or busy dumping)
                continue
            if e.errno == errno.ENXIO:
                return "not listening on its trigger FIFO (process stuck before enable()?)"
            return f"cannot open trigger FIFO: {e.strerror}"
        try:
            os.write(fd, (token + "\n").encode())
        except OSError as e:
            return f"cannot write trigger FIFO: {e.strerror}"
        finally:
            os.close(fd)
        return None


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def _encode(path: str) -> tuple[str | None, str | None, int]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return None, f"dump {path} unreadable: {e.strerror}", 0
    return base64.b64encode(zlib.compress(data, 1)).decode(), None, len(data)


def trigger(dump_dir: str, timeout: float, include_data: bool = True) -> dict[str, Any]:
    host = short_hostname()
    out: dict[str, Any] = {"host": host, "dir": dump_dir, "ranks": [], "notes": []}
    if not os.path.isdir(dump_dir):
        out["notes"].append(f"{dump_dir} does not exist on {host}: no rank called "
                            "mldebug.fr.enable() with this directory here")
        return out
    deadline = time.monotonic() + timeout
    token = f"{time.time_ns()}-{os.getpid()}"
    waiting: list[dict[str, Any]] = []
    stale = 0
    for reg_path in sorted(glob.glob(os.path.join(dump_dir, REGISTRY_PREFIX + "*.json"))):
        reg = _read_json(reg_path)
        if not reg or reg.get("host") != host:
            continue
        pid = int(reg.get("pid", -1))
        if pid <= 0 or not _alive(pid):
            stale += 1
            continue
        item: dict[str, Any] = {"pid": pid, "rank": reg.get("rank")}
        err = _poke(str(reg.get("fifo")), token, min(deadline, time.monotonic() + 5))
        if err:
            item["error"] = err
            out["ranks"].append(item)
        else:
            item["_done"] = str(reg.get("done") or os.path.join(
                dump_dir, f"{REGISTRY_PREFIX}{host}-{pid}.done"))
            waiting.append(item)
    if stale:
        out["notes"].append(f"{stale} registration(s) of processes that no longer run were ignored")
    if not waiting and not out["ranks"]:
        _native(dump_dir, deadline, include_data, out)
    while waiting and time.monotonic() < deadline:
        for item in list(waiting):
            done = _read_json(item["_done"])
            if done and done.get("token") == token:
                waiting.remove(item)
                del item["_done"]
                item["rank"] = done.get("rank", item["rank"])
                if not done.get("file"):
                    item["error"] = "the rank could not dump: " + str(done.get("error", "?"))
                else:
                    item["file"] = done["file"]
                    if include_data:
                        item["data"], err, item["bytes"] = _encode(done["file"])
                        if err:
                            item["error"] = err
                out["ranks"].append(item)
        if waiting:
            time.sleep(0.05)
    for item in waiting:
        del item["_done"]
        item["error"] = (f"did not dump within {timeout:g}s (the recorder is slow with large "
                         "buffers or the process is frozen); raise --timeout")
        out["ranks"].append(item)
    if not out["ranks"]:
        out["notes"].append(f"no rank on {host} is registered in {dump_dir}: call "
                            "mldebug.fr.enable() in the training script (or pass --dir)")
    return out


def _native(dump_dir: str, deadline: float, include_data: bool, out: dict[str, Any]) -> None:
    """Fallback: PyTorch's own NCCL debug pipes (<stem><rank>.pipe) without mldebug.enable()."""
    pipes = sorted(glob.glob(os.path.join(dump_dir, "nccl", "*.pipe")))
    if not pipes:
        return
    start = time.time()
    pending = {}
    for pipe in pipes:
        target = pipe[: -len(".pipe")]
        err = _poke(pipe, "1", min(deadline, time.monotonic() + 2))
        if err:
            out["ranks"].append({"rank": None, "file": target, "error": "native pipe " + err})
        else:
            pending[target] = pipe
    while pending and time.monotonic() < deadline:
        for target in list(pending):
            try:
                fresh = os.stat(target).st_mtime >= start
            except OSError:
                fresh = False
            if fresh:
                time.sleep(0.2)  # the watchdog writes in place
                del pending[target]
                digits = "".join(ch for ch in os.path.basename(target) if ch.isdigit())
                item: dict[str, Any] = {"rank": int(digits) if digits else None, "file": target,
                                        "native": True}
                if include_data:
                    item["data"], err, item["bytes"] = _encode(target)
                    if err:
                        item["error"] = err
                out["ranks"].append(item)
        time.sleep(0.05)
    for target in pending:
        out["ranks"].append({"rank": None, "file": target,
                             "error": "native NCCL pipe poked but no dump appeared in time"})


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="mldebug-fr-node")
    p.add_argument("--dir", default=None)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--no-data", action="store_true")
    a = p.parse_args(argv)
    doc = trigger(a.dir or default_dir(), a.timeout, include_data=not a.no_data)
    emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
