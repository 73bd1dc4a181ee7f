"""The per-node part of ``mldebug pdb list``: the open sessions of this host, as one JSON line.

Stdlib only (with ``registry``, which travels with it): the fan-out sends both to nodes where
mldebug is not installed. Tokens never leave the node: the client reads them there.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mldebug.debugger import registry
from mldebug.nodekit import ArgumentParser, emit

PUBLIC = ("kind", "host", "pid", "rank", "local_rank", "world_size", "run_id", "slurm_job",
          "port", "file", "line", "function", "updated")


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="mldebug-pdb-node")
    p.add_argument("--dir", help="session directory (default: /tmp/mldebug-pdb-UID)")
    p.add_argument("--slurm-job", help="only sessions of this SLURM job")
    return p


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """This host's sessions without their tokens, and the registrations skipped with why."""
    doc: dict[str, Any] = {"host": registry.short_host(), "sessions": [], "skipped": []}
    try:
        found, skipped = registry.sessions(args.dir)
    except (registry.RegistryError, OSError) as e:
        doc["error"] = str(e)
        return doc
    for s in found:
        if args.slurm_job and str(s.get("slurm_job")) != args.slurm_job:
            continue
        doc["sessions"].append({k: s.get(k) for k in PUBLIC})
    doc["skipped"] = skipped
    return doc


def main(argv: list[str] | None = None) -> int:
    emit(collect(parser().parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
