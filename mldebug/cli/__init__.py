"""The ``mldebug`` command line: a registry of subcommands, one module each.

Each command module defines ``HELP`` (one line for ``mldebug --help``), ``DESCRIPTION``
(optional, longer), ``add_arguments(parser)`` and ``run(args) -> int``. Command modules
import nothing heavy at module level, so ``mldebug --help`` and the torch-free commands start
fast and never import torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from mldebug._version import __version__
from mldebug.errors import MldebugError, UsageError

# command name -> module implementing it. Keep alphabetical within a topic.
COMMANDS: dict[str, str] = {
    "hang": "mldebug.cli.hang",
    "fr": "mldebug.cli.fr",
    "env": "mldebug.cli.env",
    "nccl-log": "mldebug.cli.nccl_log",
    "dist-test": "mldebug.cli.dist_test",
    "make-tiny": "mldebug.cli.make_tiny",
    "shrink-layers": "mldebug.cli.shrink_layers",
    "make-tiny-dataset": "mldebug.cli.make_tiny_dataset",
    "mem": "mldebug.cli.mem",
}

EPILOG = """\
Run 'mldebug COMMAND --help' for a command's options. Docs: docs/index.md.
Exit codes: 0 report produced, 1 nothing could be done (or an error-level finding where the
command says so), 2 usage error."""


def _load(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:  # a command not built yet in this checkout
        if e.name == module:
            return None
        raise


def available_commands() -> dict[str, ModuleType]:
    """The registered commands whose modules exist, in registry order."""
    found = {}
    for name, module in COMMANDS.items():
        mod = _load(module)
        if mod is not None:
            found[name] = mod
    return found


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors with exit code 2 (argparse's default too)."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` the parser of that one command (fast start-up:
    ``mldebug hang`` does not import the modules of every other command)."""
    parser = _Parser(
        prog="mldebug",
        description="Debug distributed PyTorch jobs: hangs, flight-recorder dumps, NCCL "
        "environment, numerics, tiny models.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mldebug {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands = available_commands() if only is None else {only: importlib.import_module(COMMANDS[only])}
    for name, mod in commands.items():
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = args_list[0] if args_list else None
    only = first if first in COMMANDS and _load(COMMANDS[first]) is not None else None
    parser = build_parser(only)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2)
        return int(e.code or 0)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except UsageError as e:
        _print_error(e)
        return 2
    except MldebugError as e:
        _print_error(e)
        return 1
    except KeyboardInterrupt:
        print("mldebug: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mldebug ... | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _print_error(e: MldebugError) -> None:
    print(f"mldebug: error: {e.message}", file=sys.stderr)
    if e.fix:
        print(f"  {e.fix}", file=sys.stderr)


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
