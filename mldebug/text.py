"""Outside text made safe to print on a terminal.

Frame names, file names, host names, log lines, node stderr, NCCL WARN text and environment
values come from other programs and other users. Printed raw, an ESC sequence among them can
clear root's screen, rewrite its title or write its clipboard (OSC 52). ``sanitize`` shows
every C0/C1 control and ESC escaped (``\\x1b``, ``\\x9b``), keeps tabs, and - for one-line
fields - newlines escaped too. Rich, plain and ``--markdown`` output go through it; ``--json``
keeps the exact text (JSON escapes controls itself).

Stdlib only (node scripts may bundle it).
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls but TAB (and LF, CR where kept), DEL, C1 controls; line/paragraph separators and
# bidi overrides, which reorder what a reader sees
# Bytes a text log never holds (not \t \n \r \f \v ESC): a file with many is binary. NUL is
# apart: a block of NULs is a crashed node's unwritten pages in a text log, dropped by every
# reader of text (log, nccl-log, hang analyze) with a note, never a reason to refuse the file.
CONTROL_BYTES = re.compile(rb"[\x01-\x08\x0e-\x1a\x1c-\x1f]")


def drop_nuls(data: bytes) -> tuple[bytes, int]:
    """``data`` without its NUL bytes, and how many there were."""
    n = data.count(b"\x00")
    return (data.replace(b"\x00", b""), n) if n else (data, 0)


_UNSAFE_LINE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def sanitize(value: Any, *, multiline: bool = False, limit: int | None = None) -> str:
    """``value`` as printable text: controls and ESC shown escaped (``\\x1b``), newlines kept only
    with ``multiline``; cut to ``limit`` characters (with an ellipsis) when given."""
    s = value if isinstance(value, str) else str(value)
    if limit is not None and len(s) > limit:
        s = s[:limit] + "…"
    rx = _UNSAFE_TEXT if multiline else _UNSAFE_LINE
    if rx.search(s) is None:  # the common case costs one scan
        return s
    if multiline:
        s = s.replace("\r\n", "\n")
    return rx.sub(_escape, s)


def is_clean(value: str) -> bool:
    """Whether ``value`` prints as itself (no control, ESC or reordering character)."""
    return _UNSAFE_LINE.search(value) is None
