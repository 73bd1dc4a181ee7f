"""pdb served on 127.0.0.1 for a rank that has no terminal.

``RemotePdb`` is a Pdb whose input and output are a ``Channel``: a listening socket on
127.0.0.1 (random port), a registration with a random token in the user's private directory
(``registry``), and one authenticated client at a time (``mldebug pdb connect``). Until a
client attaches, and after it detaches, the rank stays stopped: pdb never sees end-of-file,
so it can never quit the program. ``c`` (or ``q``, which here means the same) ends the session
and the rank runs on. Wrong tokens are refused and logged on the rank's stderr.
"""

from __future__ import annotations

import hmac
import json
import os
import pdb as _pdb
import queue
import rlcompleter
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from mldebug.debugger import registry, wire
from mldebug.dist import Identity, identity

AUTH_TIMEOUT_S = 5.0


def log(text: str) -> None:
    """A line on the rank's own stderr (the job log): whole, never interleaved by us."""
    try:
        sys.__stderr__.write(text + "\n")  # type: ignore[union-attr]
        sys.__stderr__.flush()  # type: ignore[union-attr]
    except (OSError, AttributeError, ValueError):
        pass


def session_doc(kind: str, ident: Identity, port: int, token: str,
                frame: FrameType | None) -> dict[str, Any]:
    """The registration of a session of this process stopped in ``frame``."""
    code = frame.f_code if frame is not None else None
    return {
        "format": registry.FORMAT, "kind": kind, "host": ident.host,
        "pid": os.getpid(), "start": registry.process_start(os.getpid()),
        "rank": ident.rank, "local_rank": ident.local_rank,
        "world_size": ident.world_size, "run_id": ident.run_id,
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "port": port, "token": token,
        "file": code.co_filename if code else None,
        "line": frame.f_lineno if frame is not None else None,
        "function": code.co_name if code else None,
        "updated": registry.now(),
    }


def label(ident: Identity) -> str:
    """How a message names this process: ``rank 2 on node1 (pid 4242)``."""
    who = f"rank {ident.rank}" if ident.rank is not None else "process"
    return f"{who} on {ident.host} (pid {os.getpid()})"


