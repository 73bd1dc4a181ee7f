"""Run the node script (``node.py``) here or on many nodes and turn the answers into facts.

The only I/O of ``mldebug env``: everything after this is pure analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from mldebug.env.facts import NodeFacts
from mldebug.fanout import FanoutOptions, NodeJob, NodeResult, run

NODE_MODULES = ("mldebug.nodekit", "mldebug.env.node")
NODE_SCHEMA = {"host": str, "env": dict}


@dataclass
class NodeArgs:
    """The arguments of ``node.py`` (``mldebug.fanout.to_argv`` makes its argv)."""

    torch_timeout: float = 10.0
    torch_import: bool = False
    check_port: list[str] = field(default_factory=list)


def collect(target: FanoutOptions, args: NodeArgs) -> tuple[list[NodeFacts], list[NodeResult]]:
    """Facts of every node that answered, and the results of those that did not."""
    # A node needs time for the torch probe plus the rest of the collection.
    target = replace(target, timeout=max(target.timeout, args.torch_timeout + 10))
    return facts_from_results(run(NodeJob(NODE_MODULES, args, NODE_SCHEMA), target))


def facts_from_results(results: Sequence[NodeResult]) -> tuple[list[NodeFacts], list[NodeResult]]:
    """Typed facts of the nodes whose document parses; the rest as failures with the reason."""
    facts = []
    failed = []
    for r in results:
        if r.data is None:
            failed.append(r)
            continue
        try:
            f = NodeFacts.from_dict(r.data)
        except (TypeError, AttributeError, KeyError, ValueError) as e:
            # one node's malformed document must not cost the other nodes' report
            failed.append(NodeResult(r.host, None, f"malformed node document: {type(e).__name__}: "
                                     f"{str(e)[:200]}", r.stderr))
            continue
        f.host = r.host  # the name the user gave (pdsh), not the node's own idea of it
        facts.append(f)
    return facts, failed
