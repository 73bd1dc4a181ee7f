"""A tiny node script for fan-out tests: answers a hang-shaped document, or a wrongly typed
one on the host named by --bad-host, so per-node validation is exercised over real pdsh."""

from __future__ import annotations

from mldebug.nodekit import ArgumentParser, emit, short_hostname


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="contract-node")
    p.add_argument("--bad-host", default="", help="answer a wrongly typed document on this host")
    a = p.parse_args(argv)
    host = short_hostname()
    emit({"host": host, "processes": "oops" if host == a.bad_host else []})
    return 0
