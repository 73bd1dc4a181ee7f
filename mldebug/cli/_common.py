"""Argument groups shared by commands: where to run (--nodes/--hostfile/--slurm-job), output."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from mldebug.errors import UsageError
from mldebug.fanout import Target


def add_target_arguments(p: argparse.ArgumentParser, *, default_timeout: float = 30.0) -> None:
    """--nodes / --hostfile / --slurm-job and the fan-out knobs."""
    g = p.add_argument_group("where to run (default: this host only)")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--nodes", "-w", metavar="HOSTLIST",
                       help="hosts to reach over pdsh/ssh, e.g. node[1-4,7]")
    where.add_argument("--hostfile", metavar="FILE",
                       help="hosts from a file: one per line, 'host slots=N' or 'host:N'")
    where.add_argument("--slurm-job", metavar="ID",
                       help="every node of this SLURM job, via srun --overlap")
    g.add_argument("--timeout", type=float, default=default_timeout, metavar="S",
                   help=f"seconds each node may take (default: {default_timeout:g})")
    g.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                   help="seconds to wait for ssh to connect (default: 10)")
    g.add_argument("--fanout", type=int, default=64, metavar="N",
                   help="nodes contacted at once (default: 64)")
    g.add_argument("--remote-python", metavar="PATH",
                   help="Python on the nodes (default: this interpreter's path, else python3)")
    g.add_argument("--ssh-args", metavar="ARGS",
                   help="extra ssh options, e.g. '-F ~/.ssh/cluster_config' "
                        "(appended to PDSH_SSH_ARGS_APPEND)")


def target_from_args(args: argparse.Namespace) -> Target:
    from mldebug.hosts import expand, read_hostfile

    if getattr(args, "timeout", 1) <= 0:
        raise UsageError("--timeout must be positive.", "Pass seconds, e.g. --timeout 30.")
    if getattr(args, "fanout", 1) < 1:
        raise UsageError("--fanout must be at least 1.", "Pass e.g. --fanout 64.")
    if getattr(args, "nodes", None):
        return Target(hosts=expand(args.nodes))
    if getattr(args, "hostfile", None):
        return Target(hosts=read_hostfile(args.hostfile))
    if getattr(args, "slurm_job", None):
        return Target(slurm_job=str(args.slurm_job))
    return Target()


def fanout_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """Keyword arguments for mldebug.fanout.run_script from the parsed options."""
    return {
        "timeout": args.timeout,
        "connect_timeout": args.connect_timeout,
        "fanout": args.fanout,
        "remote_python": args.remote_python,
        "ssh_args": args.ssh_args,
    }


def add_json_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--json", action="store_true",
                   help="print the whole report as JSON (schema in docs/)")


def print_report(report: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """``--json``: the report's ``to_dict()`` as JSON on stdout; otherwise ``render(report)``."""
    if as_json:
        from mldebug.render import print_json

        print_json(report.to_dict())
    else:
        render(report)
