"""Where each rank's main thread waits (mldebug's ``blocked_in``), across ranks: the evidence
the flight recorder itself lacks on gloo - send/recv are never recorded, and no entry says a
broadcast's root. Pure functions over a DumpSet's RankDumps, linear in the ranks."""

from __future__ import annotations

from collections import Counter, defaultdict

from mldebug.fr.model import DumpSet, Mismatch, SignatureGroup

SENDS = frozenset({"send", "isend"})
RECVS = frozenset({"recv", "irecv"})
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})


def _fold(rs: list[int]) -> str:
    from mldebug.render import fold_ints

    return fold_ints(rs)


def _where(ds: DumpSet, rank: int) -> str:
    b = ds.dumps[rank].blocked_in
    if b is None:
        return "no call recorded"
    site = f" at {b.frames[0]}" if b.frames else ""
    peer = f" {'to' if b.op in SENDS else 'from'} rank {b.peer}" if b.peer is not None else ""
    return f"{b.op}{peer}{site}"


def p2p_waits(ds: DumpSet, pg: str, desc: str) -> Mismatch | None:
    """A send that no posted recv takes: its peer waits to receive from another rank, and some
    other rank waits for a message from the sender - the sender named the wrong peer. Or the
    mirror: a rank waits to receive from a rank that is not sending to it while a send to it
    is blocked and nobody waits for the sender - it named the wrong source. A peer that is
    only busy (in no send/recv) decides nothing: a live trigger catches healthy pipelines so."""
    sends: dict[int, int] = {}
    recvs: dict[int, int] = {}
    for r, d in ds.dumps.items():
        b = d.blocked_in
        if b is None or b.peer is None:
            continue
        if b.op in SENDS:
            sends[r] = b.peer
        elif b.op in RECVS:
            recvs[r] = b.peer
    if not sends:
        return None
    waiting_for: dict[int, list[int]] = defaultdict(list)
    for y, s in recvs.items():
        waiting_for[s].append(y)
    wrong_dst: list[tuple[int, int, list[int]]] = []
    wrong_src: list[tuple[int, int, int]] = []
    for s, x in sorted(sends.items()):
        if recvs.get(x) == s:
            continue  # matched: stuck for another reason (sizes, the transport)
        expect = sorted(y for y in waiting_for.get(s, []) if y != x)
        if expect and x in recvs:  # x demonstrably waits for another source (not just busy)
            wrong_dst.append((s, x, expect))
        elif x in recvs and sends.get(recvs[x]) != x and not waiting_for.get(s):
            wrong_src.append((x, recvs[x], s))
    if wrong_dst:
        culprits = sorted({s for s, _, _ in wrong_dst})
        why = "; ".join(
            f"rank {s} is blocked sending to rank {x} (which waits to receive from rank "
            f"{recvs[x]}), "
            f"while rank(s) {_fold(exp)} wait to receive from rank {s}: rank {s} sent to the "
            f"wrong peer" for s, x, exp in wrong_dst)
    elif wrong_src:
        culprits = sorted({x for x, _, _ in wrong_src})
        why = "; ".join(
            f"rank {x} waits to receive from rank {z}, which is not sending to it, while rank "
            f"{s} is blocked sending to rank {x} and nobody waits for rank {s}: rank {x} named "
            f"the wrong source" for x, z, s in wrong_src)
    else:
        return None
    why += (" (from where each rank's main thread waited when it dumped: gloo records no "
            "send/recv in the flight recorder).")
    groups = [SignatureGroup([r], _where(ds, r),
                             [str(f) for f in ds.dumps[r].blocked_in.frames[:2]]  # type: ignore[union-attr]
                             if ds.dumps[r].blocked_in else [])
              for r in sorted(set(sends) | set(recvs))][:16]
    return Mismatch(pg, desc, 0, "p2p", culprits, why, groups, p2p=True)


