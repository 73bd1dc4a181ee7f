"""Trigger dumps on this node or many nodes and gather them into one local directory.

Both paths run the same stdlib-only node script (``mldebug/fr/node.py``): in-process for
``trigger_local`` (what ``mldebug hang`` calls), over ``mldebug.fanout`` for
``mldebug fr trigger --nodes``. Files are named ``fr-<host>-rank<R>`` so ranks of different
nodes never collide; the rank is also inside each dump.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.fanout import FanoutOptions
from mldebug.fr import node as node_script


@dataclass
class NodeOutcome:
    host: str
    files: list[Path] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "rank 3 (pid 123): why"
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "files": [str(f) for f in self.files],
                "errors": self.errors, "notes": self.notes}


@dataclass
class TriggerResult:
    out_dir: Path
    nodes: list[NodeOutcome]

    @property
    def files(self) -> list[Path]:
        return [f for n in self.nodes for f in n.files]

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": str(self.out_dir), "files": [str(f) for f in self.files],
                "nodes": [n.to_dict() for n in self.nodes]}


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def save_node_doc(host: str, doc: dict[str, Any], out_dir: Path) -> NodeOutcome:
    """Write the dumps one node returned; pure apart from writing the files."""
    host = _SAFE.sub("_", str(doc.get("host") or host))
    outcome = NodeOutcome(host, notes=[str(n) for n in doc.get("notes", [])])
    for item in doc.get("ranks", []):
        who = f"rank {item.get('rank')}" + (f" (pid {item['pid']})" if item.get("pid") else "")
        if item.get("error"):
            outcome.errors.append(f"{who}: {item['error']}")
        data = item.get("data")
        if not data:
            continue
        try:
            raw = zlib.decompress(base64.b64decode(data))
        except (ValueError, zlib.error) as e:
            outcome.errors.append(f"{who}: the node sent an unreadable dump ({e})")
            continue
        rank = item.get("rank")
        suffix = f"rank{rank}" if isinstance(rank, int) else f"pid{item.get('pid', 'x')}"
        path = out_dir / f"fr-{host}-{suffix}"
        path.write_bytes(raw)
        outcome.files.append(path)
    return outcome


def trigger_local(out_dir: str | Path, timeout: float = 30.0,
                  dump_dir: str | Path | None = None) -> list[Path]:
    """Make every rank on this node dump now; copy the dumps into ``out_dir``.

    ``dump_dir`` is where the ranks' ``mldebug.fr.enable()`` registered (default: the same
    default as enable(): ``$MLDEBUG_FR_DIR`` or ``/tmp/mldebug-fr-<uid>``). Returns the files
    written, ``fr-<host>-rank<R>``; ranks that did not answer within ``timeout`` are skipped
    (use ``trigger_local_report`` for the reasons). Never blocks longer than ``timeout`` + 5 s.
    """
    return trigger_local_report(out_dir, timeout, dump_dir).files


def trigger_local_report(out_dir: str | Path, timeout: float = 30.0,
                         dump_dir: str | Path | None = None) -> NodeOutcome:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = node_script.trigger(str(dump_dir or node_script.default_dir()), timeout)
    return save_node_doc(str(doc.get("host", "localhost")), doc, out)


@dataclass
class NodeArgs:
    """The arguments of ``mldebug/fr/node.py`` (``mldebug.fanout.to_argv`` makes its argv)."""

    timeout: float
    dir: str | None = None


NODE_MODULES = ("mldebug.nodekit", "mldebug.fr.node")
NODE_SCHEMA = {"host": str, "ranks": list}


def trigger(target: FanoutOptions, out_dir: str | Path,
            dump_dir: str | Path | None = None) -> TriggerResult:
    """Trigger every rank on every node of ``target``; ``target.timeout`` bounds the ranks'
    answers on each node."""
    from mldebug import fanout

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    timeout = target.timeout
    if target.is_local:
        return TriggerResult(out, [trigger_local_report(out, timeout, dump_dir)])
    job = fanout.NodeJob(NODE_MODULES, NodeArgs(timeout, None if dump_dir is None else str(dump_dir)),
                         NODE_SCHEMA)
    results = fanout.run(job, dataclasses.replace(target, timeout=timeout + 10))
    nodes = []
    for res in results:
        if res.data is None:
            nodes.append(NodeOutcome(res.host, errors=[f"node: {res.error}"]))
        else:
            try:
                nodes.append(save_node_doc(res.host, res.data, out))
            except (AttributeError, KeyError, TypeError, ValueError) as e:
                nodes.append(NodeOutcome(res.host, errors=[
                    f"node: answered a wrongly typed document ({type(e).__name__}: {e})"]))
    return TriggerResult(out, nodes)
