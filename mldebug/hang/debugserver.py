"""torch's debug server as a route to a rank's stacks without ptrace (``mldebug hang``'s second
route, after py-spy and before a signal).

PyTorch 2.13's ``torch.distributed.debug.start_debug_server()`` starts a small HTTP worker
server in every rank and registers its URL in the job's TCPStore under
``/debug_server/rank<R>`` (TCPStore's key prefix ``/`` + ``PrefixStore("debug_server")`` +
``rank<R>``; the value is ``http://<gethostname()>:<port>``). Its handlers answer
``POST /handler/<name>``: ``pyspy_dump`` runs ``py-spy dump --pid <its own pid>`` (text,
status 500 when py-spy fails; the rank's own py-spy may attach where ours may not),
``dump_traceback`` is ``faulthandler.dump_traceback(all_threads=True)`` (needs the GIL).
Formats taken from torch's source: ``TCPStore.cpp``, ``TCPStoreBackend.hpp``,
``TCPStoreLibUvBackend.cpp`` (the wire protocol) and ``control_plane/`` (the handlers).

Stdlib only (Python 3.8+): it travels with ``mldebug.hang.node`` to nodes without mldebug.
Every step is bounded - connect, each read, the size of each answer and a total deadline
(a watchdog thread shuts the socket down) - and a store or server that refuses, hangs or
answers garbage becomes one line (``RouteError``), never a traceback. Nothing listens; a node
connects only to the store named by the rank's environment, its launcher or ``--store``, and
only to worker URLs whose host is this node.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from mldebug.nodekit import for_each
from mldebug.ranks import launcher_above
from mldebug.stacks import faulthandler_dumps

# TCPStore wire protocol (TCPStoreBackend.hpp): one query byte, little-endian integers,
# strings as uint64 length + bytes.
VALIDATE, GET, CHECK, PING = 0, 3, 5, 13
MAGIC = 0x3C85F7CE  # validationMagicNumber
READY, NOT_READY = 0, 1  # CheckResponseType
KEY_PREFIX = "/debug_server/rank"
MAX_URL = 1024  # a registered URL; a longer value is not one
MAX_BODY = 16 << 20  # one handler's answer (a py-spy or faulthandler text is a few KB)
MAX_SCAN = 65536  # ranks looked up in a store when the local ranks' numbers are unknown
SCAN_CHUNK = 512
MAX_STORES = 8
ROUTE = "debug-server"
_URL = re.compile(r"^http://(?P<host>[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])"
                  r":(?P<port>\d{1,5})/?$")


class RouteError(Exception):
    """One line saying why the debug-server route gave nothing (the store or the server)."""


# -- bounded sockets ------------------------------------------------------------------------
class _Deadline:
    """Shut ``sock`` down when the total time is up, so no read or write outlives it."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.expired = False
        self._sock = sock
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.expired = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


def _connect(host: str, port: int, timeout: float, what: str) -> socket.socket:
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        raise RouteError(f"{what} at {_hp(host, port)} refused the connection") from None
    except TimeoutError:
        raise RouteError(f"{what} at {_hp(host, port)} did not accept a connection within "
                         f"{timeout:g}s") from None
    except socket.gaierror as e:
        raise RouteError(f"{what} at {_hp(host, port)}: cannot resolve {host!r} "
                         f"({e.strerror})") from None
    except OSError as e:
        raise RouteError(f"{what} at {_hp(host, port)}: {e.strerror or e}") from None


