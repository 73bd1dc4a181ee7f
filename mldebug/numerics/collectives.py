"""The collective fingerprint's pure part: one collective as a compact entry, the step's hash
over its entries, and the comparison of the ranks' sequences when the hashes differ. No torch
here (the wrappers that observe the collectives are in :mod:`mldebug.numerics.fingerprint`).

An entry is ``[op, reduce_op, group, shape, dtype]``: ``"all_reduce", "SUM", "world",
[64, 256], "float32"``. ``group`` is ``"world"`` for the default group, else ``"g<size>"``
(group names are counters that legitimately differ across ranks of a 2-D mesh); the shape of
``all_to_all*`` keeps its trailing dimensions only (its first one is the rank's own split).
"""

from __future__ import annotations

import zlib
from typing import Any

MASK = (1 << 61) - 1  # the hash stays positive with room for -h in an int64
MAX_ENTRIES = 256  # entries kept per step for the comparison (all of them are hashed)
MAX_DIMS = 8

Entry = list[Any]


def entry_key(e: Entry) -> bytes:
    return "|".join(str(x) for x in e).encode()


def fold(h: int, e: Entry) -> int:
    """The step's hash after one more collective (order matters)."""
    return (h * 0x100000001B3 + zlib.crc32(entry_key(e)) + 1) & MASK


def _valid_entry(e: Any) -> bool:
    return (isinstance(e, list) and len(e) == 5 and all(isinstance(x, str) for x in
            (e[0], e[1], e[2], e[4])) and isinstance(e[3], list) and len(e[3]) <= MAX_DIMS
            and all(isinstance(d, int) and not isinstance(d, bool) for d in e[3]))


def compare(seqs: dict[int, list[Entry]]) -> dict[str, Any]:
    """The first collective at which the ranks' sequences differ, what most ranks did there,
    and each differing rank's entry (None: that rank had no collective there).

    ``seqs``: rank -> its step's entries (at most :data:`MAX_ENTRIES`). Ties between values
    go to the one the lowest rank holds. ``index`` is None when every kept entry agrees (the
    difference lies beyond the first :data:`MAX_ENTRIES`)."""
    ranks = sorted(seqs)
    longest = max((len(s) for s in seqs.values()), default=0)
    for i in range(longest):
        at = {r: (seqs[r][i] if i < len(seqs[r]) else None) for r in ranks}
        keys = {r: (None if v is None else entry_key(v)) for r, v in at.items()}
        if len(set(keys.values())) == 1:
            continue
        counts: dict[bytes | None, int] = {}
        for k in keys.values():
            counts[k] = counts.get(k, 0) + 1
        best = max(counts.values())
        ref = next(keys[r] for r in ranks if counts[keys[r]] == best)
        ref_rank = next(r for r in ranks if keys[r] == ref)
        differing = [r for r in ranks if keys[r] != ref]
        return {"index": i, "expected": at[ref_rank], "expected_ranks": len(ranks) -
                len(differing), "differing": differing,
                "entries": {str(r): at[r] for r in differing},
                "lengths": {str(r): len(seqs[r]) for r in ranks}}
    return {"index": None, "expected": None, "expected_ranks": len(ranks), "differing": [],
            "entries": {}, "lengths": {str(r): len(seqs[r]) for r in ranks}}


def describe(e: Entry | None) -> str:
    """``all_reduce(MAX, world, [8] float32)``; ``nothing`` for a rank without it."""
    if not _valid_entry(e):
        return "nothing"
    assert e is not None
    shape = "[" + ", ".join(str(d) for d in e[3]) + "]"
    red = f"{e[1]}, " if e[1] else ""
    return f"{e[0][:40]}({red}{e[2][:16]}, {shape} {e[4][:16]})"


def clean_entry(e: Any) -> Entry | None:
    """An entry read back from a record (outside data): kept only when well formed."""
    if not _valid_entry(e):
        return None
    return [e[0][:40], e[1][:16], e[2][:16], list(e[3]), e[4][:16]]


# ---- riding a SUM all-reduce ---------------------------------------------------------------
# DDP's gradient all-reduce is a SUM: the hash cannot ride it as a MIN/MAX. Instead each rank
# appends, per chunk c of the hash's low 32 bits, c and c*c; from the sums every rank sees
# whether all ranks' chunks are equal (sum(c*c) * world == sum(c) ** 2 exactly when they
# are: Cauchy-Schwarz). Chunks are small enough that every sum is an integer fp32 holds
# exactly (< 2**24), so no rounding can hide or invent a difference.

def ride_bits(world: int) -> int:
    """Bits per chunk: 8 up to 256 ranks, 4 up to 74,000, else 2."""
    return 8 if world <= 256 else (4 if world <= 74_000 else 2)


def ride_encode(h: int, world: int) -> list[float]:
    bits = ride_bits(world)
    mask = (1 << bits) - 1
    chunks = [(h >> (i * bits)) & mask for i in range(32 // bits)]
    return [float(c) for c in chunks] + [float(c * c) for c in chunks]


def ride_equal(sums: list[float], world: int) -> bool:
    """From the reduced [c..., c*c...]: True when every rank sent the same chunks."""
    k = len(sums) // 2
    for s1, s2 in zip(sums[:k], sums[k:], strict=True):
        a, b = round(s1), round(s2)
        if b * world != a * a:
            return False
    return True
