"""Synthetic flight-recorder dumps in torch's documented format, for tests and benchmarks.

Field names and meanings follow ``torch/distributed/flight_recorder/components`` and the
recorder's dump (format "2.10"): ``process_group`` is ``(name, desc)``, ``profiling_name`` is
``<backend>:<op>`` (``nccl:send 0->1`` / ``nccl:recv 1<-0`` for p2p, group-local ranks),
``pg_config`` maps a group name to ``{"name", "desc", "ranks": "[0, 1]"}`` and ``pg_status``
maps a pg id to its last enqueued/started/completed collective seq.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Frames = list[dict[str, Any]]

TORCH_FRAMES: Frames = [
    {"name": "all_reduce", "filename":
     "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", "line": 3245},
    {"name": "wrapper", "filename": "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py",
     "line": 83},
]


def user_frames(fn: str = "train_step", line: int = 10, file: str = "/job/train.py") -> Frames:
    return [*TORCH_FRAMES, {"name": fn, "filename": file, "line": line},
            {"name": "main", "filename": file, "line": 99}]


def entry(seq: int, op: str = "all_reduce", *, record_id: int | None = None,
          pg: tuple[str, str] = ("0", "default_pg"), pg_id: int = 0, backend: str = "nccl",
          sizes: Sequence[Sequence[int]] = ((4,),), out_sizes: Sequence[Sequence[int]] | None = None,
          dtype: str = "Float", out_dtype: str | None = None, state: str = "completed",
          p2p_seq: int = 0, is_p2p: bool = False, frames: Frames | None = None,
          version: str = "2.10") -> dict[str, Any]:
    """One entry as the recorder writes it (fields missing in older versions are dropped)."""
    ins = [list(s) for s in sizes]
    outs = [list(s) for s in (out_sizes if out_sizes is not None else sizes)]
    e: dict[str, Any] = {
        "record_id": seq if record_id is None else record_id,
        "pg_id": pg_id,
        "process_group": pg,
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": seq,
        "profiling_name": f"{backend}:{op}",
        "time_created_ns": 1_700_000_000_000_000_000 + seq,
        "input_sizes": ins,
        "input_dtypes": [dtype] * len(ins),
        "output_sizes": outs,
        "output_dtypes": [out_dtype or dtype] * len(outs),
        "state": state,
        "time_discovered_started_ns": None if state == "scheduled" else 1,
        "time_discovered_completed_ns": 2 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": is_p2p,
        "thread_name": "python",
        "thread_id": "1",
        "frames": frames if frames is not None else user_frames(),
    }
    minor = int(version.split(".")[1])
    if minor < 4:
        for k in ("input_dtypes", "output_dtypes", "thread_name", "thread_id", "is_p2p"):
            e.pop(k, None)
    if minor < 6:
        e.pop("timeout_ms", None)
    return e


def p2p(op: str, src: int, dst: int, p2p_seq: int, *, seq: int = 0, sizes: Sequence[Sequence[int]] = ((4,),),
        state: str = "completed", pg: tuple[str, str] = ("0", "default_pg"),
        frames: Frames | None = None) -> dict[str, Any]:
    """A send (``src->dst``) or recv (``dst<-src``) entry, group-local ranks."""
    name = f"send {src}->{dst}" if op == "send" else f"recv {dst}<-{src}"
    return entry(seq, name, sizes=sizes, state=state, p2p_seq=p2p_seq, is_p2p=True, pg=pg,
                 frames=frames)


def dump(rank: int, entries: list[dict[str, Any]], *, world: int | None = None,
         groups: dict[str, tuple[str, Sequence[int]]] | None = None, version: str = "2.10",
         status: dict[str, dict[str, int]] | None = None, with_rank: bool = True) -> dict[str, Any]:
    """A whole dump. ``groups``: name -> (desc, ranks); default: one default_pg of ``world``."""
    if groups is None:
        groups = {"0": ("default_pg", range(world or 1))}
    d: dict[str, Any] = {
        "version": version,
        "pg_config": {n: {"name": n, "desc": desc, "ranks": str(list(rs))}
                      for n, (desc, rs) in groups.items()},
        "comm_lib_version": "2.21.5",
        "entries": entries,
    }
    if int(version.split(".")[1]) >= 5:
        if status is None:
            status = {}
            for e in entries:
                if e.get("is_p2p"):
                    continue
                st = status.setdefault(str(e["pg_id"]), {"last_enqueued_collective": -1,
                                                         "last_started_collective": -1,
                                                         "last_completed_collective": -1})
                st["last_enqueued_collective"] = max(st["last_enqueued_collective"],
                                                     e["collective_seq_id"])
                if e["state"] == "completed":
                    st["last_completed_collective"] = max(st["last_completed_collective"],
                                                          e["collective_seq_id"])
        d["pg_status"] = status
    if with_rank:
        d["rank"] = rank
    return d


def write(directory: str | Path, dumps: dict[int, dict[str, Any]], prefix: str = "rank_") -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, d in dumps.items():
        p = out / f"{prefix}{rank}"
        p.write_bytes(pickle.dumps(d, protocol=4))
        paths.append(p)
    return paths


def spmd_job(world: int, n: int, *, fault: str | None = None, culprit: int = 0,
             at: int | None = None, backend: str = "nccl") -> dict[int, dict[str, Any]]:
    """``world`` ranks x ``n`` entries of an SPMD loop (all_reduce / all_gather).

    ``fault``: None, "extra" (culprit issues one extra all_reduce at seq ``at``), "size"
    (culprit's tensor at ``at`` is bigger), "skip" (culprit never enqueues ``at`` onward).
    Entries before ``at`` are completed, the rest scheduled (the job hangs at ``at``).
    """
    return {r: spmd_rank(world, n, r, fault=fault, culprit=culprit, at=at, backend=backend)
            for r in range(world)}


def spmd_rank(world: int, n: int, rank: int, *, fault: str | None = None, culprit: int = 0,
              at: int | None = None, backend: str = "nccl") -> dict[str, Any]:
    """One rank's dump of ``spmd_job`` (benchmarks build the majority's once and reuse it)."""
    at = n if at is None else at
    frames_ar = user_frames("train_step", 41)
    frames_ag = user_frames("gather_metrics", 57)
    frames_bug = user_frames("maybe_sync", 73)
    entries = []
    seq = 0
    for i in range(1, n + 1):
        if fault == "skip" and rank == culprit and i >= at:
            break
        if fault == "extra" and rank == culprit and i == at:
            seq += 1
            entries.append(entry(seq, "all_reduce", backend=backend, state="scheduled",
                                 frames=frames_bug))
        seq += 1
        if seq > n:
            break
        state = "completed" if seq < at else "scheduled"
        if i % 3 == 0:
            entries.append(entry(seq, "all_gather", backend=backend, sizes=((4,),),
                                 out_sizes=((4 * world,),), state=state, frames=frames_ag))
        else:
            size = 8 if (fault == "size" and rank == culprit and i == at) else 4
            entries.append(entry(seq, "all_reduce", backend=backend, sizes=((size,),),
                                 state=state, frames=frames_ar))
    return dump(rank, entries, world=world)


def pipeline_rank(ranks: int, entries: int, r: int, culprit: int | None = None,
                  fault: str = "size") -> dict[str, Any]:
    """One pipeline stage's dump, a timeline no other rank shares: it receives from the
    previous stage and sends to the next (p2p, default group), with an all_reduce at every
    9th and 10th entry; its call site's line depends on the rank (7 variants).
    ``culprit`` near the end sends an activation of the wrong size (``fault="size"``),
    skips one send (``fault="skip"``) or all-reduces a tensor of another size
    (``fault="collective"``)."""
    out: list[dict[str, Any]] = []
    seq = p2p_seq = 0
    frames = user_frames("stage_step", 30 + r % 7)
    for i in range(entries):
        bad = r == culprit and i == entries - 9
        if i % 10 >= 8:  # sends (odd i) and receives (even i) stay equal in number
            seq += 1
            odd = r == culprit and fault == "collective" and i == entries - 11
            out.append(entry(seq, "all_reduce", sizes=((512,),) if odd else ((1024,),),
                             frames=frames))
            continue
        p2p_seq += 1
        send = i % 2 == 1
        if bad and fault == "skip" and send:
            continue
        peer = (r + 1) % ranks if send else (r - 1) % ranks
        src, dst = (r, peer) if send else (peer, r)
        size = ((128, 1024),) if bad and fault == "size" and send else ((256, 1024),)
        out.append(p2p("send" if send else "recv", src, dst, p2p_seq, sizes=size, frames=frames))
    return dump(r, out, world=ranks)