def _hp(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """``fn()`` on a daemon thread, given ``seconds`` (name resolution cannot be interrupted
    otherwise); its RouteError is re-raised here, and running past the time is one too."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except RouteError as e:
            box["error"] = e
        except Exception as e:  # noqa: BLE001 - outside data: one line, never a traceback
            box["error"] = RouteError(f"{what}: {type(e).__name__}: {e}"[:300])

    t = threading.Thread(target=work, daemon=True, name="mldebug-debugserver")
    t.start()
    t.join(seconds + 0.5)
    if t.is_alive():
        raise RouteError(f"{what} did not answer within {seconds:.1f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# -- the job's TCPStore ---------------------------------------------------------------------
def _key(k: str) -> bytes:
    b = k.encode()
    return struct.pack("<Q", len(b)) + b


class StoreClient:
    """A read-only client of a TCPStore: VALIDATE, PING, CHECK and GET (CHECK first: a GET of
    a missing key answers an empty value on the libuv store, and the older store closes the
    connection). Bounded by ``timeout`` per step and ``deadline`` (monotonic) in all."""

    def __init__(self, host: str, port: int, *, timeout: float, deadline: float) -> None:
        self.where = f"the job's TCPStore at {_hp(host, port)}"
        left = deadline - time.monotonic()
        if left <= 0:
            raise RouteError(f"{self.where}: no time left to ask it")
        self.sock = _connect(host, port, min(timeout, left), "the job's TCPStore")
        self.sock.settimeout(min(timeout, left))
        self._guard = _Deadline(self.sock, left)
        self.timeout = timeout
        try:
            self._send(bytes([VALIDATE]) + struct.pack("<I", MAGIC))
            nonce = os.getpid() & 0xFFFFFFFF
            self._send(bytes([PING]) + struct.pack("<I", nonce))
            got = self._recv(4)
            if struct.unpack("<I", got)[0] != nonce:
                raise RouteError(f"{self.where} answered something that is not a TCPStore "
                                 f"(ping: {got!r})")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._guard.cancel()
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise self._failed(e) from None

    def _failed(self, e: BaseException) -> RouteError:
        if self._guard.expired:
            return RouteError(f"{self.where} did not finish answering in time")
        if isinstance(e, socket.timeout):
            return RouteError(f"{self.where} did not answer within {self.timeout:.1f} s")
        return RouteError(f"{self.where}: {getattr(e, 'strerror', None) or e}")

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except OSError as e:
                raise self._failed(e) from None
            if not chunk:
                if self._guard.expired:
                    raise RouteError(f"{self.where} did not finish answering in time")
                raise RouteError(f"{self.where} closed the connection (not a TCPStore, or it "
                                 "refused the query)")
            buf += chunk
        return bytes(buf)

    def check(self, keys: list[str]) -> list[bool]:
        """Whether each key is set; one pipelined round trip per chunk of keys."""
        out: list[bool] = []
        for i in range(0, len(keys), SCAN_CHUNK):
            chunk = keys[i:i + SCAN_CHUNK]
            self._send(b"".join(bytes([CHECK]) + struct.pack("<Q", 1) + _key(k) for k in chunk))
            answer = self._recv(len(chunk))
            for b in answer:
                if b not in (READY, NOT_READY):
                    raise RouteError(f"{self.where} answered a CHECK with {b:#x}, neither "
                                     "ready nor not-ready: not a TCPStore")
                out.append(b == READY)
        return out

    def get(self, keys: list[str], limit: int = MAX_URL) -> list[bytes]:
        """The values of keys known to be set (``check``), each at most ``limit`` bytes."""
        out: list[bytes] = []
        for i in range(0, len(keys), SCAN_CHUNK):
            chunk = keys[i:i + SCAN_CHUNK]
            self._send(b"".join(bytes([GET]) + _key(k) for k in chunk))
            for k in chunk:
                size = struct.unpack("<Q", self._recv(8))[0]
                if size > limit:
                    raise RouteError(f"{self.where} answered {size} bytes for {k!r} (at most "
                                     f"{limit} expected): not a debug-server registration")
                out.append(self._recv(size))
        return out


def registrations(client: StoreClient, ranks: Iterable[int] | None,
                  world_size: int | None = None) -> dict[int, str]:
    """rank -> registered URL text for ``ranks``; without them ranks 0..world_size-1, or
    (world size unknown) chunk after chunk until one holds no registration."""
    found: dict[int, str] = {}

    def look(wanted: list[int]) -> int:
        keys = [f"{KEY_PREFIX}{r}" for r in wanted]
        ready = [(r, k) for r, k, ok in zip(wanted, keys, client.check(keys)) if ok]  # noqa: B905
        for (r, _), value in zip(ready, client.get([k for _, k in ready])):  # noqa: B905
            found[r] = value.decode("ascii", errors="replace")
        return len(ready)

    if ranks is not None:
        look(sorted(set(ranks)))
    elif world_size:
        look(list(range(min(world_size, MAX_SCAN))))
    else:
        for start in range(0, MAX_SCAN, SCAN_CHUNK):
            if not look(list(range(start, start + SCAN_CHUNK))) and start:
                break
    return found


def parse_url(value: str) -> tuple[str, int]:
    """Host and port of a registered worker URL (``http://HOST:PORT``); RouteError else."""
    m = _URL.match(value)
    port = int(m["port"]) if m else 0
    if not m or not 0 < port < 65536:
        raise RouteError(f"registered {value[:80]!r}, which is not an http://HOST:PORT URL")
    return m["host"].strip("[]"), port


# -- this node ------------------------------------------------------------------------------
def _read(path: str, limit: int = 4 << 20) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def local_addresses() -> set:
    """This node's own IPv4 and IPv6 addresses (/proc/net/fib_trie LOCAL entries,
    /proc/net/if_inet6), loopback included; no name resolution."""
    addrs = {"127.0.0.1", "::1"}
    last = None
    for line in _read("/proc/net/fib_trie").splitlines():
        s = line.strip()
        if s.startswith(("|--", "+--")):
            last = s[3:].strip().split("/")[0]
        elif s.startswith("/32 host LOCAL") and last:
            addrs.add(last)
    for line in _read("/proc/net/if_inet6").splitlines():
        raw = line.split()[0] if line.split() else ""
        if len(raw) == 32:
            try:
                addrs.add(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw)))
            except (ValueError, OSError):
                pass
    return addrs


