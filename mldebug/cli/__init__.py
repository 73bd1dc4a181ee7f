"""The ``mldebug`` command line: a registry of subcommands, one module each.

Each command has its line of ``mldebug --help`` in ``HELP`` below; its module defines
``DESCRIPTION`` (optional, longer), ``add_arguments(parser)`` and ``run(args) -> int``. Command
modules import nothing heavy at module level, so ``mldebug --help`` and the torch-free commands start
fast and never import torch. ``main`` is the one place errors end: a known error prints its
message and fix, anything else is reported as a bug with its traceback saved to a file.
"""

from __future__ import annotations

import os
import sys

from mldebug._version import __version__
from mldebug.errors import MldebugError, UsageError

TYPE_CHECKING = False  # argparse, typing and their imports stay off `mldebug --help`'s path
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import ModuleType

# command name -> module implementing it, grouped by topic in the order --help lists them.
COMMANDS: dict[str, str] = {
    "hang": "mldebug.cli.hang",
    "fr": "mldebug.cli.fr",
    "env": "mldebug.cli.env",
    "nccl-log": "mldebug.cli.nccl_log",
    "log": "mldebug.cli.log",
    "why": "mldebug.cli.why",
    "dist-test": "mldebug.cli.dist_test",
    "numerics": "mldebug.cli.numerics",
    "make-tiny": "mldebug.cli.make_tiny",
    "shrink-layers": "mldebug.cli.shrink_layers",
    "make-tiny-dataset": "mldebug.cli.make_tiny_dataset",
    "mem": "mldebug.cli.mem",
    "pdb": "mldebug.cli.pdb",
    "trace": "mldebug.cli.trace",
    "docs": "mldebug.cli.docs",
    "completion": "mldebug.cli.completion",
}

# command name -> its line in `mldebug --help` (here, not in the modules: the top-level
# help is printed without importing any command module)
HELP: dict[str, str] = {
    "hang": "dump every rank's Python stack (py-spy), group them and name the odd rank out",
    "fr": "flight recorder: trigger dumps on a live job (any backend) and name the culprit rank",
    "env": "check the NCCL/torch/system environment for misconfigurations, here or on many nodes",
    "nccl-log": ("summarise NCCL_DEBUG=INFO logs: versions, transports, "
                 "interfaces, init, WARNs and their causes"),
    "log": ("post-mortem from a dead job's logs: the rank that failed "
            "first or never reached the collective"),
    "why": ("one verdict from everything a job left: logs, FR dumps, stacks, sentinel "
            "records (sniffed by content)"),
    "dist-test": ("check that every rank can init, all_reduce, barrier and "
                  "allocate (run under any launcher)"),
    "numerics": ("NaN/inf across ranks: merge NanSentinel's records into one "
                 "verdict (numerics report DIR)"),
    "make-tiny": "make a tiny random model + tokenizer of any transformers architecture (offline)",
    "shrink-layers": "cut a local model's layer stack to N layers (one of each block type kept)",
    "make-tiny-dataset": ("make a tiny dataset (first/random/stratified N records) as "
                          "plain jsonl/parquet files"),
    "mem": ("memory: snapshot reports and plots, per-rank usage across "
            "nodes, peak of a process tree"),
    "pdb": "list and connect to the pdb sessions that ranks opened at mldebug.breakpoint()",
    "trace": "show the ranks' execution rings side by side, or run a script with a full trace",
    "docs": "print the documentation page of a command (or the index) from the installed package",
    "completion": "print the bash or zsh completion script: eval \"$(mldebug completion bash)\"",
}

# A bare number right after these commands is a process id: `mldebug hang 12345`.
BARE_NUMBER: dict[str, str] = {"hang": "--pid"}

EPILOG = """\
Run 'mldebug COMMAND --help' for a command's options, 'mldebug docs [COMMAND]' for its page.
--debug (anywhere before '--') shows the traceback of an unexpected error.
Exit codes: 0 report produced, 1 nothing could be done (or an error-level finding where the
command says so), 2 usage error."""


def load_command(name: str) -> ModuleType:
    """The module of a registered command; a registered module that is missing is an error."""
    import importlib

    module = COMMANDS[name]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise MldebugError(f"command {name!r} is registered but its module {module} is "
                               "missing.", "Reinstall mldebug (pip install -e .).") from None
        raise


