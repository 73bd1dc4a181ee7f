"""The CLI's argparse parser: did-you-mean for a mistyped option or subcommand at every level
(``mldebug hang --jsno``, ``mldebug log --world_size``, ``mldebug fr analyse``), with the usage
of the command the mistake belongs to. Subparsers inherit the class (argparse's
``add_subparsers`` makes its parsers of the parent's type)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import NoReturn

_CHOICE = re.compile(r"invalid choice: '?(?P<bad>[^'()]*?)'? \(choose from (?P<choices>.*)\)$")
_UNKNOWN = "unrecognized arguments: "


class Parser(argparse.ArgumentParser):
    argv: list[str] = []  # set on the top parser by mldebug.cli._main (for unknown options)

    def error(self, message: str) -> NoReturn:
        where: argparse.ArgumentParser = self
        hint, lists = "", "its options"
        if message.startswith(_UNKNOWN):
            where = innermost(self, self.argv)
            hint = option_hint(where, message[len(_UNKNOWN):].split())
        elif m := _CHOICE.search(message):
            choices = [c.strip().strip("'\"") for c in m["choices"].split(",")]
            close = difflib.get_close_matches(m["bad"], choices, n=1, cutoff=0.6)
            if close:
                hint, lists = f"Did you mean '{self.prog} {close[0]}'?", "them"
        where.print_usage(sys.stderr)
        self.exit(2, f"{where.prog}: error: {message}\n"
                  + (f"  {hint} '{where.prog} --help' lists {lists}.\n" if hint else ""))


def innermost(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the deepest (sub)command ``argv`` names (``fr analyze``'s for
    ``fr analyze --jsno x``), before any ``--``."""
    p = parser
    for a in argv:
        if a == "--":
            break
        sub = next((x for x in p._actions if isinstance(x, argparse._SubParsersAction)), None)
        if sub is not None and not a.startswith("-") and a in sub.choices:
            p = sub.choices[a]
    return p


def option_hint(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """'Did you mean --world-size?' for the first unknown option with a close match."""
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for u in unknown:
        if not u.startswith("--"):
            continue
        name = u.split("=", 1)[0]
        dashed = name[:2] + name[2:].replace("_", "-")
        if dashed in known:
            close = [dashed]
        else:
            close = difflib.get_close_matches(dashed, [k for k in known if k != "--help"], n=1,
                                              cutoff=0.75)
        if close:
            return f"Did you mean {close[0]} (for {name})?"
    return ""