def is_local(host: str, addrs: set | None = None) -> bool:
    """Whether a registered host names this node: its host name (whole or short) or one of
    its addresses. Short names only between names: a node named 10.0.0.5 is not 10.0.0.6."""
    node = os.uname().nodename
    if host in (node, "localhost"):
        return True
    if not _is_ip(host) and not _is_ip(node) and host.split(".")[0] == node.split(".")[0]:
        return True
    try:
        packed = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    norm = socket.inet_ntop(socket.AF_INET6 if ":" in host else socket.AF_INET, packed)
    return norm in (addrs if addrs is not None else local_addresses())


def listening(port: int) -> list[tuple[int, int]]:
    """(uid, inode) of every TCP socket listening on ``port`` here (/proc/net/tcp, tcp6)."""
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(name, 16 << 20).splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or f[3] != "0A":
                continue
            try:
                if int(f[1].rsplit(":", 1)[1], 16) == port:
                    out.append((int(f[7]), int(f[9])))
            except (ValueError, IndexError):
                continue
    return out


def pid_of_socket(inode: int, pids: Iterable[int]) -> int | None:
    """The pid among ``pids`` holding socket ``inode`` (its /proc/PID/fd, where readable)."""
    want = f"socket:[{inode}]"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds[:65536]:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == want:
                    return pid
            except OSError:
                continue
    return None


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on (its fds, when readable): a launcher's store."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd")[:65536]:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    except (OSError, ValueError):
        return []
    ports = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(name, 16 << 20).splitlines()[1:]:
            f = line.split()
            try:
                if len(f) >= 10 and f[3] == "0A" and int(f[9]) in inodes:
                    ports.append(int(f[1].rsplit(":", 1)[1], 16))
            except (ValueError, IndexError):
                continue
    return sorted(set(ports))


