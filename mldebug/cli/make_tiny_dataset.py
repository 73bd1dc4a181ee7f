"""mldebug make-tiny-dataset: N records of a local dataset as plain data files."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from mldebug.cli._common import print_report

DESCRIPTION = """\
SOURCE: a jsonl/json/csv/parquet/arrow file, a directory of such files, or a datasets
save_to_disk directory. Keeps N records per split (the first N, a random N, or N covering every
value of --by FIELD), shrinks images to fit --image-size keeping the ratio, and writes plain
data files that datasets.load_dataset(DIR) loads with no script, plus a README card with the
command that rebuilt it. Nothing is downloaded.

Example: mldebug make-tiny-dataset train.jsonl --out tiny-train -n 100 --select random"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="data file, data directory or save_to_disk dir")
    p.add_argument("--out", "-o", required=True, metavar="DIR", help="directory to write")
    p.add_argument("-n", type=int, required=True, metavar="N", help="records to keep per split")
    p.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl",
                   help="output format (default: jsonl; parquet when there are images)")
    p.add_argument("--image-size", type=int, default=32, metavar="PX",
                   help="shrink images to fit PX x PX, keeping the ratio (default: 32)")
    p.add_argument("--seed", type=int, default=0, help="seed for --select random/stratified")
    p.add_argument("--select", choices=("first", "random", "stratified"), default="first",
                   help="which records (default: first)")
    p.add_argument("--by", metavar="FIELD", help="column whose every value --select stratified covers")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def rebuild_command(args: argparse.Namespace) -> str:
    parts = ["mldebug", "make-tiny-dataset", args.source, "--out", args.out, "-n", str(args.n),
             "--format", args.format, "--image-size", str(args.image_size), "--seed",
             str(args.seed), "--select", args.select]
    if args.by:
        parts += ["--by", args.by]
    return shlex.join([*parts, "--force"])


def run(args: argparse.Namespace) -> int:
    from mldebug.render import console
    from mldebug.tiny.dataset import make_tiny_dataset
    from mldebug.tiny.report import render

    report = make_tiny_dataset(args.source, Path(args.out), args.n, fmt=args.format,
                               image_size=args.image_size, seed=args.seed, select=args.select,
                               by=args.by, force=args.force, command=rebuild_command(args))
    print_report(report, args.json, lambda r: render(r, console()))
    return 0