class Channel:
    """pdb's stdin and stdout, served to one authenticated client at a time."""

    def __init__(self, token: str, on_attach: Callable[[], None],
                 complete: Callable[[dict[str, Any]], list[str]], label: str) -> None:
        self.token = token
        self.label = label
        self._on_attach = on_attach
        self._complete = complete
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = int(self.listener.getsockname()[1])
        self._client: wire.Sender | None = None
        self._lines: queue.Queue[str] = queue.Queue()
        self._held = ""  # output after the last newline: the prompt, until pdb reads
        self._prompt: str | None = None  # the prompt pdb is waiting at, for a late client
        # lines the client sent that pdb has not started yet, and a Ctrl-C meant for them;
        # read and changed under _state (see _interrupt)
        self._state = threading.RLock()
        self._waiting = 0
        self._interrupt_pending = False
        self._raised_at: float | None = None  # when a Ctrl-C was raised in the running command
        self._closed = threading.Event()
        self._attach_lock = threading.Lock()
        self._thread = threading.get_ident()  # the thread pdb runs in: Ctrl-C is raised there
        threading.Thread(target=self._accept_loop, name="mldebug-pdb-accept", daemon=True).start()

    # -- pdb's side ------------------------------------------------------------------
    def write(self, text: str) -> int:
        self._held += text
        return len(text)

    def flush(self) -> None:
        out, nl, rest = self._held.rpartition("\n")
        if nl:
            self._held = rest
            self._send("O", out + nl)

    def readline(self) -> str:
        prompt, self._held = self._held, ""
        with self._state:
            self._prompt = prompt
            self._raised_at = None
        self._send("P", prompt)
        try:
            while True:
                try:
                    line = self._lines.get(timeout=0.5)
                except queue.Empty:
                    continue
                with self._state:  # the command starts now: a Ctrl-C from here on runs it
                    self._waiting -= 1
                    self._prompt = None
                    pending, self._interrupt_pending = self._interrupt_pending, False
                if pending:  # Ctrl-C came after the line, before pdb took it: as in a local
                    raise KeyboardInterrupt  # pdb, the command stops (pdb: --KeyboardInterrupt--)
                return line + "\n"
        finally:
            self._prompt = None

    def isatty(self) -> bool:
        return False

    def _send(self, kind: str, text: str) -> None:
        client = self._client
        if client is not None:
            client.send(kind, text)

    def close(self, message: str) -> None:
        """End the session: tell the client, stop listening."""
        self.flush()
        if self._held:
            self._send("O", self._held + "\n")
            self._held = ""
        self._send("E", message)
        with self._state:  # no Ctrl-C is raised in the rank once the session has ended
            self._closed.set()
        client, self._client = self._client, None
        for sock in ([client.sock] if client else []) + [self.listener]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    # -- the network side ------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                             name="mldebug-pdb-client").start()

    def _authenticate(self, conn: socket.socket, peer: Any) -> bool:
        conn.settimeout(AUTH_TIMEOUT_S)
        try:
            frame = wire.recv(conn)
        except (OSError, wire.FrameError):
            frame = None
        conn.settimeout(None)
        if frame is None or frame[0] != "A":
            reason = "no token"
        elif not hmac.compare_digest(frame[1].encode(), self.token.encode()):
            reason = "wrong token"
        else:
            return True
        log(f"mldebug.breakpoint: {self.label} refused a connection from "
             f"{peer[0]}:{peer[1]} on 127.0.0.1:{self.port}: {reason}")
        wire.Sender(conn).send("R", f"refused: {reason}")
        return False

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        with conn:
            if not self._authenticate(conn, peer):
                return
            sender = wire.Sender(conn)
            with self._attach_lock:
                busy = self._client is not None or self._closed.is_set()
                if not busy:
                    self._client = sender
            if busy:
                sender.send("R", "another client is attached to this session")
                return
            try:
                sender.send("O", f"mldebug: attached to {self.label}. Ctrl-D detaches (the "
                                 f"rank stays stopped), 'c' continues the rank.\n")
                prompt = self._prompt
                if prompt is not None:  # pdb waits at its prompt: show where it stands
                    self._on_attach()
                    sender.send("P", prompt)
                self._read(conn, sender)
            finally:
                if self._client is sender:
                    self._client = None

    def _read(self, conn: socket.socket, sender: wire.Sender) -> None:
        while not self._closed.is_set():
            try:
                frame = wire.recv(conn)
            except (OSError, wire.FrameError):
                return
            if frame is None or frame[0] == "D":
                return
            kind, text = frame
            if kind == "L":
                self._put_line(text.rstrip("\r\n"))
            elif kind == "I":
                self._interrupt(sender)
            elif kind == "C":
                try:
                    matches = self._complete(json.loads(text))
                except Exception:  # a completer must never break the session
                    matches = []
                sender.send("c", json.dumps(matches[:500]))

    def _put_line(self, line: str) -> None:
        with self._state:
            self._waiting += 1
            self._lines.put(line)

    def _interrupt(self, sender: wire.Sender) -> None:
        """Ctrl-C from the client: as a local Ctrl-C would, while a command runs. One that
        arrives after a line was sent but before pdb started it (a loaded node) stops that
        command; at an idle prompt the client handles it and nothing runs here."""
        with self._state:
            if self._closed.is_set():  # 'c' ran: the rank is back in its own code
                return
            if self._prompt is not None:
                if self._waiting > 0:
                    self._interrupt_pending = True
                return
            now = time.monotonic()
            if self._raised_at is not None and now - self._raised_at < INTERRUPT_GAP:
                return  # a second press: it could land in pdb's own KeyboardInterrupt handler
            raised = _raise_keyboard_interrupt(self._thread)
            if raised:
                self._raised_at = now
        if not raised:
            sender.send("O", "mldebug: the session's thread has ended; nothing to interrupt\n")


# seconds after a Ctrl-C was raised in a command during which another is dropped: pdb prints
# --KeyboardInterrupt-- in an except clause, and a second KeyboardInterrupt raised there would
# leave pdb and end the rank (a command that catches the first can still be interrupted later)
INTERRUPT_GAP = 1.0


def _raise_keyboard_interrupt(thread_id: int) -> bool:
    """KeyboardInterrupt in thread ``thread_id`` at its next Python instruction (a blocking C
    call ends first). Not a signal: the job's own SIGINT handler (a graceful shutdown, say)
    is not called, and a SIGINT the job ignores (a batch launch) does not stop it;
    ``_thread.interrupt_main`` would do the first, and nothing in the second case."""
    import ctypes

    set_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
    set_exc.restype = ctypes.c_int
    n = set_exc(thread_id, KeyboardInterrupt)
    if n > 1:  # never for one id; the documented undo if it happens
        set_exc(thread_id, ctypes.py_object())
    return n == 1


