"""Pure hang analysis: reduce stacks to signatures, group ranks, classify where each group
waits, and pick the suspects - the ranks that are not where the others are.

No I/O here: the same functions analyse live collections, saved directories and pasted
py-spy text, and are tested on fixtures.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from mldebug.hang.model import (
    Collection,
    Frame,
    Group,
    Process,
    Report,
    Suspect,
    Thread,
    main_thread,
    proc_label,
)
from mldebug.render import fold_ints

# torch.distributed entry points a rank can block in (names of the Python functions).
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_coalesced", "_all_gather_base", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "broadcast_object_list",
    "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "barrier",
    "monitored_barrier", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "send_object_list", "recv_object_list", "new_group",
    "new_subgroups", "init_process_group", "destroy_process_group",
})
# torch functions that are a collective wait in disguise.
_TORCH_WAITS = {
    ("torch/autograd/", "_engine_run_backward"): "backward",
    ("torch/autograd/", "backward"): "backward",
    ("torch/distributed/rendezvous.py", "_create_c10d_store"): "init_process_group",
    ("torch/distributed/elastic/rendezvous", "next_rendezvous"): "init_process_group",
}
_NATIVE_WAITS = (("c10d::Work::wait", "wait"), ("c10d::ProcessGroupNCCL::WorkNCCL::wait", "wait"))

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"threading", "concurrent"}
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_SIMPLE_REPR = re.compile(r"^-?[0-9][0-9_.eE+-]*$|^(True|False|None)$|^'[^']{0,40}'$")


# -- frames ----------------------------------------------------------------------------
def frame_kind(f: Frame) -> str:
    """'native', 'torch', 'library' (other packages, stdlib) or 'user'."""
    if f.native:
        return "native"
    path = f.filename.replace("\\", "/")
    short = (f.short or path).replace("\\", "/")
    if "/torch/" in path or short.startswith("torch/"):
        return "torch"
    if short.startswith("<frozen") or "/site-packages/" in path or "/dist-packages/" in path:
        return "library"
    if re.search(r"/lib/python3\.\d+/", path):
        return "library"
    if "/" not in path or path == short:  # text dumps carry short names only
        top = short.split("/", 1)[0].removesuffix(".py")
        if top in _STDLIB:
            return "library"
        if "/" in short:  # a package-relative name like deepspeed/runtime/engine.py
            return "library"
    return "user"


def python_frames(frames: Iterable[Frame]) -> list[Frame]:
    return [f for f in frames if not f.native]


def user_frames(frames: Iterable[Frame]) -> list[Frame]:
    return [f for f in frames if frame_kind(f) == "user"]


def where(frames: Sequence[Frame]) -> str:
    """The innermost user frame, else the innermost Python frame, else the innermost frame."""
    for pick in (user_frames(frames), python_frames(frames), list(frames)):
        if pick:
            return pick[0].location
    return "(no frames)"


def call_site(frames: Sequence[Frame]) -> str | None:
    users = user_frames(frames)
    if not users:
        return None
    f = users[0]
    return f"{f.display_file}:{f.line} in {f.name}"


def collective_of(frames: Sequence[Frame]) -> str | None:
    """Name the torch.distributed call the innermost frames are blocked in, if any.

    Python frames decide; a native ``c10d::Work::wait`` (with --native) names the wait on an
    async collective's handle when no Python collective frame is there.
    """
    native_wait = None
    for f in frames:
        if f.native:
            for sym, name in _NATIVE_WAITS:
                if native_wait is None and f.name.startswith(sym):
                    native_wait = name
            continue
        kind = frame_kind(f)
        if kind == "user":
            # the innermost Python code is the user's own: not in a collective, unless it
            # waits on an async collective's Work handle
            return native_wait
        path = (f.short or f.filename).replace("\\", "/")
        if "torch/distributed/" in path and f.name in COLLECTIVES:
            return f.name
        for (frag, fname), label in _TORCH_WAITS.items():
            if frag in path and f.name == fname:
                return label
        if ("/comm/" in path or "/distributed/" in path) and f.name in COLLECTIVES:
            return f.name  # deepspeed.comm, megatron wrappers, ... (before torch's frames)
    return native_wait


def frame_key(f: Frame) -> tuple[str, str, int]:
    return (f.short or f.filename, f.name, f.line)


def thread_signature(t: Thread) -> tuple[tuple[str, str, int], ...]:
    return tuple(frame_key(f) for f in t.frames if not (f.native and _HEX.match(f.name)))


def process_signature(p: Process, all_threads: bool, threads: list[Thread] | None = None) -> tuple:
    ts = p.threads if threads is None else threads
    if all_threads:
        return tuple(sorted((t.name, thread_signature(t)) for t in ts))
    mt = main_thread(ts, p.pid)
    return thread_signature(mt) if mt else ()


def locals_key(frames: Sequence[Frame]) -> tuple[tuple[str, str], ...]:
    """Simple scalar locals of the innermost user frame (loop counters, flags)."""
    users = user_frames(frames)
    if not users:
        return ()
    return tuple((k, v) for k, v in users[0].locals if _SIMPLE_REPR.match(v.strip()))


# -- grouping --------------------------------------------------------------------------
def _frames_for(p: Process) -> list[Frame]:
    mt = p.main_thread()
    return mt.frames if mt else []


def _split_by_locals(members: list[Process]) -> dict[tuple, list[Process]]:
    """Split ranks with identical stacks by the loop state of their innermost user frame.

    Only locals that tell ranks apart for a reason count: values equal to the rank or local
    rank (``rank``, ``local_rank``...) and values every member shares are ignored. What is
    left (``step=1`` vs ``step=0``) is the book's "code loops" case made visible.
    """
    per_proc = {id(p): dict(locals_key(_frames_for(p))) for p in members}
    names = set().union(*(d.keys() for d in per_proc.values())) if per_proc else set()
    telling = []
    for name in sorted(names):
        values = [per_proc[id(p)].get(name) for p in members]
        if len(set(values)) <= 1:
            continue
        if all(v is not None and v in (str(p.rank), str(p.local_rank))
               for v, p in zip(values, members, strict=True)):
            continue
        telling.append(name)
    out: dict[tuple, list[Process]] = defaultdict(list)
    for p in members:
        d = per_proc[id(p)]
        out[tuple((n, d.get(n, "?")) for n in telling)].append(p)
    return out


def group_processes(processes: Sequence[Process], all_threads: bool = False) -> list[Group]:
    by_code: dict[tuple, list[Process]] = defaultdict(list)
    for p in processes:
        by_code[process_signature(p, all_threads)].append(p)
    buckets: dict[tuple, list[Process]] = {}
    for sig, members in by_code.items():
        if len(members) > 1 and any(f.locals for f in _frames_for(members[0])):
            for lkey, sub in _split_by_locals(members).items():
                buckets[(sig, lkey)] = sub
        else:
            buckets[(sig, ())] = members
    groups = []
    for (_, lkey), members in buckets.items():
        frames = _frames_for(members[0])
        ranks = sorted(p.rank for p in members if p.rank is not None)
        groups.append(Group(
            ranks=ranks,
            pids=sorted((p.host, p.pid) for p in members),
            hosts=sorted({p.host for p in members}),
            where=where(frames),
            collective=collective_of(frames),
            frames=frames,
            locals_key=lkey,
        ))
    groups.sort(key=lambda g: (-len(g.pids), g.ranks[:1] or [1 << 62], g.pids[:1]))
    return groups


# -- missing ranks ---------------------------------------------------------------------
def _most_common(values: Iterable[int | None]) -> int | None:
    counts = Counter(v for v in values if v is not None)
    return counts.most_common(1)[0][0] if counts else None


def missing_ranks(processes: Sequence[Process]) -> tuple[int | None, list[int], dict[int, str]]:
    """World size, ranks absent from the collection, and the host each should be on."""
    world = _most_common(p.world_size for p in processes)
    if world is None:
        return None, [], {}
    found = {p.rank for p in processes if p.rank is not None}
    missing = [r for r in range(world) if r not in found]
    expected: dict[int, str] = {}
    lws = _most_common(p.local_world_size for p in processes)
    by_node: dict[int, str] = {}
    for p in processes:
        node = p.node_rank
        if node is None and lws and p.rank is not None:
            node = p.rank // lws  # launchers place ranks on nodes in blocks of local size
        if node is not None:
            by_node.setdefault(node, p.host)
    spans: dict[str, tuple[int, int]] = {}
    for p in processes:
        if p.rank is None:
            continue
        lo, hi = spans.get(p.host, (p.rank, p.rank))
        spans[p.host] = (min(lo, p.rank), max(hi, p.rank))
    for r in missing:
        if lws and (r // lws) in by_node:
            expected[r] = by_node[r // lws]
            continue
        for host, (lo, hi) in spans.items():
            if lo <= r <= hi:
                expected[r] = host
                break
    return world, missing, expected


# -- verdict ---------------------------------------------------------------------------
def _ranks_text(g: Group) -> str:
    if g.ranks and len(g.ranks) == len(g.pids):
        return ("rank " if len(g.ranks) == 1 else "ranks ") + fold_ints(g.ranks)
    return ", ".join(proc_label(h, pid) for h, pid in g.pids[:8]) + (" ..." if len(g.pids) > 8 else "")


def _place_ranks(groups: Sequence[Group], idx: Sequence[int]) -> str:
    ranks = sorted(r for i in idx for r in groups[i].ranks)
    pids = [hp for i in idx for hp in groups[i].pids]
    if ranks and len(ranks) == len(pids):
        return ("rank " if len(ranks) == 1 else "ranks ") + fold_ints(ranks)
    return ", ".join(proc_label(h, pid) for h, pid in pids[:8]) + (" ..." if len(pids) > 8 else "")


def _verb(groups: Sequence[Group], idx: Sequence[int]) -> str:
    return "wait" if sum(len(groups[i].pids) for i in idx) > 1 else "waits"


def _place(g: Group) -> str:
    return f"in {g.collective} at {g.where}" if g.collective else f"at {g.where} (not in a collective)"


def _loop_note(g: Group, ref: Group) -> str:
    gu, ru = user_frames(g.frames), user_frames(ref.frames)
    if gu and ru and gu[0].name == ru[0].name and gu[0].display_file == ru[0].display_file:
        if gu[0].line != ru[0].line:
            return (" - same function, different line: the ranks are at different points of a "
                    "loop or branch (the book's 'code loops' case)")
        if g.locals_key != ref.locals_key and (g.locals_key or ref.locals_key):
            mine = ", ".join(f"{k}={v}" for k, v in g.locals_key)
            theirs = ", ".join(f"{k}={v}" for k, v in ref.locals_key)
            return (f" - same call site, different state ({mine} vs {theirs}): the ranks are in "
                    "different iterations of the same loop")
    return ""


def _suspects_from(groups: Sequence[Group], by_key: dict[tuple[str, int], Process],
                   reason_for: dict[int, str]) -> list[Suspect]:
    out = []
    for gi, g in enumerate(groups):
        if gi not in reason_for:
            continue
        for host, pid in g.pids:
            p = by_key[(host, pid)]
            out.append(Suspect(rank=p.rank, host=host, pid=pid, reason=reason_for[gi],
                               call_site=call_site(g.frames)))
    out.sort(key=lambda s: (s.rank if s.rank is not None else 1 << 62, s.host, s.pid))
    return out


def _apply_watch(processes: Sequence[Process], groups: list[Group], all_threads: bool) -> None:
    by_key = {(p.host, p.pid): p for p in processes}
    for g in groups:
        states = set()
        for key in g.pids:
            p = by_key[key]
            if p.threads_later is None:
                continue
            same = process_signature(p, all_threads) == process_signature(
                p, all_threads, p.threads_later)
            states.add("stuck" if same else "moving")
        if states:
            g.state = states.pop() if len(states) == 1 else "mixed"


def analyze(collection: Collection, *, all_threads: bool = False) -> Report:
    """Group the ranks and name the odd ones out."""
    procs = sorted(collection.processes,
                   key=lambda p: (p.rank if p.rank is not None else 1 << 62, p.host, p.pid))
    errors = list(collection.errors)
    world, missing, expected = missing_ranks(procs)
    hints: list[str] = []
    run_ids = {p.run_id for p in procs if p.run_id}
    if len(run_ids) > 1:
        hints.append(f"found ranks of {len(run_ids)} different jobs (run ids "
                     f"{', '.join(sorted(run_ids))}); narrow with --pid or --pattern")
    if not procs:
        return Report([], [], [], [], {}, errors,
                      "No rank processes were found"
                      + (" (see errors)." if errors else ": is the job running on these hosts? "
                         "Use --pid or --pattern if its processes carry no RANK variable."),
                      "no-processes", None, hints, collection.watch)
    groups = group_processes(procs, all_threads)
    if collection.watch is not None:
        _apply_watch(procs, groups, all_threads)
    by_key = {(p.host, p.pid): p for p in procs}
    reason_for: dict[int, str] = {}
    # A "place" is where a rank is, for the verdict: the collective and the user call site.
    # Groups whose stacks differ only inside torch (rank 0 hosting the store during init,
    # say) are in the same place.
    place_of: dict[tuple, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        place_of[(g.collective, g.where, g.locals_key)].append(i)
    places = sorted(place_of.values(), key=lambda idx: -sum(len(groups[i].pids) for i in idx))
    in_coll = [idx for idx in places if groups[idx[0]].collective]
    out_coll = [idx for idx in places if not groups[idx[0]].collective]
    kind = "suspects"
    verdict = ""
    if len(places) == 1:
        g = groups[places[0][0]]
        kind = "same-place"
        verdict = (f"All {len(procs)} ranks are in the same place: {_place(g)}. "
                   "No odd one out in the Python stacks.")
        if g.collective and not missing:
            hints.append("every rank waits in the same collective: the cause is likely below "
                         "Python (NCCL, network, a GPU) or ranks in different iterations of a "
                         "loop - try --locals, 'mldebug env' on the nodes, and 'mldebug fr "
                         "trigger' + 'mldebug fr analyze' for the flight recorder")
    elif in_coll and out_coll:
        wait_desc = "; ".join(
            f"{_place_ranks(groups, idx)} {_verb(groups, idx)} {_place(groups[idx[0]])}"
            for idx in in_coll[:3])
        for idx in out_coll:
            for i in idx:
                reason_for[i] = f"not in any collective (at {groups[i].where}) while {wait_desc}"
    elif missing and not out_coll:
        kind = "same-place"  # ranks wait in different collectives, but some never arrived
        verdict = ("The ranks present wait in collectives: "
                   + "; ".join(f"{_place_ranks(groups, idx)} {_place(groups[idx[0]])}"
                               for idx in places[:4]) + ".")
    else:
        sizes = [sum(len(groups[i].pids) for i in idx) for idx in places]
        if sizes[0] == sizes[1]:
            kind = "ambiguous"
            verdict = ("No majority: the ranks split into equal groups in different places - "
                       + "; ".join(f"{_place_ranks(groups, idx)} {_place(groups[idx[0]])}"
                                   for idx in places[:4])
                       + ". One side issued a call the other did not.")
            hints.append("the flight recorder shows which collective each rank issued last: "
                         "'mldebug fr trigger' then 'mldebug fr analyze'")
        else:
            ref_idx = places[0]
            ref = groups[ref_idx[0]]
            ref_txt = _place_ranks(groups, ref_idx)
            for idx in places[1:]:
                for i in idx:
                    g = groups[i]
                    reason_for[i] = (f"{_place(g)} while the majority ({ref_txt}) "
                                     f"{'wait' if ref.collective else 'are'} {_place(ref)}"
                                     + _loop_note(g, ref))
    suspects = _suspects_from(groups, by_key, reason_for)
    if collection.watch is not None:
        moving = [s for s in suspects if _state_of(groups, s) == "moving"]
        if moving and len(moving) == len(suspects):
            hints.append("the suspects' stacks changed between the two dumps: they are slow, "
                         "not stuck")
        if all(g.state == "moving" for g in groups):
            hints.append(f"every rank's stack changed within {collection.watch:g}s: the job is "
                         "making progress (slow, not hung)")
    if not verdict and suspects:
        names = ", ".join(s_label(s) for s in suspects[:8]) + (" ..." if len(suspects) > 8 else "")
        first = suspects[0]
        verdict = f"Suspect{'s' if len(suspects) > 1 else ''}: {names} - {first.reason}."
    if missing:
        miss = fold_ints(missing)
        where_txt = ""
        hosts = sorted({expected[r] for r in missing if r in expected})
        if hosts:
            where_txt = f" (expected on {', '.join(hosts)})"
        verdict = (f"Rank{'s' if len(missing) > 1 else ''} {miss} of {world} "
                   f"{'are' if len(missing) > 1 else 'is'} missing{where_txt}: it may have "
                   "crashed or never started, and the others may be waiting for it. " + verdict)
        hints.append("check the missing ranks' logs and the kernel log (dmesg) for OOM kills")
        if kind == "same-place":
            kind = "suspects"
    return Report(
        processes=procs, groups=groups, suspects=suspects, missing_ranks=missing,
        missing_hosts=expected, errors=errors, verdict=verdict, verdict_kind=kind,
        world_size=world, hints=hints, watch=collection.watch,
    )


def _state_of(groups: Sequence[Group], s: Suspect) -> str | None:
    for g in groups:
        if (s.host, s.pid) in g.pids:
            return g.state
    return None


def s_label(s: Suspect) -> str:
    if s.rank is not None:
        return f"rank {s.rank} ({s.host}, pid {s.pid})" if s.host else f"rank {s.rank} (pid {s.pid})"
    return proc_label(s.host, s.pid)
