"""GPU and NCCL RAS signals on a node: nvidia-smi's per-GPU utilisation, power and memory, and
``ncclras --format json`` (NCCL 2.28.7+), each polled twice (before and after the dumps) so
their movement shows. Stdlib only: this module travels to the nodes with the collector.

Formats, from the programs' sources:

- ``nvidia-smi --query-gpu=index,uuid,utilization.gpu,power.draw,memory.used,memory.total
  --format=csv,noheader,nounits``: one line per GPU, comma-separated, ``[N/A]`` (or
  ``[Not Supported]``) for a value the GPU does not report.
- ``ncclras --format json``: NCCL's ``src/ras/client_support.cc`` (``jsonWriteHeader``,
  ``jsonStartCommunicator``, ``jsonWriteRankData``, ``jsonWriteMissingRank``,
  ``jsonWriteFooter``; NCCL v2.28.7 to v2.30.7): ``{nccl_version, cuda_runtime_version,
  cuda_driver_version, timestamp, communicators_count, communicators: [{hash,
  secondary_hash, size, ranks_count, missing_ranks_count, ranks: [{rank, host, pid,
  cuda_dev, nvml_dev, status: {init_state, async_error, finalize_called, destroy_flag,
  abort_flag}, collective_counts: {Broadcast, Reduce, AllGather, ReduceScatter,
  AllReduce}}], missing_ranks: [{rank, host, pid, cuda_dev, nvml_dev, status:
  {unresponsive, considered_dead}}]}], ras: {collection_time_sec, timeouts_count}}``.
  RAS counts *launched* operations (NVIDIA/nccl#1730: OK while PyTorch timed out), so the
  counts are read together with the stacks, never alone.

Every run is bounded (``timeout``, output capped); a missing program is no signal, a hung or
garbled one is one error line for the node.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

SMI_QUERY = "index,uuid,utilization.gpu,power.draw,memory.used,memory.total"
SMI_FIELDS = ("index", "uuid", "util", "power_w", "mem_used_mib", "mem_total_mib")
RAS_OPS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
MAX_OUTPUT = 4 << 20
MAX_GPUS = 64
MAX_COMMS = 4096
MAX_RANKS = 1 << 16


class SignalError(ValueError):
    """Output that does not follow the program's format; the message says where."""


def run_bounded(argv: list[str], timeout: float) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why): the program is killed after ``timeout`` seconds and its
    output capped at MAX_OUTPUT bytes."""
    import os

    name = os.path.basename(argv[0])
    try:
        r = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"{name} did not answer within {timeout:g}s (killed)"
    except OSError as e:
        return None, f"could not run {argv[0]}: {e.strerror}"
    if r.returncode != 0:
        tail = r.stderr[-300:].decode(errors="replace").strip().splitlines()
        return None, f"{name} failed (exit code {r.returncode}): {tail[-1][:200] if tail else ''}"
    if len(r.stdout) > MAX_OUTPUT:
        return None, f"{name} printed more than {MAX_OUTPUT >> 20} MiB: not its format"
    return r.stdout.decode(errors="replace"), None


def _num(v: str) -> float | None:
    v = v.strip()
    if not v or v.startswith("[") or v.upper() in ("N/A", "NA"):
        return None
    try:
        x = float(v)
    except ValueError:
        raise SignalError(f"not a number: {v[:40]!r}") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise SignalError(f"not a finite number: {v[:40]!r}")
    return x


def parse_smi_csv(text: str) -> list[dict[str, Any]]:
    """nvidia-smi's ``--query-gpu=SMI_QUERY --format=csv,noheader,nounits`` lines."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            raise SignalError(f"nvidia-smi line with {len(cells)} fields, expected "
                              f"{len(SMI_FIELDS)}: {line[:80]!r}")
        index = _num(cells[0])
        if index is None or index != int(index) or index < 0:
            raise SignalError(f"nvidia-smi GPU index {cells[0][:20]!r}")
        gpus.append({"index": int(index), "uuid": cells[1][:80], "util": _num(cells[2]),
                     "power_w": _num(cells[3]), "mem_used_mib": _num(cells[4]),
                     "mem_total_mib": _num(cells[5])})
        if len(gpus) > MAX_GPUS:
            raise SignalError(f"more than {MAX_GPUS} GPUs in nvidia-smi's output")
    return gpus


