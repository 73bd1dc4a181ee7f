"""The terminal side of a remote pdb session (``mldebug pdb connect``).

It runs where the session's registration is readable - on the rank's node, as the rank's
user - either in the ``mldebug`` process (same host) or as a script sent over ``ssh -t`` to
the node (stdlib only), so no port is ever opened beyond 127.0.0.1. Line editing, history and
tab completion come from readline; completions are computed by the rank in its own frame.
Ctrl-C while a command runs is sent to the rank as an interrupt; at the prompt it clears the
line. Ctrl-D detaches and leaves the rank stopped, connectable again.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import threading
from typing import Any

from mldebug.debugger import registry, wire

HISTORY = os.path.expanduser("~/.mldebug_pdb_history")


class Terminal:
    """Input with readline when there is a terminal; completion asks the rank."""

    def __init__(self, sender: wire.Sender, sock: socket.socket) -> None:
        self.sender = sender
        self.sock = sock
        self.readline: Any = None
        if sys.stdin.isatty():
            try:
                import readline
            except ImportError:  # pragma: no cover - readline is in every CPython on Linux
                return
            self.readline = readline
            readline.set_completer_delims(" \t\n`~!@#$%^&*()=+[{]}\\|;:'\",<>/?")
            readline.set_completer(self.complete)
            readline.parse_and_bind("tab: complete")
            try:
                readline.read_history_file(HISTORY)
            except OSError:
                pass
        self._matches: list[str] = []

    def complete(self, text: str, state: int) -> str | None:
        if state == 0:
            rl = self.readline
            line = rl.get_line_buffer()
            req = {"text": text, "line": line, "begidx": rl.get_begidx(), "endidx": rl.get_endidx()}
            self._matches = []
            if self.sender.send("C", json.dumps(req)):
                try:
                    frame = wire.recv(self.sock)
                except (OSError, wire.FrameError):
                    frame = None
                if frame is not None and frame[0] == "c":
                    self._matches = [str(m) for m in json.loads(frame[1])]
        return self._matches[state] if state < len(self._matches) else None

    def save(self) -> None:
        if self.readline is not None:
            try:
                fd = os.open(HISTORY, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                os.close(fd)
                self.readline.set_history_length(2000)
                self.readline.write_history_file(HISTORY)
            except OSError:
                pass


def run(port: int, token: str, *, reconnect_hint: str = "") -> int:
    """Talk to the session on 127.0.0.1:``port``; returns an exit code."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as e:
        print(f"mldebug pdb: cannot reach the session on 127.0.0.1:{port} ({e.strerror}); the "
              "rank has continued or exited (mldebug pdb list shows the open sessions)",
              file=sys.stderr)
        return 1
    sock.settimeout(None)
    ctrl_c = _CtrlC()  # before the first frame: from here on, Ctrl-C is for the rank
    sender = wire.Sender(sock)
    sender.send("A", token)
    term = Terminal(sender, sock)
    out = sys.stdout
    partial = ""
    try:
        while True:
            if not ctrl_c.wait(sock):
                sender.send("I")
                out.write("^C\n")
                out.flush()
                continue
            frame = wire.recv(sock)
            if frame is None:
                out.write(partial + "\nmldebug pdb: the session closed the connection\n")
                return 1
            kind, text = frame
            if kind == "O":
                out.write(partial + text)
                partial = ""
                out.flush()
            elif kind == "P":
                line = _read_line(partial + text, ctrl_c)
                partial = ""
                if line is None:
                    sender.send("D")
                    hint = f": {reconnect_hint}" if reconnect_hint else ""
                    out.write(f"\nmldebug pdb: detached; the rank stays stopped (reconnect"
                              f"{hint})\n")
                    return 0
                sender.send("L", line)
            elif kind == "E":
                out.write(partial + f"mldebug pdb: {text}\n")
                return 0
            elif kind == "R":
                print(f"mldebug pdb: the session {text}", file=sys.stderr)
                return 1
    finally:
        ctrl_c.close()
        term.save()
        sock.close()


