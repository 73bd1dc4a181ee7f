"""mldebug docs: print a documentation page from the installed package."""

from __future__ import annotations

import argparse
from pathlib import Path

from mldebug.errors import UsageError

DESCRIPTION = """\
The pages of docs/ ship inside the package, so they are there wherever mldebug is installed.

  mldebug docs            # the index
  mldebug docs hang       # the page of 'mldebug hang'
  mldebug docs --path     # where the pages are"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("page", nargs="?", default="index", metavar="COMMAND",
                   help="a command or page name, e.g. hang, fr, env (default: the index)")
    p.add_argument("--path", action="store_true", help="print the docs directory and exit")


def docs_dir() -> Path:
    """The pages: ``mldebug/docs`` in an installed package (a link to ../docs in a checkout)."""
    return Path(__file__).resolve().parent.parent / "docs"


def run(args: argparse.Namespace) -> int:
    d = docs_dir()
    if args.path:
        print(d)
        return 0
    pages = sorted(p.stem for p in d.glob("*.md"))
    name = args.page.removesuffix(".md")
    if name not in pages:
        raise UsageError(f"no documentation page {args.page!r}.",
                         "Pages: " + ", ".join(pages) + ".")
    print((d / f"{name}.md").read_text(), end="")
    return 0
