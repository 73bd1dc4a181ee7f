"""The caller's side of ``mldebug hang --signal``: run ``mldebug.capture.signal`` here or on
every node, and return hang's per-node results. All fan-out of this package is here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mldebug.fanout import NodeResult, Target, bundle, run_script

if TYPE_CHECKING:
    from mldebug.hang.collect import CollectOptions


def signal_docs(opts: CollectOptions, target: Target, *, signal: str = "SIGUSR1",
                connect_timeout: float = 10.0, fanout: int = 64,
                remote_python: str | None = None, ssh_args: str | None = None,
                on_result: Callable[[NodeResult], None] | None = None) -> list[NodeResult]:
    """One hang node document per node, the stacks coming from the ranks' own handlers."""
    from mldebug.capture import signal as node
    from mldebug.errors import UsageError

    try:
        node.signal_number(signal)
    except ValueError:
        raise UsageError(f"--signal {signal!r} is not a signal name or number.",
                         "e.g. --signal SIGUSR1 (what mldebug.watchdog() listens to by "
                         "default)") from None
    args = [*opts.node_args(), "--signal", signal]
    if target.is_local:
        doc = node.collect(node.parser().parse_args(args))
        return [NodeResult(doc["host"], data=doc)]
    node_timeout = opts.timeout * (2 if opts.watch else 1) + opts.watch + 5
    return run_script(
        bundle(node.MODULES, "mldebug.capture.signal"), args, target,
        timeout=node_timeout, connect_timeout=connect_timeout, fanout=fanout,
        remote_python=remote_python, ssh_args=ssh_args, on_result=on_result,
    )