# -- the worker server ------------------------------------------------------------------------
def post(host: str, port: int, handler: str, query: str = "", *, timeout: float,
         limit: int = MAX_BODY) -> tuple[int, bytes]:
    """``POST /handler/<handler>`` on a worker server: (status, body). Bounded: ``timeout`` for
    everything (connect, headers, body), ``limit`` bytes of body; RouteError otherwise."""
    # here, not at the top: every local `mldebug hang` imports this module after its dumps,
    # and http.client (with the email parser) was 15 ms of it
    import http.client

    where = f"the debug server at {_hp(host, port)}"
    start = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    guard: _Deadline | None = None
    try:
        try:
            conn.connect()
        except ConnectionRefusedError:
            raise RouteError(f"{where} refused the connection (the rank exited, or its "
                             "server stopped)") from None
        except TimeoutError:
            raise RouteError(f"{where} did not accept a connection within {timeout:.1f} s") \
                from None
        assert conn.sock is not None
        guard = _Deadline(conn.sock, timeout - (time.monotonic() - start))
        path = f"/handler/{handler}" + (f"?{query}" if query else "")
        conn.request("POST", path, body=b"", headers={"Connection": "close"})
        resp = conn.getresponse()
        length = resp.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > limit:
            raise RouteError(f"{where} announced {int(length)} bytes for {handler} (at most "
                             f"{limit >> 20} MiB read): not read")
        body = bytearray()
        while True:
            chunk = resp.read(min(65536, limit + 1 - len(body)))
            if not chunk:
                break
            body += chunk
            if len(body) > limit:
                raise RouteError(f"{where} answered more than {limit >> 20} MiB for "
                                 f"{handler}: not read further")
        return resp.status, bytes(body)
    except RouteError:
        raise
    except (TimeoutError, OSError, http.client.HTTPException, ValueError) as e:
        if guard is not None and guard.expired or isinstance(e, socket.timeout):
            raise RouteError(f"{where} did not answer {handler} within {timeout:.1f} s") from None
        if isinstance(e, (http.client.BadStatusLine, http.client.LineTooLong)) or \
                isinstance(e, http.client.HTTPException) and \
                not isinstance(e, http.client.RemoteDisconnected):
            raise RouteError(f"{where} answered {handler} with something that is not HTTP "
                             f"({type(e).__name__})") from None
        if isinstance(e, http.client.RemoteDisconnected):
            raise RouteError(f"{where} closed the connection without answering "
                             f"{handler}") from None
        raise RouteError(f"{where}: {getattr(e, 'strerror', None) or e}"[:300]) from None
    finally:
        if guard is not None:
            guard.cancel()
        conn.close()


_PROCESS = re.compile(r"^Process (?P<pid>\d{1,10}): (?P<cmd>.*)$")
_THREAD = re.compile(r"^Thread (?:(?P<tid>0x[0-9A-Fa-f]{1,16}|\d{1,10}) )?\((?P<state>[^)]*)\)"
                     r"(?:: \"(?P<name>.*)\")?\s*$")
_PY_FRAME = re.compile(r"^\s+(?P<name>.+?) \((?P<file>[^()]+):(?P<line>\d{1,9})\)\s*$")
_NATIVE_FRAME = re.compile(r"^\s+(?P<name>.+?) \((?P<file>[^():]+)\)\s*$")
MAX_THREADS = 1024
MAX_FRAMES = 256


def pyspy_text_threads(text: str) -> tuple[int | None, list[dict[str, Any]]]:
    """The pid (``Process N:``) and threads, as ``py-spy dump --json`` gives them, of one
    ``py-spy dump`` text (the ``pyspy_dump`` handler's answer). mldebug.hang.pyspy reads
    pasted dumps of many processes; this is its one-process, stdlib twin for the node."""
    pid: int | None = None
    threads: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if len(line) > 4096 or not line.strip():
            continue
        if pid is None and (pm := _PROCESS.match(line)):
            pid = int(pm["pid"])
            continue
        if tm := _THREAD.match(line):
            if len(threads) >= MAX_THREADS:
                cur = None
                continue
            tid_s = tm["tid"] or "0"
            tid = int(tid_s, 16) if tid_s.startswith("0x") else int(tid_s)
            cur = {"pid": pid, "thread_id": tid, "thread_name": tm["name"] or "",
                   "os_thread_id": None if tid_s.startswith("0x") else tid,
                   "active": "active" in tm["state"], "owns_gil": "gil" in tm["state"],
                   "frames": []}
            threads.append(cur)
            continue
        if cur is None or len(cur["frames"]) >= MAX_FRAMES:
            continue
        if fm := _PY_FRAME.match(line):
            cur["frames"].append({"name": fm["name"], "filename": fm["file"], "module": None,
                                  "short_filename": fm["file"], "line": int(fm["line"]),
                                  "locals": None})
        elif nm := _NATIVE_FRAME.match(line):
            cur["frames"].append({"name": nm["name"], "filename": nm["file"],
                                  "module": nm["file"], "short_filename": nm["file"],
                                  "line": 0, "locals": None})
    for t in threads:
        t["pid"] = pid
    return pid, threads


_CURRENT = re.compile(r"^Current thread (0x[0-9a-fA-F]{1,16}|\d{1,20}) ")