def available_commands() -> dict[str, ModuleType]:
    """Every registered command's module, in registry order."""
    return {name: load_command(name) for name in COMMANDS}


DESCRIPTION = ("Debug distributed PyTorch jobs: hangs, flight-recorder dumps, NCCL environment, "
               "numerics, tiny models.")


def top_help() -> str:
    """``mldebug --help``: the text argparse prints for the whole parser on a wide terminal,
    written from the registry alone (building 16 parsers to print it took 4x `python -c
    pass`: argparse, re, gettext's locale lookups, every command module)."""
    rows = []
    for name in COMMANDS:
        if len(name) > 15:
            rows.append(f"    {name}\n{'':21}{HELP[name]}")
        else:
            rows.append(f"    {name:<17}{HELP[name]}")
    return (f"usage: mldebug [-h] [--version] COMMAND ...\n\n{DESCRIPTION}\n\noptions:\n"
            f"  -h, --help         show this help message and exit\n"
            f"  --version          show program's version number and exit\n\n"
            f"commands:\n  COMMAND\n" + "\n".join(rows) + f"\n\n{EPILOG}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` the parser of that one command (fast start-up:
    ``mldebug hang`` does not import the modules of every other command)."""
    import argparse

    from mldebug.cli.parser import Parser

    parser = Parser(
        prog="mldebug",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mldebug {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands = available_commands() if only is None else {only: load_command(only)}
    for name, mod in commands.items():
        p = sub.add_parser(
            name,
            help=HELP[name],
            description=getattr(mod, "DESCRIPTION", HELP[name]),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _split_debug(args: list[str]) -> tuple[list[str], bool]:
    """Remove ``--debug`` (before any ``--``) from the arguments; say whether it was there."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a != "--debug"] + args[end:]
    return kept, len(kept) != len(args) or os.environ.get("MLDEBUG_DEBUG") == "1"


def _command_of(args: list[str]) -> str | None:
    """The command word (the first argument that is not an option), or None."""
    for a in args:
        if not a.startswith("-"):
            return a
        if a in ("-h", "--help", "--version"):
            return None
    return None


def _prepare(args: list[str]) -> str | None:
    """Check the command word (did-you-mean) and rewrite habits; returns the command."""
    first = _command_of(args)
    if first is None:
        return None
    if first not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(first, list(COMMANDS), n=1, cutoff=0.6)
        fix = (f"Did you mean 'mldebug {close[0]}'? " if close else "") + \
            "Run 'mldebug --help' for the list of commands."
        raise UsageError(f"unknown command {first!r}.", fix)
    i = args.index(first)
    if first in BARE_NUMBER and i + 1 < len(args) and args[i + 1].isdecimal():
        args.insert(i + 1, BARE_NUMBER[first])
    return first


# `mldebug hang` options that change nothing the node collection does (the report's), and
# the node options that pass through as they are; with [--pid] N these are the whole fast path
_HANG_REPORT_FLAGS = frozenset({"--json", "--all", "--all-threads", "--show-secrets"})
_HANG_NODE_FLAGS = frozenset({"--native", "--nonblocking", "--locals", "--all-users"})


def _hang_fast_args(args: list[str]) -> tuple[int | None, list[str]] | None:
    """``(pid, node flags)`` when ``args`` is a plain local ``mldebug hang [[--pid] N]``
    (with flags from the two sets above), else None. ``main`` then starts the py-spy dumps
    from ``mldebug.hang.node.fast_opts`` before argparse, the parsers and the fan-out types
    load; the parsed command line takes the running collection over if its options are the
    same (``mldebug.hang.early.take``), else starts its own."""
    if not args or args[0] != "hang" or "_ARGCOMPLETE" in os.environ or \
            os.environ.get("WCOLL"):
        return None
    flags: list[str] = []
    pid = None
    expect_pid = False
    for i, a in enumerate(args[1:], 1):
        number = a.isascii() and a.isdigit()
        if expect_pid:
            if not number:
                return None
            pid, expect_pid = a, False
        elif a == "--pid" and pid is None:
            expect_pid = True
        elif i == 1 and number:  # `mldebug hang 12345` (BARE_NUMBER)
            pid = a
        elif a in _HANG_NODE_FLAGS:
            flags.append(a)
        elif a not in _HANG_REPORT_FLAGS:
            return None
    if expect_pid:
        return None
    return (int(pid) if pid is not None else None), flags


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    args_list, debug = _split_debug(list(sys.argv[1:] if argv is None else argv))
    if args_list in ([], ["-h"], ["--help"]) and "_ARGCOMPLETE" not in os.environ:
        # the command list, printed from the registry alone (top_help)
        sys.stdout.write(top_help())
        return 0 if args_list else 2
    global _QUICK_EXIT
    fast = _hang_fast_args(args_list)
    started = _QUICK_EXIT = fast is not None
    if fast is not None:
        from mldebug.hang import early, node

        early.start_early(node.fast_opts(*fast))
    from mldebug.render import safe_stdio

    try:
        # outside text never reaches the terminal raw (mldebug.render); pdb relays a live session
        with safe_stdio(_command_of(args_list) not in UNSANITIZED,
                        redact="--show-secrets" not in args_list):
            return _main_guarded(args_list, debug)
    finally:
        if started:  # main() is also called in-process (tests, tools)
            from mldebug.hang import early

            early.drop()  # not taken: the command line failed before the dumps were asked for


