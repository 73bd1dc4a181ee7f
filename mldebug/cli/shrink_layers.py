"""mldebug shrink-layers: keep N layers of a local checkpoint (config edit, or sliced weights)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mldebug.cli._common import print_report
from mldebug.errors import UsageError

DESCRIPTION = """\
For a local clone of a real model: edit config.json (num_hidden_layers and the per-layer lists
such as layer_types, mlp_only_layers, in lockstep) so loading keeps N layers, at least one of
each distinct block type. --in-place edits config.json (a backup is kept as config.json.orig);
--out DIR writes a new directory whose safetensors hold only the kept layers, renumbered,
read tensor by tensor so the rest of the checkpoint never enters memory. Reports the load time
before and after (skip with --no-measure).

Example: mldebug shrink-layers ./Qwen3-30B-A3B --layers 2 --out ./Qwen3-30B-A3B-2layers"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", metavar="MODEL_DIR", help="local model directory (config.json + weights)")
    p.add_argument("--layers", type=int, required=True, metavar="N", help="layers to keep")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", "-o", metavar="DIR", help="write a new directory with sliced weights")
    where.add_argument("--in-place", action="store_true", help="edit MODEL_DIR/config.json only")
    p.add_argument("--no-measure", action="store_true", help="do not time loading before/after")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from mldebug.render import console
    from mldebug.tiny.layers import shrink_layers
    from mldebug.tiny.report import render

    model_dir = Path(args.model_dir).expanduser()
    if not model_dir.is_dir():
        raise UsageError(f"{model_dir} is not a directory.",
                         "Pass a local model directory (git clone of the model repository).")
    out = Path(args.out).expanduser() if args.out else None
    report = shrink_layers(model_dir, args.layers, out=out, in_place=args.in_place,
                           measure=not args.no_measure, force=args.force)
    print_report(report, args.json, lambda r: render(r, console()))
    return 0