def _int(d: dict[str, Any], key: str, where: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise SignalError(f"{where}: {key} is not an integer")
    return v


def parse_ras_json(text: str) -> dict[str, Any]:
    """``ncclras --format json``, checked against the format above and reduced to what the
    analysis reads: per communicator its hash, size, each rank's counts and status, and the
    missing ranks with unresponsive / considered_dead."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SignalError(f"ncclras output is not JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators"), list):
        raise SignalError("ncclras JSON has no communicators list (is it --format json, "
                          "NCCL 2.28.7 or later?)")
    comms = []
    total = 0
    for i, c in enumerate(doc["communicators"][:MAX_COMMS + 1]):
        if i >= MAX_COMMS:
            raise SignalError(f"more than {MAX_COMMS} communicators")
        where = f"communicator {i}"
        if not isinstance(c, dict) or not isinstance(c.get("ranks", []), list) \
                or not isinstance(c.get("missing_ranks", []), list):
            raise SignalError(f"{where} is malformed")
        ranks = []
        for r in c.get("ranks", []):
            total += 1
            if total > MAX_RANKS or not isinstance(r, dict):
                raise SignalError(f"{where}: too many or malformed ranks")
            counts = r.get("collective_counts") or {}
            status = r.get("status") or {}
            if not isinstance(counts, dict) or not isinstance(status, dict):
                raise SignalError(f"{where}: rank status or counts malformed")
            ranks.append({
                "rank": _int(r, "rank", where), "host": str(r.get("host", ""))[:100],
                "pid": _int(r, "pid", where), "cuda_dev": r.get("cuda_dev"),
                "counts": {op: int(counts[op]) for op in RAS_OPS
                           if isinstance(counts.get(op), int) and not isinstance(counts[op], bool)},
                "async_error": status.get("async_error"),
                "abort": bool(status.get("abort_flag")),
            })
        missing = []
        for m in c.get("missing_ranks", []):
            total += 1
            if total > MAX_RANKS or not isinstance(m, dict):
                raise SignalError(f"{where}: too many or malformed missing ranks")
            st = m.get("status") or {}
            missing.append({"rank": _int(m, "rank", where), "host": str(m.get("host", ""))[:100],
                            "pid": m.get("pid") if isinstance(m.get("pid"), int) else -1,
                            "unresponsive": bool(st.get("unresponsive")) if isinstance(st, dict)
                            else False,
                            "dead": bool(st.get("considered_dead")) if isinstance(st, dict)
                            else False})
        comms.append({"hash": str(c.get("hash", ""))[:40], "size": _int(c, "size", where),
                      "ranks": ranks, "missing": missing})
    return {"nccl_version": str(doc.get("nccl_version", ""))[:40], "communicators": comms}


def hung(polls: list[dict[str, Any]]) -> frozenset[str]:
    """The programs ("nvidia-smi", "ncclras") that were killed at their timeout in ``polls``:
    the next poll skips them (a wedged ncclras would cost its whole timeout again; its error
    is already on record)."""
    return frozenset(name for p in polls for e in p.get("errors", ())
                     for name in ("nvidia-smi", "ncclras")
                     if e.startswith(f"{name} did not answer within "))


def poll(timeout: float = 5.0, smi: str | None = None, ras: str | None = None,
         skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One poll of the node's GPU signals: ``{"smi": [...] | None, "ras": {...} | None,
    "errors": [...]}``. Programs not on PATH give None (no signal), not an error; programs in
    ``skip`` (``hung``) are not run."""
    out: dict[str, Any] = {"smi": None, "ras": None, "errors": []}
    smi = None if "nvidia-smi" in skip else smi or shutil.which("nvidia-smi")
    if smi:
        text, err = run_bounded([smi, f"--query-gpu={SMI_QUERY}",
                                 "--format=csv,noheader,nounits"], timeout)
        if err:
            out["errors"].append(err)
        elif text is not None:
            try:
                out["smi"] = parse_smi_csv(text)
            except SignalError as e:
                out["errors"].append(f"nvidia-smi: {e}")
    ras = None if "ncclras" in skip else ras or shutil.which("ncclras")
    if ras:
        text, err = run_bounded([ras, "--format", "json", "--timeout", str(max(1, int(timeout)))],
                                timeout + 2)
        if err:
            out["errors"].append(err)
        elif text is not None:
            try:
                out["ras"] = parse_ras_json(text)
            except SignalError as e:
                out["errors"].append(f"ncclras: {e}")
    return out


def check_polls(raw: Any) -> list[dict[str, Any]]:
    """A node's polls as they came over the wire, checked again (a node is outside data):
    SignalError when malformed."""
    if not isinstance(raw, list) or len(raw) > 4:
        raise SignalError("gpu polls are not a short list")
    out = []
    for p in raw:
        if not isinstance(p, dict):
            raise SignalError("a gpu poll is not an object")
        smi, ras = p.get("smi"), p.get("ras")
        if smi is not None:
            if not isinstance(smi, list) or len(smi) > MAX_GPUS:
                raise SignalError("nvidia-smi values malformed")
            for g in smi:
                if (not isinstance(g, dict) or not isinstance(g.get("index"), int)
                        or any(g.get(k) is not None and not isinstance(g.get(k), (int, float))
                               for k in ("util", "power_w", "mem_used_mib", "mem_total_mib"))):
                    raise SignalError("nvidia-smi values malformed")
        if ras is not None:
            ras = parse_ras_json(json.dumps({"communicators": [
                {"hash": c.get("hash"), "size": c.get("size"),
                 "ranks": [{"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid"),
                            "collective_counts": r.get("counts"), "status": {}}
                           for r in c.get("ranks", [])],
                 "missing_ranks": [{"rank": m.get("rank"), "host": m.get("host"),
                                    "pid": m.get("pid"), "status": {
                                        "unresponsive": m.get("unresponsive"),
                                        "considered_dead": m.get("dead")}}
                                   for m in c.get("missing", [])]}
                for c in ras.get("communicators", [])]})) if isinstance(ras, dict) else None
        errors = [str(e)[:300] for e in p.get("errors") or () if isinstance(e, str)][:8]
        out.append({"smi": smi, "ras": ras, "errors": errors})
    return out


