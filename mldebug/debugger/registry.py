"""Where open debugger sessions are registered: one 0600 file per session in a private dir.

A rank that opens a session writes its registration (host, rank, pid, port, token, where it
stopped) here; ``mldebug pdb list`` and ``connect`` read it, on the node, as the same user.
The directory is hostile ground (/tmp): it is created 0700 and refused when another user owns
it or can write it; files are opened without following symlinks and must be regular files of
ours. Stdlib only: this module is sent to the nodes with the ``pdb list`` node script.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
from typing import Any

from mldebug.nodekit import atomic_write, short_hostname
from mldebug.privdir import UnsafeDir, check_dir

FORMAT = "mldebug.pdb.session/1"
MAX_FILE = 64 * 1024  # a registration is a few hundred bytes; anything bigger is not ours
SUFFIX = ".session.json"


class RegistryError(Exception):
    """The private directory or a registration cannot be trusted; the message says why."""


def default_dir() -> str:
    """The user's session directory on this host (override: MLDEBUG_PDB_DIR).

    A fixed /tmp path, not $TMPDIR: schedulers give each job its own TMPDIR, and ``mldebug
    pdb list`` reaches the node over ssh without the job's environment.
    """
    return os.environ.get("MLDEBUG_PDB_DIR") or f"/tmp/mldebug-pdb-{os.geteuid()}"


def short_host() -> str:
    return short_hostname()


def check_private(path: str) -> None:
    """Raise RegistryError unless ``path`` passes ``mldebug.privdir``'s rule (a real directory
    of ours that nobody else can write); FileNotFoundError when it is missing."""
    try:
        check_dir(path, what="debugger session directory (MLDEBUG_PDB_DIR)")
    except UnsafeDir as e:
        raise RegistryError(str(e)) from None


def private_dir(path: str | None = None) -> str:
    """Create (0700) or check the session directory and return its path."""
    path = path or default_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise RegistryError(f"cannot create {path}: {e.strerror}") from None
    check_private(path)
    return path


def new_token() -> str:
    return secrets.token_hex(16)


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks (tells a live process from a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read(4096).decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def file_name(host: str, pid: int, port: int) -> str:
    return f"{host}.{pid}.{port}{SUFFIX}"


def write(directory: str, doc: dict[str, Any]) -> str:
    """Write (or replace) a registration atomically: a random temporary name, O_EXCL, 0600."""
    check_private(directory)
    final = os.path.join(directory, file_name(doc["host"], doc["pid"], doc["port"]))
    atomic_write(final, json.dumps(doc).encode())
    return final


def remove(path: str) -> None:
    """Remove a registration this process wrote (nothing else)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read(path: str) -> dict[str, Any]:
    """Read one registration without following links; it must be a small regular file of ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise RegistryError(f"cannot open {os.path.basename(path)}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise RegistryError(f"{os.path.basename(path)} is not a regular file")
        if st.st_uid != os.geteuid():
            raise RegistryError(f"{os.path.basename(path)} is owned by uid {st.st_uid}, not you")
        raw = f.read(MAX_FILE + 1)
    if len(raw) > MAX_FILE:
        raise RegistryError(f"{os.path.basename(path)} is larger than {MAX_FILE} bytes")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise RegistryError(f"{os.path.basename(path)} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RegistryError(f"{os.path.basename(path)} is not a session registration")
    for key, kind in (("pid", int), ("port", int), ("host", str), ("token", str)):
        if not isinstance(doc.get(key), kind):
            raise RegistryError(f"{os.path.basename(path)}: {key} missing or mistyped")
    if not 0 < doc["port"] < 65536:
        raise RegistryError(f"{os.path.basename(path)}: port {doc['port']} out of range")
    return doc


def sessions(directory: str | None = None, host: str | None = None
             ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The live sessions of this host in ``directory``, and the files skipped with why.

    Registrations of other hosts (a /tmp shared between nodes) are ignored; those whose
    process is gone (or whose pid was reused) are skipped as stale, not deleted.
    """
    directory = directory or default_dir()
    host = host or short_host()
    try:
        check_private(directory)
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return [], []
    found: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        path = os.path.join(directory, name)
        try:
            doc = read(path)
        except RegistryError as e:
            skipped.append({"file": name, "reason": str(e)})
            continue
        if doc["host"] != host:
            continue
        if process_start(doc["pid"]) != doc.get("start"):
            skipped.append({"file": name, "reason": f"stale: pid {doc['pid']} is gone"})
            continue
        found.append(doc)
    return found, skipped


def find(directory: str | None, *, port: int | None = None, rank: int | None = None,
         pid: int | None = None) -> dict[str, Any]:
    """The one live session of this host matching port / rank / pid (RegistryError if not one)."""
    found, _ = sessions(directory)
    match = [d for d in found
             if (port is None or d["port"] == port) and (rank is None or d.get("rank") == rank)
             and (pid is None or d["pid"] == pid)]
    what = " ".join(f"{k} {v}" for k, v in (("port", port), ("rank", rank), ("pid", pid))
                    if v is not None)
    if not match:
        raise RegistryError(f"no open debugger session with {what} on {short_host()} "
                            f"(mldebug pdb list shows the open ones)")
    if len(match) > 1:
        ports = ", ".join(f"{d['host']}:{d['port']}" for d in match)
        raise RegistryError(f"{len(match)} sessions match {what}: {ports}; connect to one "
                            f"with HOST:PORT")
    return match[0]


def now() -> float:
    return round(time.time(), 3)
