"""The debugger session protocol: typed, length-prefixed frames over one TCP connection.

A frame is one kind byte, a 4-byte big-endian length and that many UTF-8 bytes. Client to
rank: ``A`` token (first frame, else refused), ``L`` an input line, ``I`` interrupt (Ctrl-C),
``C`` a completion request (JSON), ``D`` detach. Rank to client: ``O`` output, ``P`` the
prompt (the rank waits for a line), ``c`` completions (JSON list), ``E`` the session ended
(the rank continued), ``R`` refused. Stdlib only: it runs in ranks and on nodes.
"""

from __future__ import annotations

import socket
import struct
import threading

MAX_FRAME = 1 << 20  # no message of a pdb session comes near this; bound what a peer can send
HEADER = struct.Struct(">cI")


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def _exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[str, str] | None:
    """The next frame as (kind, text); None when the peer closed the connection."""
    head = _exact(sock, HEADER.size)
    if head is None:
        return None
    kind, size = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes is larger than {MAX_FRAME}")
    body = _exact(sock, size) if size else b""
    if body is None:
        return None
    return kind.decode("latin-1"), body.decode("utf-8", errors="replace")


class Sender:
    """Frames written whole from several threads (the pdb thread and the session thread)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, kind: str, text: str = "") -> bool:
        """Send one frame; False when the peer is gone."""
        body = text.encode("utf-8", errors="replace")
        try:
            with self._lock:
                self.sock.sendall(HEADER.pack(kind.encode("latin-1"), len(body)) + body)
        except OSError:
            return False
        return True
