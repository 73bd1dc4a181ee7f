"""Run the node script (``node.py``) here or on many nodes and turn the answers into facts.

The only I/O of ``mldebug env``: everything after this is pure analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mldebug.env.facts import NodeFacts
from mldebug.fanout import NodeResult, Target, run_script

NODE_SCRIPT = Path(__file__).with_name("node.py")


def node_args(*, torch_timeout: float, ports: Sequence[str] = (),
              torch_import: bool = False) -> list[str]:
    args = ["--torch-timeout", f"{torch_timeout:g}"]
    if torch_import:
        args.append("--torch-import")
    for p in ports:
        args += ["--check-port", p]
    return args


def collect(target: Target, *, torch_timeout: float = 10.0, ports: Sequence[str] = (),
            torch_import: bool = False,
            fanout: dict[str, Any] | None = None) -> tuple[list[NodeFacts], list[NodeResult]]:
    """Facts of every node that answered, and the results of those that did not."""
    kwargs = dict(fanout or {})
    # A node needs time for the torch probe plus the rest of the collection.
    kwargs["timeout"] = max(float(kwargs.get("timeout") or 0), torch_timeout + 10)
    results = run_script(NODE_SCRIPT, node_args(torch_timeout=torch_timeout, ports=ports,
                                                torch_import=torch_import), target, **kwargs)
    return facts_from_results(results)


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
