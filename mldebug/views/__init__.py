"""Offline pictures of what happened across ranks: one self-contained HTML file per view
(``--html FILE``) and Chrome trace-event JSON (``--trace-event FILE``) for Perfetto.

Views draw the results analysis already produced (fr Analysis, TraceReport, hang Report,
mem TopReport); they never analyse. ``page`` writes every file (docs/views.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def add_view_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                       trace_event: bool = False, force: bool = True, what: str = "") -> None:
    """--html FILE (and --trace-event FILE), with --force unless the command has one."""
    p.add_argument("--html", metavar="FILE",
                   help=f"also write a self-contained HTML view{what} (opens offline; "
                        "docs/views.md)")
    if trace_event:
        p.add_argument("--trace-event", metavar="FILE", dest="trace_event",
                       help="also write Chrome trace-event JSON (Perfetto, chrome://tracing)")
    if force:
        p.add_argument("--force", action="store_true",
                       help="replace an existing --html/--trace-event file mldebug wrote")


def check_view_targets(args: argparse.Namespace) -> None:
    """Refuse bad output paths before any work (exists without --force, unwritable dir)."""
    from mldebug.views.page import check_target

    force = bool(getattr(args, "force", False))
    if getattr(args, "html", None):
        check_target(args.html, force=force, flag="--html")
    if getattr(args, "trace_event", None):
        check_target(args.trace_event, force=force, flag="--trace-event")


def write_views(args: argparse.Namespace, html: Callable[[], str] | None,
                trace: Callable[[], str] | None = None) -> list[Path]:
    """Write what was asked for; the paths written (said on stderr by the caller)."""
    import sys

    from mldebug.views.page import write_file

    force = bool(getattr(args, "force", False))
    out = []
    if getattr(args, "html", None) and html is not None:
        out.append(write_file(args.html, html(), force=force, flag="--html"))
    if getattr(args, "trace_event", None) and trace is not None:
        out.append(write_file(args.trace_event, trace(), force=force, flag="--trace-event"))
    for p in out:
        print(f"mldebug: wrote {p}", file=sys.stderr)
    return out
