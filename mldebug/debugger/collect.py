"""Reaching the nodes for ``mldebug pdb``: the one place that calls the fan-out.

``node_answers`` runs the stdlib-only node script (``node.py`` + ``registry.py``) here or on
every target node; ``node_command`` is the shell command that runs the terminal client (or
the 3.14 attach wrapper) on a node over ``ssh -t``, so no port is opened beyond 127.0.0.1
anywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mldebug import fanout

NODE_MODULES = ("mldebug.nodekit", "mldebug.errors", "mldebug.privdir", "mldebug.debugger.registry",
                "mldebug.debugger.node")
NODE_SCHEMA = {"host": str, "sessions": list}


@dataclasses.dataclass
class NodeArgs:
    """The arguments of ``mldebug/debugger/node.py`` (``fanout.to_argv`` makes its argv)."""

    dir: str | None = None
    slurm_job: str | None = None
# what runs on the node under ssh -t: the terminal client, or the Python 3.14 attach wrapper
SCRIPTS = {
    "client": ("mldebug.nodekit", "mldebug.debugger.registry", "mldebug.debugger.wire",
               "mldebug.debugger.client"),
    "attach": ("mldebug.debugger.attach",),
}


def node_answers(target: fanout.FanoutOptions, node_args: NodeArgs,
                 ) -> list[tuple[str, dict[str, Any] | None, str | None]]:
    """(host, document or None, error) for each node (this host alone when ``target`` is
    local). With ``node_command``, every use of the fan-out by ``mldebug pdb`` is here."""
    if target.is_local:
        from mldebug.debugger import node

        doc = node.collect(node.parser().parse_args(fanout.to_argv(node_args)))
        return [(doc["host"], doc, None)]
    results = fanout.run(fanout.NodeJob(NODE_MODULES, node_args, NODE_SCHEMA), target)
    return [(r.host, r.data, r.error) for r in results]


def node_command(script: str, args: list[str], remote_python: str | None = None) -> str:
    """The shell command a node runs (under ``ssh -t``) for ``script`` ("client" or "attach")."""
    modules = SCRIPTS[script]
    return fanout.remote_command(fanout.bundle(modules, modules[-1]), args, remote_python)
