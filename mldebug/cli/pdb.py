"""mldebug pdb: the debugger sessions of ranks without a terminal - list, connect, attach."""

from __future__ import annotations

import argparse
from typing import Any

from mldebug.cli._common import (
    add_json_argument,
    add_target_arguments,
    fanout_options,
)

DESCRIPTION = """\
A rank without a terminal (every torchrun/srun batch job) that reaches
mldebug.breakpoint(rank=N) - or raises under install_excepthook(debug=True) - serves pdb on
127.0.0.1 with a random token and prints the command to reach it. This command finds and
opens those sessions, on this host or any node (through ssh; nothing listens beyond
127.0.0.1):

  mldebug pdb list                               # sessions on this host
  mldebug pdb list --nodes node[1-64] --json     # on every node
  mldebug pdb connect 2                          # rank 2's session (here)
  mldebug pdb connect 2 --slurm-job 123456       # rank 2, wherever it runs in the job
  mldebug pdb connect node37:41234               # the line the rank printed
  mldebug pdb attach 4242                        # no breakpoint in the code (Python 3.14+)

In a session: line editing, history and tab completion; Ctrl-C interrupts the command that
runs; Ctrl-D detaches and leaves the rank stopped; 'c' continues it (so does 'q': a session
never ends a rank). Exit codes: 0 done, 1 nothing to connect to, 2 usage error."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="pdb_action", metavar="{list,connect,attach}", required=True)
    ls = _session_parser(sub, "list", "the open sessions: rank, host, pid, where it stopped",
                         "The open debugger sessions on this host or the given nodes.")
    add_json_argument(ls)
    co = _session_parser(sub, "connect", "open the terminal of a session: RANK or HOST:PORT",
                         "Connect to a session: a rank (found with the same --nodes/--slurm-job "
                         "as list) or HOST:PORT as printed by the rank.")
    co.add_argument("session", metavar="RANK|HOST:PORT", help="a rank number or HOST:PORT")
    at = sub.add_parser("attach", help="pdb in a running process with no breakpoint (Python 3.14+)",
                        description="Attach pdb to a running Python process (python -m pdb -p, "
                                    "Python 3.14+ in the target); older targets are refused "
                                    "with the way that works for them.")
    at.add_argument("pid", type=int, help="the process id on its host")
    at.add_argument("--host", help="the node the process runs on (reached with ssh -t)")
    at.add_argument("--remote-python", metavar="PATH", help="Python on the node (default: python3)")
    at.add_argument("--ssh-args", metavar="ARGS", help="extra ssh options")


def _session_parser(sub: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """A subcommand that finds sessions: --dir and where to look (--nodes, --slurm-job, ...)."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
    p.add_argument("--dir", metavar="DIR",
                   help="the session directory on the nodes (default: $MLDEBUG_PDB_DIR, "
                        "else /tmp/mldebug-pdb-UID of the user)")
    add_target_arguments(p, default_timeout=20.0)
    return p


def run(args: argparse.Namespace) -> int:
    import os

    from mldebug.debugger import connect

    if args.pdb_action == "attach":
        return connect.attach(args.pid, args.host, remote_python=args.remote_python,
                              ssh_args=args.ssh_args)
    directory = args.dir or os.environ.get("MLDEBUG_PDB_DIR")
    target = fanout_options(args)
    if args.pdb_action == "connect":
        return connect.connect(args.session, target, directory=directory)
    report = connect.list_sessions(target, directory)
    if args.json:
        from mldebug.cli._common import print_doc

        print_doc(report.to_dict())
    else:
        from mldebug.debugger.report import render
        from mldebug.render import console

        render(report, console())
    return 0 if report.sessions else 1