def traceback_threads(text: str, pid: int | None) -> list[dict[str, Any]]:
    """The threads of a ``dump_traceback`` answer (faulthandler text of every thread) as
    py-spy JSON threads, without the server's own handler thread (faulthandler's "Current
    thread", with no Python frame). The main thread is the last one listed (CPython links
    each new thread state first; the handler thread, newest, comes first)."""
    own = {int(m.group(1), 16) if m.group(1).startswith("0x") else int(m.group(1))
           for m in map(_CURRENT.match, text.splitlines()[:4096]) if m}
    dumps = faulthandler_dumps(text, pid or 0, guess_main=False)
    threads = [t for t in (dumps[0] if dumps else []) if t["thread_id"] not in own]
    if threads and not any(t["thread_name"] == "MainThread" for t in threads):
        threads[-1]["thread_name"] = "MainThread"
        threads[-1]["os_thread_id"] = pid
    return threads


def dump(host: str, port: int, *, timeout: float, native: bool = False,
         nonblocking: bool = False) -> tuple[int | None, list[dict[str, Any]], str]:
    """Ask one worker server for its rank's stacks: ``pyspy_dump`` (the pid and threads of a
    py-spy text), else ``dump_traceback`` (faulthandler text, no pid). Returns (pid or None,
    threads, the handler that answered); RouteError with both reasons when neither does."""
    query = "&".join(q for q, on in (("native=1", native), ("nonblocking=1", nonblocking)) if on)
    deadline = time.monotonic() + timeout
    why = ""
    try:
        status, body = post(host, port, "pyspy_dump", query, timeout=timeout)
        text = body.decode(errors="replace")
        if status == 200:
            pid, threads = pyspy_text_threads(text)
            if threads:
                return pid, threads, "pyspy_dump"
            why = "pyspy_dump answered no thread"
        else:
            last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or ["no message"]
            why = f"pyspy_dump failed (HTTP {status}: {last[0][:160]!r})"
    except RouteError as e:
        why = str(e)
        if "refused" in why:
            raise
    left = deadline - time.monotonic()
    if left < 0.5:
        raise RouteError(f"{why}; no time left for dump_traceback")
    try:
        status, body = post(host, port, "dump_traceback", timeout=left)
    except RouteError as e:
        raise RouteError(f"{why}; {e}") from None
    text = body.decode(errors="replace")
    threads = traceback_threads(text, None) if status == 200 else []
    if not threads:
        raise RouteError(f"{why}; dump_traceback answered HTTP {status} without a "
                         f"faulthandler dump ({text.strip()[:120]!r})")
    return None, threads, "dump_traceback"


# -- the route, on a node ---------------------------------------------------------------------
_FLAG = re.compile(r"^--(?P<name>master[-_]addr|master[-_]port|rdzv[-_]endpoint)(?:=(?P<value>.*))?$")


def launcher_stores(pid: int, procs: dict[int, dict[str, Any]]) -> list[tuple[str, int, str]]:
    """Where a launcher's job keeps its TCPStore: MASTER_ADDR/MASTER_PORT of the launcher's
    environment, its --master-addr/--master-port/--rdzv-endpoint, and the TCP ports it listens
    on itself (torchrun --standalone hosts the store on a port of its own choosing)."""
    from mldebug.dist import read_environ

    out: list[tuple[str, int, str]] = []
    label = f"launcher pid {pid}"
    try:
        env = read_environ(pid)
    except OSError:
        env = {}
    if env.get("MASTER_ADDR") and (env.get("MASTER_PORT") or "").isdigit():
        out.append((env["MASTER_ADDR"], int(env["MASTER_PORT"]), f"MASTER_ADDR/PORT of {label}"))
    argv = procs.get(pid, {}).get("cmdline") or []
    flags: dict[str, str] = {}
    for i, a in enumerate(argv[:256]):
        m = _FLAG.match(a)
        if m:
            value = m["value"] if m["value"] is not None else (argv[i + 1] if i + 1 < len(argv)
                                                               else "")
            flags[m["name"].replace("_", "-")] = value
    addr, port = flags.get("master-addr"), flags.get("master-port", "")
    if addr and port.isdigit():
        out.append((addr, int(port), f"--master-addr/--master-port of {label}"))
    ep = flags.get("rdzv-endpoint", "")
    if ep:
        h, _, p = ep.rpartition(":") if ep.count(":") == 1 or ep.startswith("[") else ("", "", "")
        h = h.strip("[]") or ep
        p = p if p.isdigit() else "29400"  # torchrun's default rendezvous port
        if int(p):
            out.append((h, int(p), f"--rdzv-endpoint of {label}"))
    for port_ in listening_ports(pid):
        out.append(("127.0.0.1", port_, f"a port {label} listens on"))
    return out


