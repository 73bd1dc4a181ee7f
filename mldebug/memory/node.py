"""The per-node part of ``mldebug mem top``: find the rank processes here and sample memory.

Stdlib only (it imports ``mldebug.hang.node``'s discovery and ``mldebug.dist``, which travel
with it through ``mldebug.fanout.bundle``), so nodes need no mldebug install. For each rank:
RSS (/proc/PID/status), USS (private pages, /proc/PID/smaps_rollup), and GPU memory per
device from ``nvidia-smi --query-compute-apps`` where it exists. With ``--watch S`` it samples
several times over S seconds. Prints one ``MLDEBUG-JSON`` line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from mldebug.nodekit import ArgumentParser, emit, short_hostname
from mldebug.ranks import find_ranks, list_processes


def _kib_fields(path: str, names: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            parts = rest.split()
            if parts and parts[0].isdecimal():
                out[key] = out.get(key, 0) + int(parts[0]) * 1024
    return out


def rss_uss(pid: int) -> tuple[int | None, int | None]:
    rss = _kib_fields(f"/proc/{pid}/status", ("VmRSS",)).get("VmRSS")
    priv = _kib_fields(f"/proc/{pid}/smaps_rollup", ("Private_Clean", "Private_Dirty",
                                                     "Private_Hugetlb"))
    return rss, (sum(priv.values()) if priv else None)


def parse_compute_apps(text: str) -> dict[int, dict[str, int]]:
    """``nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,
    nounits`` -> {pid: {gpu_uuid: bytes}}."""
    out: dict[int, dict[str, int]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdecimal():
            continue
        try:
            mib = int(float(parts[1]))
        except ValueError:
            continue  # "[N/A]" (MIG, or no permission)
        out.setdefault(int(parts[0]), {})[parts[2]] = mib * 1024 * 1024
    return out


def gpu_by_pid(timeout: float = 10.0) -> tuple[dict[int, dict[str, int]], str | None]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}, None
    try:
        r = subprocess.run([smi, "--query-compute-apps=pid,used_memory,gpu_uuid",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {}, f"nvidia-smi failed: {e}"
    if r.returncode != 0:
        return {}, f"nvidia-smi failed: {(r.stderr or r.stdout).strip()[:200]}"
    return parse_compute_apps(r.stdout), "nvidia-smi"


def node_memory() -> dict[str, int]:
    m = _kib_fields("/proc/meminfo", ("MemTotal", "MemAvailable"))
    return {"total": m.get("MemTotal", 0), "available": m.get("MemAvailable", 0)}


def collect(opts: argparse.Namespace) -> dict[str, Any]:
    """Find the ranks on this node and sample them; the JSON document the caller receives."""
    start = time.monotonic()
    host = short_hostname()
    doc: dict[str, Any] = {"host": host, "processes": [], "errors": [], "gpu_source": None}
    uid = None if opts.all_users or os.geteuid() == 0 else os.geteuid()
    targets, errors = find_ranks(list_processes(), pid=opts.pid, pattern=opts.pattern, uid=uid,
                                 host=host, slurm_job=opts.slurm_job)
    doc["errors"].extend(errors)
    n = 1 if opts.watch <= 0 else max(3, min(11, int(opts.watch) + 1))
    pause = opts.watch / (n - 1) if n > 1 else 0.0
    samples: dict[int, list[list[Any]]] = {t["pid"]: [] for t in targets}
    for k in range(n):
        if k:  # on a schedule: slow sampling does not stretch the watch
            time.sleep(max(0.0, start + k * pause - time.monotonic()))
        gpu, source = gpu_by_pid() if targets else ({}, None)
        doc["gpu_source"] = doc["gpu_source"] or source
        now = round(time.monotonic() - start, 3)
        for t in targets:
            rss, uss = rss_uss(t["pid"])
            if rss is None:
                continue  # exited
            samples[t["pid"]].append([now, rss, uss, gpu.get(t["pid"], {})])
    for t in targets:
        doc["processes"].append({"pid": t["pid"], "cmdline": t["cmdline"][:8],
                                 "identity": t["identity"], "samples": samples[t["pid"]]})
    doc["node"] = node_memory()
    doc["seconds"] = round(time.monotonic() - start, 3)
    return doc


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="mldebug-mem-node",
                                description="Sample the memory of the rank processes on this "
                                            "node as one JSON document (stdlib only).")
    p.add_argument("--pid", type=int)
    p.add_argument("--pattern")
    p.add_argument("--all-users", action="store_true")
    p.add_argument("--slurm-job")
    p.add_argument("--watch", type=float, default=0.0)
    return p


def main(argv: list[str] | None = None) -> int:
    emit(collect(parser().parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