# set by a fast-path `mldebug hang` run: `entry` then ends the process without the
# interpreter's finalisation (tearing down ~160 modules: ~15 ms, a tenth of the whole run)
_QUICK_EXIT = False

# commands whose output is an interactive session, passed through as it is
UNSANITIZED = frozenset({"pdb"})


def _main_guarded(args_list: list[str], debug: bool) -> int:
    try:
        return _main(args_list)
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
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ModuleNotFoundError as e:  # an optional dependency (an extra) is not installed
        from mldebug.errors import missing_dependency

        known = missing_dependency(e, _command_of(args_list))
        if known is None:
            return _report_bug(e, debug)
        _print_error(known)
        return 1
    except OSError as e:  # a full disk or a read-only --out is the world's doing, not a bug
        from pathlib import Path

        from mldebug.outdir import write_error

        known = write_error(Path(str(e.filename or "-")), e)
        if known is None:
            return _report_bug(e, debug)
        if not e.filename:  # a write to an open file (stdout redirected, a dump): no path known
            what = known.message.split(": ", 1)[1].rsplit(" (", 1)[0]
            known = MldebugError(f"cannot write the output: {what}.",
                                 "Free space on that file system, or write somewhere else "
                                 "(another --out DIR, another redirection).")
        _print_error(known)
        return 1
    except Exception as e:
        return _report_bug(e, debug)


def _main(args_list: list[str]) -> int:
    if "_ARGCOMPLETE" in os.environ:  # shell completion (mldebug completion bash|zsh)
        from mldebug.cli.completion import complete

        complete(build_parser())
    only = _prepare(args_list)
    parser = build_parser(only)
    from mldebug.cli.parser import Parser

    Parser.argv = list(args_list)  # the did-you-mean of an unknown option finds its command
    try:
        args = parser.parse_args(args_list)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2)
        return int(e.code or 0)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    from mldebug.cli.envelope import running

    running(args.command, next((v for d in SUB_DESTS if isinstance(v := getattr(args, d, None),
                                                                    str)), None))
    return int(args._run(args))


# the attribute each command's subcommand word is parsed into (``mldebug fr analyze``): the
# JSON envelope's schema names it (mldebug.cli.envelope)
SUB_DESTS = ("fr_command", "hang_action", "mem_action", "action", "pdb_action", "trace_action")


def _print_error(e: MldebugError) -> None:
    print(f"mldebug: error: {e.message}", file=sys.stderr)
    if e.fix:
        print(f"  {e.fix}", file=sys.stderr)


def _report_bug(e: Exception, debug: bool) -> int:
    """One line for an unexpected exception: it is a bug, here is the saved traceback."""
    import traceback

    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if debug:
        sys.stderr.write(text)
        return 1
    from mldebug.privdir import save_traceback

    where = save_traceback(text)
    saved = f"traceback saved in {where}" if where else "the traceback could not be saved"
    sys.stderr.write(f"mldebug: internal error (a bug in mldebug): {type(e).__name__}: "
                     f"{str(e)[:200]} - {saved}; rerun with --debug to see it, and please "
                     "report it.\n")
    return 1


def entry() -> None:
    """Console-script entry point."""
    code = main()
    if _QUICK_EXIT:  # nothing is left to run at exit on that path (no atexit, no temp files)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # `mldebug hang | head`: the reader left
            pass
        os._exit(code)
    sys.exit(code)
