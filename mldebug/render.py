"""Output helpers shared by every command: a console that honours NO_COLOR, JSON output, and
the one place outside text is made safe to print.

Frame names, file names, hosts, log lines, node stderr and env values come from other
programs and other users; an ESC sequence among them (screen clear, OSC 52 clipboard write)
must never reach a terminal. Two choke points hold that for every command:

- ``safe_stdio`` (the CLI wraps each command in it) passes everything written to
  ``sys.stdout``/``sys.stderr`` through ``mldebug.text.sanitize`` (newlines and tabs kept):
  plain text, ``--markdown``, ``print``; and, unless ``--show-secrets``, through
  ``mldebug.redact.redact_text`` (URL passwords, token shapes). JSON is unaffected: ``print_json`` writes escaped
  text (``\u001b``), exact once decoded.
- ``console`` returns a rich console whose text segments are sanitized the same way, while its
  own styling (colour, the progress bar's cursor moves) goes to the real stream.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from mldebug.text import sanitize

if TYPE_CHECKING:
    from rich.console import Console


# Width given to rich when output is piped: wide enough that no line is ever cut or wrapped
# (a continuation line would break grep), and tables are only as wide as their content.
PIPE_WIDTH = 100_000


def console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A rich console: styled on a terminal; plain when NO_COLOR is set (no colour, bold or
    dim: https://no-color.org asks for no ANSI styling) or when piped (then never wrapped)."""
    out = raw_stream(file if file is not None else (sys.stderr if stderr else sys.stdout))
    tty = hasattr(out, "isatty") and out.isatty()
    return _safe_console_class()(
        file=file,
        stderr=stderr,
        no_color="NO_COLOR" in os.environ,
        color_system="auto" if tty and "NO_COLOR" not in os.environ else None,
        highlight=False,
        soft_wrap=not tty,
        width=None if tty else PIPE_WIDTH,
    )


_SAFE_CONSOLE: Any = None


def _safe_console_class() -> Any:
    """rich's Console with every text segment sanitized just before it is written (styles and
    control segments - colour, cursor moves - pass as they are)."""
    global _SAFE_CONSOLE
    if _SAFE_CONSOLE is None:
        from rich.console import Console
        from rich.segment import Segment

        class SafeConsole(Console):
            @property  # type: ignore[override]
            def file(self) -> IO[str]:
                return raw_stream(Console.file.fget(self))  # type: ignore[attr-defined]

            @file.setter
            def file(self, new_file: IO[str]) -> None:
                Console.file.fset(self, new_file)  # type: ignore[attr-defined]

            def _render_buffer(self, buffer: Iterable[Segment]) -> str:
                wrapped = Console.file.fget(self)  # type: ignore[attr-defined]
                if isinstance(wrapped, SafeStream) and wrapped.redact:
                    from mldebug.redact import redact_text
                else:
                    def redact_text(text: str) -> str:
                        return text
                return super()._render_buffer(
                    seg if seg.control or not seg.text else
                    Segment(sanitize(redact_text(seg.text), multiline=True), seg.style,
                            seg.control)
                    for seg in buffer)

        _SAFE_CONSOLE = SafeConsole
    return _SAFE_CONSOLE


class SafeStream:
    """A text stream that writes ``sanitize(text, multiline=True)`` of everything written to it
    to the stream it wraps (``raw``); every other attribute is the wrapped stream's."""

    def __init__(self, raw: IO[str], redact: bool = False) -> None:
        self.raw = raw
        self.redact = redact

    def write(self, s: str) -> int:
        if self.redact:
            from mldebug.redact import redact_text

            self.raw.write(sanitize(redact_text(s), multiline=True))
        else:
            self.raw.write(sanitize(s, multiline=True))
        return len(s)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def raw_stream(f: Any) -> Any:
    """The stream under a ``SafeStream`` (for writers that sanitize themselves: rich, JSON)."""
    while isinstance(f, SafeStream):
        f = f.raw
    return f


@contextmanager
def safe_stdio(enabled: bool = True, *, redact: bool = False) -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` wrapped in ``SafeStream`` for the block; ``redact``:
    URL passwords and token shapes in anything printed are replaced too (``mldebug.redact``)."""
    if not enabled:
        yield
        return
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout = SafeStream(old_out, redact)  # type: ignore[assignment]
    sys.stderr = SafeStream(old_err, redact)  # type: ignore[assignment]
    try:
        yield
    finally:
        if isinstance(sys.stdout, SafeStream) and sys.stdout.raw is old_out:
            sys.stdout = old_out
        if isinstance(sys.stderr, SafeStream) and sys.stderr.raw is old_err:
            sys.stderr = old_err


def print_json(data: Any, file: IO[str] | None = None) -> None:
    """Write one JSON document (indented, stable key order as built) and a newline."""
    out = raw_stream(file or sys.stdout)  # json escapes every control itself
    json.dump(data, out, indent=2, default=_default)
    out.write("\n")
    out.flush()


def _default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def fold_ints(values: Any) -> str:
    """Fold integers into ranges: [0,1,2,3,5,7,8] -> '0-3,5,7-8'."""
    nums = sorted(set(int(v) for v in values))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(parts)


Segment = tuple[str, str]  # (text, rich style)
Line = list[Segment]


def use_color(file: IO[str] | None = None) -> bool:
    """Styled output only for a terminal, and never with NO_COLOR set."""
    out = file if file is not None else sys.stdout
    return "NO_COLOR" not in os.environ and hasattr(out, "isatty") and out.isatty()


def write_lines(lines: list[Line], file: IO[str] | None = None, *,
                color: bool | None = None) -> None:
    """Print styled lines: through rich on a terminal, as plain text otherwise.

    Plain text skips importing rich (tens of milliseconds), which matters for commands that
    are run in loops or piped, and never wraps lines, which keeps files greppable.
    """
    out = file if file is not None else sys.stdout
    if not (use_color(out) if color is None else color):
        out.write(sanitize("".join("".join(text for text, _ in line) + "\n" for line in lines),
                           multiline=True))
        out.flush()
        return
    from rich.text import Text

    con = console(out)
    for line in lines:
        t = Text()
        for text, style in line:
            t.append(text, style=style or None)
        con.print(t)