class _CtrlC:
    """Ctrl-C is how a remote command is stopped. While a command runs, a SIGINT is counted by
    a handler that never raises, so it cannot land between two statements of this loop (an
    output write, a send) and end the session: it wakes the wait for the next frame through
    a wakeup socket and is sent to the rank as one interrupt frame. At the prompt the handler
    raises KeyboardInterrupt, as usual (it clears the line), and a press counted after the
    command ended is dropped: the command it was meant for is over. A SIGINT this process
    inherited as ignored (a background job, a batch script) counts too when there is a
    terminal: a person pressed it. Off the main thread, or ignored with no terminal, SIGINT
    keeps the disposition it had."""

    def __init__(self) -> None:
        self.pending = 0
        self.at_prompt = False  # set only inside _read_line's try: there it raises
        self._old: Any = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._old_fd = -1
        if threading.current_thread() is not threading.main_thread():
            return
        old = signal.getsignal(signal.SIGINT)
        if old is signal.SIG_IGN and not sys.stdin.isatty():
            return
        r, w = socket.socketpair()
        r.setblocking(False)
        w.setblocking(False)
        self._wake = (r, w)
        self._old = old
        self._old_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, self._count)

    def _count(self, signum: int, frame: Any) -> None:
        if self.at_prompt:
            raise KeyboardInterrupt
        self.pending += 1

    def _drain(self) -> None:
        if self._wake is not None:
            try:
                while self._wake[0].recv(4096):
                    pass
            except OSError:
                pass

    def wait(self, sock: socket.socket) -> bool:
        """True when a frame can be read; False for a Ctrl-C to send (counted once)."""
        if self._wake is None:
            return True  # no handler of ours: SIGINT does what it did before
        poll = select.poll()  # not select(): a descriptor past 1024 is fine
        poll.register(sock, select.POLLIN)
        poll.register(self._wake[0], select.POLLIN)
        while True:
            if self.pending:
                self.pending -= 1
                return False
            ready = {fd for fd, _ in poll.poll()}
            if self._wake[0].fileno() in ready:
                self._drain()
            if sock.fileno() in ready and not self.pending:
                return True

    def close(self) -> None:
        if self._wake is None:
            return
        signal.signal(signal.SIGINT, self._old)
        signal.set_wakeup_fd(self._old_fd)
        for s in self._wake:
            s.close()
        self._wake = None


def _read_line(prompt: str, ctrl_c: _CtrlC) -> str | None:
    """One input line; None on Ctrl-D. Ctrl-C at the prompt starts a fresh line, as in pdb."""
    ctrl_c.pending = 0
    while True:
        try:
            ctrl_c.at_prompt = True  # inside the try: a press raises only where it is caught
            try:
                return input(prompt)
            finally:
                ctrl_c.at_prompt = False
        except KeyboardInterrupt:
            sys.stdout.write("\n--KeyboardInterrupt--\n")
        except EOFError:
            return None


def main(argv: list[str] | None = None) -> int:
    """Run on the node: find the session by port/rank/pid in the private dir and connect."""
    p = argparse.ArgumentParser(prog="mldebug-pdb-client")
    p.add_argument("--dir", help="session directory (default: /tmp/mldebug-pdb-UID)")
    p.add_argument("--port", type=int)
    p.add_argument("--rank", type=int)
    p.add_argument("--pid", type=int)
    args = p.parse_args(argv)
    try:
        doc = registry.find(args.dir, port=args.port, rank=args.rank, pid=args.pid)
    except (registry.RegistryError, OSError) as e:
        print(f"mldebug pdb: {e}", file=sys.stderr)
        return 1
    return run(doc["port"], doc["token"],
               reconnect_hint=f"mldebug pdb connect {doc['host']}:{doc['port']}")


if __name__ == "__main__":
    sys.exit(main())
