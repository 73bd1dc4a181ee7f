"""A tiny node script for tests/test_k8s.py: answers a hang-shaped document with what the pod
shows it (its host name, the PIDs in its /proc, its argv, whether RANK is in its environment);
--sleep-on HOST: that pod takes a minute (a per-pod timeout)."""

from __future__ import annotations

import os
import sys

from mldebug.nodekit import ArgumentParser, emit, short_hostname


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="k8s-node")
    p.add_argument("--word", action="append", default=[])
    p.add_argument("--sleep-on", default="", help="on this host, sleep a minute first")
    a = p.parse_args(argv)
    if short_hostname() == a.sleep_on:
        import time

        time.sleep(60)
    pids = sorted(int(e) for e in os.listdir("/proc") if e.isdigit())
    emit({"host": short_hostname(), "processes": [], "pids": pids, "words": a.word,
          "argv0": sys.argv[0], "rank_env": os.environ.get("RANK")})
    return 0