def gloo_broadcast_blocked(members: list[int], roots: dict[int, int], root: int) -> set[int]:
    """The ranks gloo's broadcast would leave stuck if every member passed ``root`` except the
    ranks in ``roots``, which pass theirs. gloo's tree: with v the rank's index from the root
    (v = (i - root_index) mod n), v receives from v minus its highest set bit, then posts its
    sends to v + 2^k for every 2^k above its highest bit, and waits for all of them; a
    message matches only when the receiver expects it from that sender."""
    n = len(members)
    index = {r: i for i, r in enumerate(members)}
    if root not in index or any(v not in index for v in roots.values()):
        return set()

    def plan(r: int) -> tuple[int | None, list[int]]:
        base = index[roots.get(r, root)]
        v = (index[r] - base) % n
        parent = None if v == 0 else members[(v - (1 << (v.bit_length() - 1)) + base) % n]
        step = 1 << v.bit_length() if v else 1
        kids = []
        while v + step < n:
            kids.append(members[(v + step + base) % n])
            step <<= 1
        return parent, kids

    plans = {r: plan(r) for r in members}
    got = {r for r, (parent, _) in plans.items() if parent is None}
    todo = list(got)
    while todo:
        r = todo.pop()
        for c in plans[r][1]:
            if c not in got and plans[c][0] == r:
                got.add(c)
                todo.append(c)
    return {r for r in members
            if r not in got or any(plans[c][0] != r for c in plans[r][1])}


def root_votes(ds: DumpSet, m: Mismatch) -> Mismatch | None:
    """Ranks that never enqueued the others' #seq because they are still in a rooted
    collective (broadcast, reduce, gather, scatter) whose root they disagree on: the root
    the majority of them pass is right; on a tie nobody can tell from the dumps."""
    absent = next((g.ranks for g in m.groups if g.description == "(not enqueued)"), None)
    if not absent or m.kind != "missing" or m.p2p:
        return None
    roots: dict[int, int] = {}
    ops = set()
    for r in absent:
        d = ds.dumps.get(r)
        b = d.blocked_in if d is not None else None
        if b is None or b.op not in ROOTED or b.peer is None:
            return None
        roots[r] = b.peer
        ops.add(b.op)
    if len(ops) != 1 or len(set(roots.values())) < 2:
        return None
    (op,) = ops
    votes = Counter(roots.values()).most_common()
    by_root = "; ".join(f"rank(s) {_fold(sorted(r for r, v in roots.items() if v == root))}: "
                        f"root {root}" for root, _ in votes)
    groups = [SignatureGroup(sorted(r for r, v in roots.items() if v == root),
                             f"{op} with root {root}",
                             [str(f) for f in ds.dumps[next(r for r, v in roots.items() if v == root)]
                              .blocked_in.frames[:2]])  # type: ignore[union-attr]
              for root, _ in votes]
    head = (f"rank(s) {_fold(sorted(roots))} never enqueued #{m.seq}: they are still in the "
            f"{op} before it, and pass different roots to it ({by_root}); the other rank(s) "
            "completed it and went on. ")
    present = m.groups[0].ranks if m.groups and m.groups[0].description != "(not enqueued)" else []
    members = sorted(set(present) | set(roots))
    gloo = all(st.backend == "gloo" for st in ds.statics if st.pg_name == m.pg)
    fits = ([root for root, _ in votes
             if gloo_broadcast_blocked(members, roots, root) == set(roots)]
            if op == "broadcast" and gloo and len(members) <= 4096 else [])
    if len(fits) == 1:
        right = fits[0]
        culprits = sorted(r for r, v in roots.items() if v != right)
        other = next(root for root, _ in votes if root != right)
        instead = sorted(gloo_broadcast_blocked(members, roots, other))
        why = head + (f"gloo broadcasts along a binomial tree from the root; of the roots these "
                      f"ranks pass, only {right} predicts exactly which ranks completed it and "
                      f"which are still in it (root {other} would leave rank(s) "
                      f"{_fold(instead) or 'none'} in it instead): the rank(s) passing another "
                      "root are the culprits.")
    elif len(votes) > 1 and votes[0][1] > votes[1][1]:
        right = votes[0][0]
        culprits = sorted(r for r, v in roots.items() if v != right)
        why = head + (f"Majority vote on the root: {right}; the rank(s) passing another root "
                      f"are the culprits.")
    else:
        culprits = sorted(roots)
        why = head + (f"A tie: the flight recorder does not record a {op}'s root, so which of "
                      "them is right cannot be told from these dumps. What would tell: the root "
                      f"the ranks that completed it passed (the {op}'s src argument at its call "
                      "site on those ranks).")
    return Mismatch(m.pg, m.pg_desc, m.seq, "root", culprits, why, groups)