def _store_of_env(pid: int) -> tuple[str, int] | None:
    from mldebug.dist import read_environ

    try:
        env = read_environ(pid)
    except OSError:
        return None
    port = env.get("MASTER_PORT") or ""
    return (env["MASTER_ADDR"], int(port)) if env.get("MASTER_ADDR") and port.isdigit() else None


def parse_store(value: str) -> tuple[str, int]:
    """``--store HOST:PORT`` (``[v6]:PORT`` for IPv6); ValueError when it is not one."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or \
            not re.fullmatch(r"[A-Za-z0-9._:-]{1,253}", host):
        raise ValueError(f"--store {value!r} is not HOST:PORT")
    return host, int(port)


def answer(targets: list[dict[str, Any]], procs: dict[int, dict[str, Any]], opts: Any,
           host: str, uid: int | None, errors: list[dict[str, Any]],
           hidden: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The debug-server route for every target py-spy could not dump and for the hidden
    ranks (``hidden``: ``mldebug.ranks.hidden_ranks``, which the caller computes first to know
    whether to load this module at all): find the job's TCPStore, read the registrations of
    this node's worker servers, ask each for its rank's stacks. Targets it answers get
    ``dump``, ``route`` = "debug-server", ``route_detail`` (the handler) and lose their py-spy
    error (kept as ``pyspy_error``); ranks found only this way are returned as new targets.
    Store and server failures are one line each in ``errors``, or ``route_error`` on a
    target whose server failed (the caller adds it to that rank's error)."""
    pending = [t for t in targets if t.get("dump") is None]
    explicit = getattr(opts, "store", None)
    if not pending and not hidden:
        return []
    timeout = float(opts.timeout)
    deadline = time.monotonic() + timeout
    # where the job's store is: each rank's environment, else its launcher's, or --store
    stores: dict[tuple[str, int], str] = {}
    tied: dict[int, tuple[str, int]] = {}  # pid -> the store its environment names
    if explicit:
        try:
            stores[parse_store(explicit)] = "--store"
        except ValueError as e:
            errors.append({"pid": None, "error": str(e)})
    launchers: dict[int, str] = {}
    t: dict[str, Any] | None
    for t in pending:
        st = _store_of_env(t["pid"])
        if st is not None:
            tied[t["pid"]] = st
            stores.setdefault(st, f"MASTER_ADDR/PORT of pid {t['pid']}")
        else:
            la = launcher_above(t["pid"], procs)
            if la:
                launchers.setdefault(la[0], la[1])
    for info in hidden.values():
        launchers.setdefault(info["launcher"][0], info["launcher"][1])
    for lpid in sorted(launchers):
        for h, p, src in launcher_stores(lpid, procs):
            stores.setdefault((h, p), src)
    if not stores:
        if pending and any(t.get("identity", {}).get("rank") is None or
                           t["pid"] not in tied for t in pending):
            pass  # nothing tells where the store is: the py-spy errors stand
        return []
    known = [t["identity"].get("rank") for t in pending]
    world = next((t["identity"].get("world_size") for t in pending
                  if t["identity"].get("world_size")), None)
    scan = bool(hidden) or any(r is None for r in known) or bool(explicit)
    addrs = local_addresses()
    urls: dict[tuple[int, tuple[str, int]], tuple[str, int, str]] = {}  # (rank, store) -> url
    registered_any = False
    # every store at once, in half the route's time: the servers get the rest
    store_deadline = time.monotonic() + timeout / 2
    answers: dict[tuple[str, int], Any] = {}

    def ask_store(sh: str, sp: int) -> None:
        mine = [t["identity"].get("rank") for t in pending if tied.get(t["pid"]) == (sh, sp)]
        left = store_deadline - time.monotonic()

        def ask() -> dict[int, str]:
            with StoreClient(sh, sp, timeout=left, deadline=store_deadline) as c:
                wanted = None if scan or any(r is None for r in mine) else mine
                return registrations(c, wanted, world)

        try:
            answers[(sh, sp)] = bounded(ask, left, f"the job's TCPStore at {_hp(sh, sp)}")
        except RouteError as e:
            answers[(sh, sp)] = e

    askers = [threading.Thread(target=ask_store, args=key, daemon=True)
              for key in list(stores)[:MAX_STORES]]
    for a in askers:
        a.start()
    for a in askers:
        a.join(timeout / 2 + 1.0)
    for (sh, sp), src in list(stores.items())[:MAX_STORES]:
        regs = answers.get((sh, sp))
        if regs is None:
            regs = RouteError(f"the job's TCPStore at {_hp(sh, sp)} did not answer in time")
        if isinstance(regs, RouteError):
            # a launcher's other listening ports are not stores: only a named store's failure
            # is worth a line
            if not src.startswith("a port "):
                errors.append({"pid": None, "error": f"debug-server route: {regs} ({src})"})
            continue
        registered_any = registered_any or bool(regs)
        for rank, value in regs.items():
            try:
                uh, up = parse_url(value)
            except RouteError as e:
                errors.append({"pid": None, "error": f"debug-server route: rank {rank} {e}"})
                continue
            if is_local(uh, addrs):
                urls[(rank, (sh, sp))] = (uh, up, value)
    by_rank_store = {(t["identity"].get("rank"), tied.get(t["pid"])): t for t in pending}
    # one store named two ways (--store 127.0.0.1:P, the ranks' MASTER_ADDR 10.0.0.1:P) holds
    # the same registrations: ask each rank's server once, through the store its environment
    # names where one does
    once: dict[tuple[int, str, int], tuple[int, tuple[str, int]]] = {}
    for rank, store in sorted(urls, key=lambda k: (k[0], (k[0], k[1]) not in by_rank_store)):
        once.setdefault((rank, *urls[(rank, store)][:2]), (rank, store))
    urls = {k: urls[k] for k in once.values()}
    if not urls:
        return []
    # which process each local registration is
    allowed = {t["pid"] for t in pending} | set(hidden)
    by_pid = {t["pid"]: t for t in pending}
    jobs: list[dict[str, Any]] = []
    for (rank, store), (uh, up, value) in sorted(urls.items()):
        socks = listening(up)
        if uid is not None:
            mine_socks = [s for s in socks if s[0] == uid]
            if socks and not mine_socks:
                errors.append({"pid": None, "error": f"debug-server route: rank {rank}'s "
                               f"server {value} listens as uid {socks[0][0]}, outside this "
                               "run's selection: not asked"})
                continue
            socks = mine_socks
        if not socks:
            errors.append({"pid": None, "error": f"debug-server route: rank {rank} registered "
                           f"{value}, but nothing listens on port {up} here (the rank exited?)"})
            continue
        target = by_rank_store.get((rank, store))
        pid = target["pid"] if target else pid_of_socket(socks[0][1], sorted(allowed))
        jobs.append({"rank": rank, "store": store, "url": value,
                     "connect": uh if _is_ip(uh) else "127.0.0.1", "port": up, "pid": pid})
    _run_dumps(jobs, opts, deadline)
    new: list[dict[str, Any]] = []
    done: set = set()
    for j in jobs:
        pid = j["pid"]
        if j.get("error"):
            failed = by_pid.get(pid) if pid is not None else None
            msg = f"rank {j['rank']}'s debug server {j['url']}: {j['error']}"
            if failed is not None:
                failed["route_error"] = msg[:400]
            else:
                errors.append({"pid": pid, "error": f"debug-server route: {msg}"[:600]})
            continue
        said = j.get("said_pid")
        if pid is None:
            pid = said
        elif said is not None and said != pid:
            errors.append({"pid": pid, "error": f"debug-server route: rank {j['rank']}'s server "
                           f"{j['url']} dumped pid {said}, not pid {pid} that listens there: "
                           "ignored"})
            continue
        if pid is None:
            errors.append({"pid": None, "error": (
                f"debug-server route: rank {j['rank']} answered through {j['url']}, but which "
                "process it is cannot be told here (no py-spy in the rank for pyspy_dump, and "
                "its /proc/PID/fd is unreadable without ptrace rights): its stacks are left "
                "out. Put py-spy on the ranks' PATH, or run as root with CAP_SYS_PTRACE.")})
            continue
        if pid not in allowed or pid in done:
            errors.append({"pid": pid, "error": f"debug-server route: rank {j['rank']}'s server "
                           f"{j['url']} dumped pid {pid}, which is not a rank process of this "
                           "run's selection here: ignored"})
            continue
        done.add(pid)
        for th in j["threads"]:
            th["pid"] = pid
            if th.get("thread_name") == "MainThread" and th.get("os_thread_id") is None:
                th["os_thread_id"] = pid
        t = by_pid.get(pid)
        if t is None:
            info = hidden[pid]
            lpid, lname = info["launcher"]
            ident = {"rank": j["rank"], "local_rank": None, "world_size": world,
                     "local_world_size": None, "node_rank": None, "launcher": lname,
                     "run_id": None, "host": host}
            sib = next((s for s in pending if tied.get(s["pid"]) == j["store"]), None)
            from mldebug.ranks import job_of

            job = dict(sib["job"]) if sib else job_of({}, host, (lpid, lname))
            t = {k: v for k, v in info.items() if k != "launcher"}
            t.update(identity=ident, has_rank=True, job=job, workers=[])
            new.append(t)
        else:
            if t["identity"].get("rank") is None:
                t["identity"] = dict(t["identity"], rank=j["rank"])
                t["job"] = dict(t.get("job") or {}, lone=False)
            if t.get("error"):
                t["pyspy_error"] = t.pop("error")
        t["dump"], t["route"], t["route_detail"] = j["threads"], ROUTE, j["handler"]
        t["debug_server"] = {"url": j["url"], "connect": j["connect"], "port": j["port"]}
    del registered_any
    if new and getattr(opts, "pid", None) is not None:
        # --pid named the launcher of ranks found only here: its ranks are the targets (as
        # mldebug.ranks.find_ranks does for ranks it can see)
        launchers_of_new = {hidden[t["pid"]]["launcher"][0] for t in new}
        targets[:] = [t for t in targets if not (
            t["pid"] == opts.pid and t["pid"] in launchers_of_new
            and t["identity"].get("rank") is None)]
    return new