# -- reading two polls (pure; used by the analysis) ------------------------------------------
def wedged_gpus(polls: list[dict[str, Any]]) -> list[int]:
    """GPUs at (near) 100% utilisation in both polls with flat power (within 3%): a kernel
    that spins without finishing, as a collective waiting for a peer does on the device."""
    if len(polls) < 2 or not polls[0].get("smi") or not polls[-1].get("smi"):
        return []
    before = {g["index"]: g for g in polls[0]["smi"]}
    out = []
    for g in polls[-1]["smi"]:
        a = before.get(g["index"])
        if a is None or a["util"] is None or g["util"] is None:
            continue
        if a["util"] >= 95 and g["util"] >= 95:
            pa, pb = a["power_w"], g["power_w"]
            if pa is None or pb is None or abs(pb - pa) <= 0.03 * max(pa, pb, 1.0):
                out.append(g["index"])
    return out


def ras_findings(polls: list[dict[str, Any]]) -> dict[str, Any]:
    """What two RAS polls say: ranks RAS considers dead or unresponsive, and per communicator
    whether the collective counts moved between the polls and which ranks are behind."""
    dead: set[int] = set()
    unresponsive: set[int] = set()
    behind: dict[str, list[int]] = {}
    moved = False
    docs: list[dict[str, Any]] = [p["ras"] for p in polls if p.get("ras")]
    if not docs:
        return {"dead": [], "unresponsive": [], "behind": {}, "moved": None}
    for c in docs[-1]["communicators"]:
        for m in c["missing"]:
            (dead if m["dead"] else unresponsive).add(m["rank"])
        totals = {r["rank"]: sum(r["counts"].values()) for r in c["ranks"]}
        if totals and len(set(totals.values())) > 1:
            top = max(totals.values())
            behind[c["hash"]] = sorted(r for r, n in totals.items() if n < top)
    if len(docs) >= 2:
        first = {(c["hash"], r["rank"]): sum(r["counts"].values())
                 for c in docs[0]["communicators"] for r in c["ranks"]}
        moved = any(sum(r["counts"].values()) != first.get((c["hash"], r["rank"]), -1)
                    for c in docs[-1]["communicators"] for r in c["ranks"])
    return {"dead": sorted(dead), "unresponsive": sorted(unresponsive - dead),
            "behind": behind, "moved": moved if len(docs) >= 2 else None}
