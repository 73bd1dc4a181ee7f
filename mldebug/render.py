"""Output helpers shared by every command: a console that honours NO_COLOR, JSON output."""

from __future__ import annotations

import json
import os
import sys
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


# Width given to rich when output is piped: wide enough that no line is ever cut or wrapped
# (a continuation line would break grep), and tables are only as wide as their content.
PIPE_WIDTH = 100_000


def console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A rich console: styled on a terminal; plain when NO_COLOR is set (no colour, bold or
    dim: https://no-color.org asks for no ANSI styling) or when piped (then never wrapped)."""
    from rich.console import Console

    out = file if file is not None else (sys.stderr if stderr else sys.stdout)
    tty = hasattr(out, "isatty") and out.isatty()
    return Console(
        file=file,
        stderr=stderr,
        no_color="NO_COLOR" in os.environ,
        color_system="auto" if tty and "NO_COLOR" not in os.environ else None,
        highlight=False,
        soft_wrap=not tty,
        width=None if tty else PIPE_WIDTH,
    )


def print_json(data: Any, file: IO[str] | None = None) -> None:
    """Write one JSON document (indented, stable key order as built) and a newline."""
    out = file or sys.stdout
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
        out.write("".join("".join(text for text, _ in line) + "\n" for line in lines))
        out.flush()
        return
    from rich.text import Text

    con = console(out)
    for line in lines:
        t = Text()
        for text, style in line:
            t.append(text, style=style or None)
        con.print(t)
