"""mldebug make-tiny: a tiny random model (+ tokenizer) of any architecture, offline, validated."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from mldebug.cli._common import print_report
from mldebug.errors import UsageError

DESCRIPTION = """\
Shrink every size-like field of a config (hidden, layers, heads, kv heads, head_dim, ff,
experts, positions, vocab, vision sizes) recursively through sub-configs, keeping one layer of
each block type and every divisibility constraint; shrink or train the tokenizer; build the
model with random weights, run forward (+ generate), save, reload and compare; write the model,
tokenizer, a README card and make_tiny.sh (the command that rebuilds it).

SOURCE: a model type (llama, qwen3_moe, gemma3, t5, ...), a config.json, or a local model
directory (weights there are never loaded). Nothing is downloaded.

Example: mldebug make-tiny qwen3_moe --out /tmp/tiny-qwen3-moe"""

SIZE_FLAGS = (("hidden", 16), ("layers", 2), ("heads", 4), ("kv_heads", None),
              ("intermediate", 32), ("vocab", 1024), ("experts", 4), ("experts_per_tok", None),
              ("positions", 128), ("image_size", 32), ("patch_size", 8))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="model type, config.json, or local model dir")
    p.add_argument("--out", "-o", required=True, metavar="DIR", help="directory to write")
    g = p.add_argument_group("sizes (the defaults never exceed the source's)")
    for name, default in SIZE_FLAGS:
        flag = "--" + name.replace("_", "-")
        extra = "" if default is not None else {
            "kv_heads": " (default: 2 for grouped-query sources; MHA/MQA sources keep their kind)",
            "experts_per_tok": " (default: min(source, experts/2))"}[name]
        g.add_argument(flag, type=int, default=None, metavar="N",
                       help=f"default: {default}{extra}" if default is not None else extra.strip(" ()"))
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="weights dtype on disk (default: fp32)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="set a config field after shrinking (dotted for sub-configs; "
                        "VALUE is JSON, else a string); repeatable")
    p.add_argument("--no-tokenizer", action="store_true", help="do not write a tokenizer")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def parse_overrides(items: list[str]) -> dict[str, Any]:
    import json

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set {item!r} is not KEY=VALUE.", "E.g. --set rope_theta=10000.")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def spec_from_args(args: argparse.Namespace) -> Any:
    from mldebug.tiny.shrink import ShrinkSpec

    values: dict[str, Any] = {}
    explicit = set()
    for name, _default in SIZE_FLAGS:
        v = getattr(args, name)
        if v is not None:
            if v < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {v}.",
                                 "Pass a positive size.")
            values[name] = v
            explicit.add(name)
    return ShrinkSpec(**values, overrides=parse_overrides(args.overrides),
                      explicit=frozenset(explicit))


def rebuild_command(args: argparse.Namespace) -> str:
    parts = ["mldebug", "make-tiny", args.source, "--out", args.out]
    for name, _default in SIZE_FLAGS:
        v = getattr(args, name)
        if v is not None:
            parts += ["--" + name.replace("_", "-"), str(v)]
    if args.dtype != "fp32":
        parts += ["--dtype", args.dtype]
    for s in args.overrides:
        parts += ["--set", s]
    if args.no_tokenizer:
        parts.append("--no-tokenizer")
    parts.append("--force")
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    from mldebug.render import console
    from mldebug.tiny.make import make_tiny
    from mldebug.tiny.report import render

    spec = spec_from_args(args)
    report = make_tiny(args.source, Path(args.out), spec, dtype=args.dtype,
                       tokenizer=not args.no_tokenizer, force=args.force,
                       command=rebuild_command(args))
    print_report(report, args.json, lambda r: render(r, console()))
    return 0

