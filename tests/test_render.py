"""The shared console: piped output is never wrapped, NO_COLOR removes every style."""

from __future__ import annotations

import io
import os
import pty

from rich.text import Text

from mldebug.render import console


def test_piped_output_is_never_wrapped():
    buf = io.StringIO()
    console(buf).print(Text("node1 " + "x" * 400, style="bold"))
    assert buf.getvalue() == "node1 " + "x" * 400 + "\n"


def _terminal_output(monkeypatch, no_color: bool) -> bytes:
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    master, slave = pty.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            console(tty).print(Text("bold", style="bold"), Text("dim", style="dim"),
                               Text("red", style="red"))
            tty.flush()
        return os.read(master, 4096)
    finally:
        os.close(master)
        os.close(slave)


def test_no_color_removes_bold_and_dim_too(monkeypatch):
    assert b"\x1b[" in _terminal_output(monkeypatch, no_color=False)
    plain = _terminal_output(monkeypatch, no_color=True)
    assert b"\x1b[" not in plain and b"bold" in plain and b"dim" in plain


def _read_all(fd: int) -> bytes:
    """Everything written to a pty so far (one read may return only part of it)."""
    import select

    out = b""
    while select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out


def test_fanout_progress_counts_and_draws_only_on_a_terminal(monkeypatch):
    from mldebug.progress import fanout_progress

    buf = io.StringIO()
    with fanout_progress(3, buf) as progress:
        progress("node1", True)
        progress("node2", False)
    assert (progress.answered, progress.failed) == (2, 1) and buf.getvalue() == ""
    monkeypatch.delenv("NO_COLOR", raising=False)
    master, slave = pty.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            with fanout_progress(3, tty) as progress:
                progress("node1", True)
                progress("node2", False)
            tty.flush()
        drawn = _read_all(master)
    finally:
        os.close(master)
        os.close(slave)
    assert b"nodes answered (1 failed)" in drawn and b"2/3" in drawn
