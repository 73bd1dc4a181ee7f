"""``python -m mldebug.trace run [--lines] [--out DIR] train.py ARGS`` - also as the script of
``torchrun ... -m mldebug.trace run train.py``: a full per-rank trace of the script."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mldebug.trace")
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="run a script with a full per-rank trace")
    r.add_argument("--lines", action="store_true", help="every line, not only calls")
    r.add_argument("--out", default=os.environ.get("MLDEBUG_TRACE_DIR", "mldebug-trace"),
                   help="directory for the per-rank trace files (private, 0700)")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    from mldebug.trace.full import run_script

    return run_script([a.script, *a.args], a.out,
                      a.lines or os.environ.get("MLDEBUG_TRACE_LINES") == "1")


if __name__ == "__main__":
    sys.exit(main())