class RemotePdb(_pdb.Pdb):
    """pdb over a ``Channel``; registers itself while open. ``on_continue`` runs once at the end."""

    def __init__(self, *, kind: str = "pdb", directory: str | None = None,
                 on_continue: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self.ident = identity()
        self.directory = registry.private_dir(directory)
        self.token = registry.new_token()
        self.label = label(self.ident)
        self.channel = Channel(self.token, self._replay, self.remote_complete, self.label)
        super().__init__(stdin=self.channel, stdout=self.channel, nosigint=True)  # type: ignore[arg-type]
        self.use_rawinput = False
        self._on_continue = on_continue
        self._registration: str | None = None
        self._done = False

    # -- registration ----------------------------------------------------------------
    def connect_command(self) -> str:
        return f"mldebug pdb connect {self.ident.host}:{self.channel.port}"

    def interaction(self, frame: FrameType | None, tb: Any, *args: Any,  # type: ignore[override]
                    **kwargs: Any) -> None:
        where = frame
        if where is None and isinstance(tb, TracebackType):
            last = tb
            while last.tb_next is not None:
                last = last.tb_next
            where = last.tb_frame
        doc = session_doc(self.kind, self.ident, self.channel.port, self.token, where)
        first = self._registration is None
        try:
            self._registration = registry.write(self.directory, doc)
        except (registry.RegistryError, OSError) as e:
            # a debugger must never end the rank: without a registration nobody can connect
            log(f"mldebug.breakpoint: {self.label} cannot register its session ({e}); "
                + ("continuing without a debugger." if first else "the session stays open."))
            if first:
                self.set_continue()
                return
        if first:
            at = f"{os.path.basename(doc['file'] or '?')}:{doc['line']}"
            what = "post-mortem at" if self.kind == "post-mortem" else "stopped at"
            log(f"mldebug.breakpoint: {self.label} {what} {at}, waiting for a debugger: "
                 f"{self.connect_command()}")
        super().interaction(frame, tb, *args, **kwargs)

    def _replay(self) -> None:
        """What a client attaching at a prompt must see first: where the rank stands."""
        if self.stack and 0 <= self.curindex < len(self.stack):
            self.print_stack_entry(self.stack[self.curindex])
        self.channel.flush()

    # -- the end of the session --------------------------------------------------------
    def finish(self, message: str) -> None:
        if self._done:
            return
        self._done = True
        self.channel.close(message)
        if self._registration is not None:
            registry.remove(self._registration)
        callback, self._on_continue = self._on_continue, None
        if callback is not None:
            callback()

    def set_continue(self) -> None:
        super().set_continue()
        self.finish(f"{self.label} continues; session closed.")

    def set_quit(self) -> None:
        # A remote 'q' must not raise BdbQuit in a rank: it would kill a job nobody can see.
        self.message("mldebug: 'q' does not stop a rank; it continues (as 'c').")
        self.set_continue()

    def do_EOF(self, arg: str) -> bool | None:  # never reached (readline never returns '')
        self.set_continue()
        return 1  # type: ignore[return-value]

    # -- completion on the rank's side -------------------------------------------------
    def remote_complete(self, req: dict[str, Any]) -> list[str]:
        """Completions of ``text`` in ``line`` from pdb's commands and the current frame."""
        text, line = str(req.get("text", "")), str(req.get("line", ""))
        begidx = int(req.get("begidx", 0))
        matches: list[str] = []
        if begidx == 0 or not line[:begidx].strip():
            matches = [n for n in self.completenames(text, line, begidx, begidx + len(text))]
        cmd = line.split(None, 1)[0] if line.strip() else ""
        if begidx > 0:
            compfunc = getattr(self, "complete_" + cmd, None)
            if compfunc is not None and cmd not in ("p", "pp", "print", "display"):
                try:
                    matches += list(compfunc(text, line, begidx, begidx + len(text)))
                except Exception:
                    pass
        if self.curframe is not None and (begidx > 0 or not matches):
            ns = {**self.curframe.f_globals, **self.curframe_locals}
            comp = rlcompleter.Completer(ns)
            for state in range(500):
                m = comp.complete(text, state)
                if m is None:
                    break
                matches.append(m)
        return sorted(set(matches))
