"""The caller's side of ``mldebug hang --signal``: run ``mldebug.hang.signal_node`` here or on
every node, and return hang's per-node results. All fan-out of this package is here."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mldebug.fanout import FanoutOptions, NodeJob, NodeResult, OnResult, run

if TYPE_CHECKING:
    from mldebug.hang.collect import CollectOptions


def signal_docs(opts: CollectOptions, target: FanoutOptions, on_result: OnResult,
                progress: bool = True, *, signal: str = "SIGUSR1") -> list[NodeResult]:
    """Hand one hang node document per node to ``on_result`` as it arrives, the stacks coming
    from the ranks' own handlers (``mldebug.hang.collect.node_docs``'s contract)."""
    from mldebug.errors import UsageError
    from mldebug.hang import signal_node as node
    from mldebug.hang.collect import NODE_SCHEMA, CollectOptions

    try:
        node.signal_number(signal)
    except ValueError:
        raise UsageError(f"--signal {signal!r} is not a signal name or number.",
                         "e.g. --signal SIGUSR1 (what mldebug.watchdog() listens to by "
                         "default)") from None

    @dataclasses.dataclass
    class SignalArgs(CollectOptions):
        signal: str = "SIGUSR1"

    args = SignalArgs(**dataclasses.asdict(opts), signal=signal)
    if target.is_local:
        doc = node.collect(node.parser().parse_args(args.node_args()))
        on_result(NodeResult(doc["host"], data=doc))
        return [NodeResult(doc["host"])]
    node_timeout = opts.timeout * (4 if opts.watch else 2) + opts.watch + 5  # + debug server
    return run(NodeJob(node.MODULES, args, NODE_SCHEMA),
               dataclasses.replace(target, timeout=node_timeout), on_result, progress=progress)