def again(targets: list[dict[str, Any]], opts: Any, key: str) -> None:
    """A second round (``--watch``) for the targets the debug server answered."""
    jobs: list[dict[str, Any]] = [{"t": t, "connect": t["debug_server"]["connect"], "port": t["debug_server"]["port"],
             "url": t["debug_server"]["url"], "pid": t["pid"], "rank": None}
            for t in targets if t.get("route") == ROUTE and t.get("debug_server")]
    _run_dumps(jobs, opts, time.monotonic() + float(opts.timeout))
    for j in jobs:
        if not j.get("error"):
            for th in j["threads"]:
                th["pid"] = j["pid"]
            j["t"][key] = j["threads"]


def _is_ip(host: str) -> bool:
    for fam in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(fam, host)
            return True
        except OSError:
            continue
    return False


def _run_dumps(jobs: list[dict[str, Any]], opts: Any, deadline: float) -> None:
    """Ask every server at once (at most 16 at a time), each bounded by what is left."""
    def one(j: dict[str, Any]) -> None:
        left = deadline - time.monotonic()
        if left <= 0.2:
            j["error"] = "no time left to ask it"
            return
        def ask(j: dict[str, Any] = j, left: float = left) -> Any:
            kw = {"native": bool(getattr(opts, "native", False)),
                  "nonblocking": bool(getattr(opts, "nonblocking", False))}
            try:
                return dump(j["connect"], j["port"], timeout=left, **kw)
            except RouteError as e:
                # a server bound to IPv6 only (bindv6only=1): its loopback is ::1
                if j["connect"] != "127.0.0.1" or "refused" not in str(e):
                    raise
                j["connect"] = "::1"
                return dump("::1", j["port"], timeout=deadline - time.monotonic(), **kw)

        try:
            j["said_pid"], j["threads"], j["handler"] = bounded(
                ask, left, f"the debug server at {j['url']}")
        except RouteError as e:
            j["error"] = str(e)

    for_each(jobs, one, 16)
