"""What ``mldebug hang`` asks each node's collector, and a local collection started early.

Kept apart from ``collect`` (which imports the model and the analysis types) so that a plain
``mldebug hang`` on this host starts its py-spy dumps first and loads the analysis while they
run (``start_local``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from mldebug.errors import UsageError
from mldebug.fanout import FanoutOptions, NodeResult, OnResult, to_argv


@dataclass
class CollectOptions:
    pid: int | None = None
    pattern: str | None = None
    all_users: bool = False
    user: str | None = None
    slurm_job: str | None = None
    native: bool = False
    nonblocking: bool = False
    locals: bool = False
    py_spy: str | None = None
    timeout: float = 20.0
    watch: float = 0.0
    jobs: int = 0  # dumps at once on a node; 0: that node's CPU count (node.dump_jobs)
    store: str | None = None  # the job's TCPStore HOST:PORT for the debug-server route

    def node_args(self) -> list[str]:
        return to_argv(self)


def options_from_args(args: argparse.Namespace) -> CollectOptions:
    import re

    if args.pattern:
        try:
            re.compile(args.pattern)
        except re.error as e:
            raise UsageError(f"--pattern {args.pattern!r} is not a valid regular expression: {e}.",
                             "Quote it for the shell, e.g. --pattern 'train\\.py'.") from None
    if args.user is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?", args.user):
        raise UsageError(f"--user {args.user!r} is not a user name or uid.", "e.g. --user alice")
    if args.watch is not None and args.watch <= 0:
        raise UsageError("--watch must be a positive number of seconds.", "e.g. --watch 5")
    store = getattr(args, "store", None)
    if store is not None:
        from mldebug.hang.debugserver import parse_store

        try:
            parse_store(store)
        except ValueError:
            raise UsageError(f"--store {store!r} is not HOST:PORT.",
                             "e.g. --store 10.0.0.1:29500 (the job's MASTER_ADDR:MASTER_PORT)"
                             ) from None
    return CollectOptions(
        pid=args.pid, pattern=args.pattern, all_users=args.all_users, user=args.user,
        slurm_job=args.slurm_job,
        native=args.native, nonblocking=args.nonblocking, locals=args.locals,
        py_spy=args.py_spy, timeout=args.timeout, watch=args.watch or 0.0,
        jobs=0,  # each node sizes its dump concurrency from its own CPUs (node.dump_jobs)
        store=store,
    )


DocsFn = Callable[[CollectOptions, FanoutOptions, OnResult, bool], list[NodeResult]]


def start_local(opts: CollectOptions) -> DocsFn:
    """Start this host's collection (finding the ranks, py-spy on each) on a thread now, and
    return a ``docs`` function for ``collect.collect`` that waits for it and hands over its
    document. Returns once the dumps are starting; the caller then imports what analysis and
    rendering need while py-spy runs: on 8 ranks the dumps take about as long as those
    imports. A collection the CLI began earlier with the same options
    (``mldebug.hang.early.start_early``) is handed over instead."""
    from mldebug.hang import early, node

    return early.take(node.parser().parse_args(opts.node_args()))
