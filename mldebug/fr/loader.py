"""Load flight-recorder dumps safely: a restricted unpickler, any file names, bad files named.

Dumps come from other machines, so they are never given to ``pickle.load``: the unpickler
here builds plain containers, numbers and strings only and refuses anything that names a
Python object. JSON dumps (``_dump_fr_trace_json``) are read too.

Ranks that recorded the same timeline share one copy (see ``model``). Each file becomes
columns: an entry is the index of its static part (op, group, sizes, dtypes, call site;
found by its pickled raw fields, at C speed, and normalised once per distinct value) plus
its numbers. A fingerprint of the columns finds the ranks that share a timeline.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import pickle
import re
import stat
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import count, repeat
from operator import countOf, is_not, itemgetter
from pathlib import Path
from typing import Any

from mldebug.fr.model import (
    NOT_RECORDED,
    P2P_OPS,
    BlockedIn,
    CallFrame,
    DumpSet,
    Entry,
    GroupIndex,
    LoadProblem,
    PgStatus,
    RankDump,
    Static,
    Timeline,
    packed,
    pick,
)
from mldebug.names import trailing_number
from mldebug.nodekit import read_fd
from mldebug.safeload import DeepNesting, UnsafePickle, decode, on_stack, stack_needed

# Bounds on outside data: a dump larger or deeper than these is refused, not analysed.
MAX_FILE_BYTES = 1 << 30
MAX_ENTRIES = 1_000_000
MAX_TENSORS = 4096  # sizes per entry
MAX_DIMS = 64
MAX_FRAMES = 512
MAX_TEXT = 4096  # characters of a name, dtype or file name
MAX_WORLD = 1 << 18  # ranks: larger world sizes in a dump are not believed
MAX_INT = 1 << 62  # sizes, sequence numbers, lines


class BadDump(ValueError):
    """A dump that breaks a bound or a type the format fixes; the message says which."""


def _files_in(d: Path) -> list[Path]:
    """The regular, non-hidden files of ``d`` (a symlink planted in a shared directory is not
    followed), sorted."""
    files = []
    try:
        children = sorted(d.iterdir())
    except OSError:
        return []
    for child in children:
        if child.name.startswith(".") or child.name.endswith((".tmp", ".trigger")):
            continue
        try:
            if stat.S_ISREG(child.lstat().st_mode):
                files.append(child)
        except OSError:
            continue
    return files


def _real_dir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(p.lstat().st_mode)
    except OSError:
        return False


def _newest_trigger(d: Path) -> Path | None:
    """The newest ``triggered/<token>/`` folder of a recorder's directory (mldebug.fr.enable
    writes each trigger's dumps there), never through a link."""
    t = d / "triggered"
    if not _real_dir(t):
        return None
    try:
        folders = [c for c in t.iterdir() if _real_dir(c) and _files_in(c)]
    except OSError:
        return None
    return max(folders, key=lambda c: c.lstat().st_mtime, default=None)


def expand_inputs(inputs: Sequence[str | Path], notes: list[str] | None = None) -> list[Path]:
    """Files named directly, plus every regular, non-hidden file inside named directories. A
    recorder's own directory (``$MLDEBUG_FR_DIR``) with no dump at its top (nothing failed)
    gives the dumps of its newest trigger (``triggered/<token>/``), else of torch's native
    dumps (``nccl/``); ``notes`` gets a line saying which folder was read."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = _recorder_files(p, notes)
            if not found and not _real_dir(p / "triggered"):
                # the default directory holds one folder per job (fr.enable()): the newest
                from mldebug.fr.node import job_homes

                for home in job_homes(str(p), 64):
                    found = _recorder_files(Path(home), None)
                    if found:
                        if notes is not None:
                            notes.append(f"{p} holds one folder per job: read the newest with "
                                         f"dumps, {home} ({len(found)} file(s)); "
                                         "'mldebug fr trigger --list' lists them all.")
                        break
            files.extend(found)
        else:
            files.append(p)
    return files


def _recorder_files(p: Path, notes: list[str] | None) -> list[Path]:
    """The dumps of one directory: its top, else its newest trigger, else torch's own."""
    found = _files_in(p)
    if not found:
        sub = _newest_trigger(p) or (p / "nccl" if _real_dir(p / "nccl") else None)
        found = _files_in(sub) if sub is not None else []
        if found and notes is not None and sub is not None:
            what = ("its newest trigger" if sub.parent.name == "triggered"
                    else "torch's native dumps")
            notes.append(f"{p} has no dump at its top: read the {len(found)} file(s) "
                         f"of {sub} ({what}).")
    return found


def load_files(paths: Iterable[str | Path], workers: int | None = None) -> DumpSet:
    """Load every dump; unreadable, empty, truncated or unsafe files become problems.

    Large sets are read by ``workers`` processes (default: up to 8, one per CPU, when there
    are 64 files or more). Each worker turns a file into compact columns (see ``_scan``) and
    sends back only its fingerprint when it already sent a file with the same timeline, so
    an SPMD job's 1,024 identical timelines cross the pipe a few times, and a pipeline
    job's 1,024 different ones are built in parallel and cross it as arrays.
    """
    files = [str(p) for p in paths]
    if workers is None:
        workers = min(8, os.cpu_count() or 1) if len(files) >= 64 else 1
    was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived containers, no cycles: the collector only costs
    try:
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            # chunks of ~16 files a worker on 1,024 files: a chunk's results cross the pipe
            # as one message, held whole by the main process (64-file chunks: ~10 MB each)
            with ProcessPoolExecutor(max_workers=workers, initializer=_forget_seen) as pool:
                return _assemble(pool.map(_scan, files,
                                          chunksize=max(1, len(files) // (workers * 32))))
        _forget_seen()
        try:
            return _assemble(map(_scan, files))
        finally:
            _forget_seen()
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class _Part:
    """One file's timeline as columns, with its own table of statics (local ids)."""

    keys: list[bytes]  # local static id -> its raw fields, pickled (the cross-file key)
    statics: list[Static]
    states: list[str]  # local state id -> name
    sid: array[int]
    seq: array[int]
    p2p_seq: array[int]
    record_id: array[int]
    state: array[int]
    started: array[int]
    completed: array[int]
    timeout: array[int]
    groups: dict[str, GroupIndex]


@dataclass
class _Scanned:
    file: str
    error: str | None = None
    dump: RankDump | None = None
    fingerprint: bytes = b""
    part: _Part | None = None  # None: this process already returned this timeline


# Fingerprints of the timelines this process has returned in full (a worker's memory).
_seen: set[bytes] = set()


def _forget_seen() -> None:
    _seen.clear()


def _read_bounded(name: str) -> bytes:
    """The file's bytes, at most ``MAX_FILE_BYTES``: one read of the size ``fstat`` gives
    (a read of the limit allocates a 1 GiB buffer, and touches fresh pages, for every
    file), then the rest if it grew."""
    # O_NONBLOCK: a FIFO opens at once and is refused below, instead of waiting for a writer
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadDump("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise BadDump(f"{st.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit for one dump")
        data = os.read(fd, st.st_size + 1)
        if data and len(data) != st.st_size:  # it grew, or a short read: read on, bounded
            data += read_fd(fd, MAX_FILE_BYTES + 1 - len(data))
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise BadDump(f"over the {MAX_FILE_BYTES}-byte limit for one dump")
    return data


def _scan(name: str) -> _Scanned:
    try:
        return _scan_checked(name)
    except (BadDump, KeyError, TypeError, ValueError, AttributeError, OverflowError,
            RecursionError, MemoryError) as e:
        return _Scanned(name, f"malformed ({type(e).__name__}: {_short(e)}); skipped")


def rank_times(dump: RankDump) -> tuple[array[int], array[int]]:
    """One rank's own start and completion times (``NOT_RECORDED`` where absent), aligned
    with its timeline's entries. Ranks that share a timeline share its entries, not their
    times, and keeping two more columns for every rank of a 16,384-rank job would cost about
    0.5 GB; the straggler's phase (fr.stragglers) needs them for a few dozen ranks, so they
    are read again from that rank's file, bounded as ``load_files`` reads it, and cached on
    the dump. Empty columns when the file cannot be read again."""
    if dump.started or dump.completed:
        return dump.started, dump.completed
    try:
        data = _read_bounded(dump.file)
        if stack_needed(data):
            raise BadDump("deeply nested")
        doc, err = _decode(data)
        raw = doc.get("entries") if isinstance(doc, dict) and err is None else None
        if not isinstance(raw, list) or not all(map(isinstance, raw, repeat(dict))):
            raise BadDump("no entries")
        _, number_row = _getters(raw)
        fields = _number_fields(raw, number_row)
        dump.started, dump.completed = _number_column(fields, raw, 4), _number_column(fields, raw, 5)
    except (OSError, BadDump, DeepNesting, KeyError, TypeError, ValueError, AttributeError,
            OverflowError, RecursionError, MemoryError):
        pass
    return dump.started, dump.completed


def _short(e: BaseException) -> str:
    try:
        return str(e)[:160]
    except Exception:  # noqa: BLE001 - str() of a huge int in a message raises ValueError
        return "?"


def _scan_checked(name: str) -> _Scanned:
    try:
        data = _read_bounded(name)
    except OSError as e:
        return _Scanned(name, f"cannot read: {e.strerror or e}")
    try:
        need = stack_needed(data)
    except DeepNesting as e:
        return _Scanned(name, _nesting_problem(e))
    if need:  # decoded and scanned (all its values hashed, normalised) on a stack that fits
        return on_stack(need, partial(_scan_data, name, data))  # type: ignore[no-any-return]
    return _scan_data(name, data)


def _nesting_problem(e: DeepNesting) -> str:
    return (f"{e}: hashing them would crash this process (a nesting bomb); not a "
            "flight-recorder dump; skipped")


def _scan_data(name: str, data: bytes) -> _Scanned:
    doc, err = _decode(data)
    if err is not None or doc is None:
        return _Scanned(name, err or "unreadable")
    return _scan_doc(name, doc, len(data))


def _scan_doc(name: str, doc: dict[str, Any], nbytes: int) -> _Scanned:
    rank, rank_from = _rank_of(doc, name)
    if rank is None:
        return _Scanned(name, "the dump does not say its rank and the file name ends in no "
                        "number; rename it to end in the rank, e.g. fr_rank3")
    raw = doc.get("entries") or []
    if not isinstance(raw, list):
        return _Scanned(name, "'entries' is not a list; not a flight-recorder dump")
    if len(raw) > MAX_ENTRIES:
        return _Scanned(name, f"{len(raw)} entries, over the {MAX_ENTRIES} limit; skipped")
    if not all(map(isinstance, raw, repeat(dict))):
        bad = next(e for e in raw if not isinstance(e, dict))
        return _Scanned(name, f"malformed entry (an entry is a {type(bad).__name__}, not a "
                        "mapping); not a flight-recorder dump of a known version; skipped")
    dump = _rank_dump(doc, rank, rank_from, name, len(raw))
    static_key, number_row = _getters(raw)
    keys, sid = _static_ids(raw, nbytes, static_key)
    fields = _number_fields(raw, number_row)
    dump.created = _number_column(fields, raw, 0)
    seq = _number_column(fields, raw, 1)
    p2p_seq = _number_column(fields, raw, 2)
    states, state = _states(tuple(e.get("state") for e in raw) if fields is None else fields[-1])
    fp = hashlib.blake2b(digest_size=20)
    for k in keys:
        fp.update(k)
    for col in (sid, seq, p2p_seq, state):
        fp.update(col)
    fp.update("\0".join(states).encode("utf-8", "surrogatepass"))
    digest = fp.digest()
    if digest in _seen:
        return _Scanned(name, dump=dump, fingerprint=digest)
    try:
        statics = [_static(raw[first]) for first in _firsts(sid, len(keys))]
    except (BadDump, KeyError, TypeError, ValueError, AttributeError, OverflowError,
            RecursionError) as e:
        return _Scanned(name, f"malformed entry ({type(e).__name__}: {_short(e)}); not a "
                        "flight-recorder dump of a known version; skipped")
    record_id, started, completed, timeout = (_number_column(fields, raw, k) for k in range(3, 7))
    part = _Part(keys, statics, states, sid, seq, p2p_seq, record_id, state, started, completed,
                 timeout, _group_index(statics, sid, seq))
    _seen.add(digest)
    return _Scanned(name, dump=dump, fingerprint=digest, part=part)


def _getters(raw: list[dict[str, Any]]) -> tuple[itemgetter[Any], itemgetter[Any]]:
    """``_static_key`` and ``_NUMBER_ROW`` spelled with the dump's own key strings, taken from
    its first entry: a dict lookup with the very object it stores skips comparing the
    strings, which halves reading 17 fields of 2,000 entries (every entry's keys are the
    same objects: the pickle stores each once). Lookups are by equality either way."""
    own: dict[str, str] = {}
    if raw:
        wanted = _WANTED
        for k in raw[0]:  # keys of a decoded pickle: str, int, tuple... (any hashable)
            if type(k) is str and k in wanted:
                own[k] = k
    if not own:
        return _static_key, _NUMBER_ROW
    get = own.get
    return (itemgetter(*(get(k, k) for k in _STATIC_KEYS)),
            itemgetter(*(get(k, k) for k in _NUMBER_ROW_KEYS)))


def _static_ids(raw: list[dict[str, Any]], nbytes: int,
                static_key: Callable[[dict[str, Any]], Any]) -> tuple[list[bytes], array[int]]:
    """Each entry's static fields, pickled (C speed) as the key that finds the entries that
    share them; the key's index is the entry's local static id.

    The keys' total size is bounded by the file's: a "memo bomb" (one list referenced by
    millions of entries, a few bytes each in the file) would make every key large.
    """
    try:
        return _static_ids_with(raw, nbytes, static_key)
    except KeyError:  # older versions lack some fields
        return _static_ids_with(raw, nbytes, _static_key_of_old)


def _static_key_of_old(e: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(e.get(f) for f in _STATIC_KEYS)


def _static_ids_with(raw: list[dict[str, Any]], nbytes: int,
                     key: Callable[[dict[str, Any]], Any]) -> tuple[list[bytes], array[int]]:
    budget = 64 * nbytes + 100_000
    ids: dict[bytes, int] = {}
    dumps = pickle.dumps
    # entries of one call repeat its static fields: an entry is compared (C-level equality,
    # which stops at shared objects) with the last few distinct ones seen for its op name,
    # the one it last matched first, and pickled only when it matches none of them
    recent: dict[Any, list[tuple[Any, int]]] = {}
    recent_of = recent.get
    out: list[int] = []
    append = out.append
    for sk in map(key, raw):
        name = sk[0]  # the op name (profiling_name) leads the static keys
        try:
            seen = recent_of(name)
        except TypeError:  # an unhashable op name: no shortcut
            seen = name = None
        if seen is not None:
            first = seen[0]
            if first[0] == sk:  # the usual case: the same call as the last of this op
                append(first[1])
                continue
        got: int | None = None
        if seen is not None:
            for j in range(1, len(seen)):
                if seen[j][0] == sk:
                    got = seen[j][1]
                    seen.insert(0, seen.pop(j))  # matched last: compared first next time
                    break
        if got is None:
            k = dumps(sk, 4)
            budget -= len(k)
            if budget < 0:
                raise BadDump("the entries expand to far more data than the file holds (shared "
                              "references repeated: a pickle 'memo bomb'); refused")
            got = ids.get(k)
            if got is None:
                got = ids[k] = len(ids)
            if name is not None:
                if seen is None:
                    seen = recent[name] = []
                seen.insert(0, (sk, got))
                del seen[8:]
        append(got)
    return list(ids), packed("i", out)


def _firsts(sid: array[int], n: int) -> list[int]:
    """The index of the first entry with each local static id 0..n-1."""
    firsts = [-1] * n
    missing = n
    for i, s in enumerate(sid):
        if firsts[s] < 0:
            firsts[s] = i
            missing -= 1
            if not missing:
                break
    return firsts


def _number_fields(raw: list[dict[str, Any]],
                   row: Callable[[dict[str, Any]], Any] | None = None,
                   ) -> list[tuple[Any, ...]] | None:
    """Every entry's number fields and state (``_NUMBER_ROW``, or ``row`` that reads the
    same), one tuple per field, read in one pass at C speed while each entry's dict is in
    cache; None when a field is absent somewhere (older versions): then ``_column`` reads
    them entry by entry."""
    try:
        rows = list(map(row or _NUMBER_ROW, raw))
    except KeyError:
        return None
    return list(zip(*rows, strict=True)) if rows else [()] * (len(_NUMBERS) + 1)


def _number_column(fields: list[tuple[Any, ...]] | None, raw: list[dict[str, Any]],
                   k: int) -> array[int]:
    key, conv = _NUMBERS[k]
    return _column(raw, key, conv) if fields is None else _column_of(fields[k], raw, key, conv)


def _column(raw: list[dict[str, Any]], key: str, conv: Any) -> array[int]:
    """One number per entry (see ``_column_of``); ``conv`` also handles an absent field."""
    try:
        values = tuple(map(itemgetter(key), raw))
    except KeyError:
        return array("q", [conv(e) for e in raw])
    return _column_of(values, raw, key, conv)


def _column_of(values: tuple[Any, ...], raw: list[dict[str, Any]], key: str,
               conv: Any) -> array[int]:
    """``values`` (field ``key`` of every entry) as a column, equal to ``conv`` of every
    entry: at C speed when they are integers that ``conv`` keeps as they are, with None
    ("not recorded": not started yet, timing off) among them, else entry by entry (older
    names, bad values: bools, floats, strings, integers out of range)."""
    n = len(values)
    ints = countOf(map(type, values), int)  # exactly int: a bool is not a number here
    nones = 0 if ints == n else values.count(None)
    if ints + nones == n:
        fill = conv({key: None}) if nones else 0
        if nones == n:
            return array("q", [fill]) * n
        present = tuple(filter(partial(is_not, None), values)) if nones else values
        try:
            col = packed("q", present)
        except struct.error:  # out of the int64 range
            pass
        else:
            if _kept(col, key, conv):
                return packed("q", tuple(map({None: fill}.get, values, values))) if nones else col
    return array("q", [conv(e) for e in raw])


_TOP_UNDER_2_62 = bytes(range(0x40))  # the high byte of an int64 in [0, 2**62)


def _kept(col: array[int], key: str, conv: Any) -> bool:
    """Whether ``conv`` keeps every value of ``col`` as it is. Every conv keeps an interval of
    integers: when it keeps the smallest and the largest value, it keeps them all. Values
    all in [0, 2**62) are seen at C speed from their high bytes: then, when conv keeps
    2**62 - 1, the largest needs no pass, and the smallest none either when conv keeps 0."""
    if (sys.byteorder == "little" and col.itemsize == 8
            and not col.tobytes()[7::8].translate(None, _TOP_UNDER_2_62)
            and conv({key: MAX_INT - 1}) == MAX_INT - 1):
        if conv({key: 0}) == 0:
            return True
        lo = min(col)  # a conv that reads 0 as "unknown" (creation stamps): only the smallest
        return bool(conv({key: lo}) == lo)
    lo, hi = min(col), max(col)
    return bool(conv({key: lo}) == lo and conv({key: hi}) == hi)


def _collective_seq(e: dict[str, Any]) -> int:
    return _seq(e.get("collective_seq_id", e.get("seq_id", -1)), -1)


def _p2p_seq(e: dict[str, Any]) -> int:
    return _seq(e.get("p2p_seq_id") or 0, 0)


def _record_id(e: dict[str, Any]) -> int:
    return _seq(e.get("record_id"), -1)


def _time(key: str) -> Callable[[dict[str, Any]], int]:
    def conv(e: dict[str, Any]) -> int:
        v = _int(e.get(key))
        return NOT_RECORDED if v is None else v
    return conv


def _states(values: tuple[Any, ...]) -> tuple[list[str], array[int]]:
    """The state names in order of appearance and each entry's index into them, from every
    entry's ``state`` field (at C speed; one that cannot be a name reads as "?")."""
    try:
        ids: dict[Any, Any] = dict.fromkeys(values)
    except TypeError:  # a list where a name belongs
        values = tuple(map(_hashable_or_none, values))
        ids = dict.fromkeys(values)
    names: list[str] = []
    by_name: dict[str, int] = {}
    for v in ids:
        name = _state_name(v)
        got = by_name.get(name)
        if got is None:
            got = by_name[name] = len(names)
            names.append(name)
        ids[v] = got
    return names, packed("i", tuple(map(ids.__getitem__, values)))


def _state_name(v: Any) -> str:
    return sys.intern(_text(v or "?", 64))


def _hashable_or_none(v: Any) -> Any:
    try:
        hash(v)
    except TypeError:
        return None
    return v


def _group_index(statics: list[Static], sid: array[int], seq: array[int]) -> dict[str, GroupIndex]:
    """Per process group: its collectives sorted by sequence number, its sends and receives
    by peer (group-local); entries that are neither (e.g. a coalesced p2p batch) are left out."""
    coll: dict[str, list[int]] = {}
    p2p: dict[str, dict[tuple[bool, int], list[int]]] = {}
    ignored: list[int] = []
    where = []
    for st in statics:
        if st.collective:
            where.append(coll.setdefault(st.pg_name, []))
            continue
        peers = p2p.setdefault(st.pg_name, {})
        send = st.op == "send"
        peer = st.dst if send else st.src
        where.append(peers.setdefault((send, peer), []) if st.op in P2P_OPS and peer is not None
                     else ignored)
    # each entry's index appended to its static's list, at C speed (append returns None)
    any(map(list.append, map(where.__getitem__, sid), count()))
    out: dict[str, GroupIndex] = {}
    for pg in coll.keys() | p2p.keys():
        order = sorted(coll.get(pg, ()), key=seq.__getitem__)  # stable: coalesced keep order
        values = pick(seq, order)
        if len(set(values)) == len(values):  # no coalesced entries: one entry per seq
            seqs, starts = packed("q", values), packed("i", range(len(order) + 1))
        else:
            seqs, starts = array("q"), array("i")
            last = None
            for k, v in enumerate(values):
                if v != last:
                    seqs.append(v)
                    starts.append(k)
                    last = v
            starts.append(len(order))
        out[pg] = GroupIndex(seqs, starts, packed("i", order),
                             {key: packed("i", idx) for key, idx in p2p.get(pg, {}).items()
                              if idx})
    return out


def _assemble(scanned: Iterable[_Scanned]) -> DumpSet:
    ds = DumpSet()
    gid: dict[bytes, int] = {}
    state_id: dict[str, int] = {}
    by_fp: dict[bytes, int] = {}
    for sc in scanned:
        if sc.error is not None or sc.dump is None:
            ds.problems.append(LoadProblem(sc.file, sc.error or "unreadable"))
            continue
        dump = sc.dump
        if dump.rank in ds.dumps:
            ds.duplicates.setdefault(dump.rank, [ds.dumps[dump.rank].file]).append(sc.file)
            continue
        idx = by_fp.get(sc.fingerprint)
        if idx is not None:
            ds.timelines[idx].ranks.append(dump.rank)
        else:
            part = sc.part
            if part is None:  # returned light by a worker that saw it first: read it here
                _seen.discard(sc.fingerprint)
                again = _scan(sc.file)
                _seen.discard(sc.fingerprint)
                if again.part is None:
                    ds.problems.append(LoadProblem(sc.file, again.error or "unreadable"))
                    continue
                part = again.part
            idx = by_fp[sc.fingerprint] = len(ds.timelines)
            ds.timelines.append(_timeline(ds, part, dump, gid, state_id))
        dump.timeline = idx
        ds.dumps[dump.rank] = dump
    return ds


def _timeline(ds: DumpSet, part: _Part, dump: RankDump, gid: dict[bytes, int],
              state_id: dict[str, int]) -> Timeline:
    """A worker's part with its local static and state ids turned into the set's."""
    trans = []
    for key, st in zip(part.keys, part.statics, strict=True):
        g = gid.get(key)
        if g is None:
            g = gid[key] = len(ds.statics)
            ds.statics.append(st)
        trans.append(g)
    strans = []
    for name in part.states:
        g = state_id.get(name)
        if g is None:
            g = state_id[name] = len(ds.states)
            ds.states.append(name)
        strans.append(g)
    sid = _translate(part.sid, trans)
    state = _translate(part.state, strans)
    return Timeline([dump.rank], ds.statics, ds.states, sid, part.seq, part.p2p_seq,
                    part.record_id, state, part.started, part.completed, part.timeout,
                    dump.created, part.groups, sorted(set(trans)))


def _translate(col: array[int], trans: list[int]) -> array[int]:
    """``trans[v]`` for every value of ``col`` (local ids, 0 to len(trans) - 1): ``col``
    itself when ``trans`` is the identity; at C speed when ids fit a byte (each byte of
    the result is a ``bytes.translate`` of the local ids, interleaved by slice assignment);
    else value by value."""
    n = len(trans)
    if trans == list(range(n)):
        return col
    if (n <= 256 and col.itemsize == 4 and sys.byteorder == "little"
            and all(0 <= g < 1 << 31 for g in trans)):
        local = col.tobytes()[0::4]  # the low byte holds the whole id
        out = bytearray(4 * len(col))
        for b in range(4):
            table = bytes((g >> (8 * b)) & 255 for g in trans) + bytes(256 - n)
            out[b::4] = local.translate(table)
        got = array("i")
        got.frombytes(out)
        return got
    return array("i", map(trans.__getitem__, col))


def load(inputs: Sequence[str | Path]) -> DumpSet:
    return load_files(expand_inputs(inputs))


def from_docs(docs: Iterable[tuple[str, dict[str, Any]]]) -> DumpSet:
    """A DumpSet from dumps already in memory, (name, document) pairs (tests, benchmarks,
    tools that hold trusted documents): the same checks and columns as files get."""
    _forget_seen()
    try:
        return _assemble(_scan_doc(name, doc, MAX_FILE_BYTES) for name, doc in docs)
    finally:
        _forget_seen()


def _decode(data: bytes) -> tuple[dict[str, Any] | None, str | None]:
    if not data:
        return None, "empty file (the rank died or was killed while dumping?); skipped"
    try:
        doc = decode(data)  # the caller chose the stack (``stack_needed``)
    except UnsafePickle as e:
        return None, (f"refused: the pickle asks for the Python object '{e}', which a "
                      "flight-recorder dump never contains; it may run code, so it was not "
                      "loaded. Do not open it with pickle.load")
    except (EOFError, pickle.UnpicklingError, ValueError, IndexError, json.JSONDecodeError,
            UnicodeDecodeError, MemoryError, RecursionError, KeyError, TypeError,
            OverflowError, AttributeError) as e:
        return None, (f"truncated or corrupt ({type(e).__name__}: {_short(e)[:80]}); the dump was "
                      "probably cut short; skipped")
    if not isinstance(doc, dict) or "entries" not in doc:
        return None, "not a flight-recorder dump (no 'entries'); skipped"
    return doc, None


def _rank_of(doc: dict[str, Any], name: str) -> tuple[int | None, str]:
    meta = doc.get("mldebug")
    for value in (doc.get("rank"), meta.get("rank") if isinstance(meta, dict) else None):
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < MAX_WORLD:
                raise BadDump(f"rank {_short_value(value)} is not a rank (0 to {MAX_WORLD - 1})")
            return value, "content"
    number = trailing_number(os.path.basename(name))
    if number is not None and number < MAX_WORLD:
        return number, "filename"
    return None, ""


_RANKS_TEXT = re.compile(r"[\[({]?\s*(\d{1,9}\s*(,\s*\d{1,9}\s*)*,?)?\s*[\])}]?")


_ranks_cache: dict[str, tuple[int, ...] | None] = {}


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    """Group members from '[0, 1]' (torch writes a string) or a list; None if not that.
    Every rank's dump repeats the same strings: each is parsed once per process."""
    if isinstance(value, str) and len(value) <= 1 << 18:  # the cache holds at most 16 MiB
        if value in _ranks_cache:
            return _ranks_cache[value]
        if len(_ranks_cache) >= 64:
            _ranks_cache.clear()
        got = _ranks_cache[value] = _parse_ranks_uncached(value)
        return got
    return _parse_ranks_uncached(value)


def _parse_ranks_uncached(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str):
        if len(value) > 16 * MAX_WORLD or not _RANKS_TEXT.fullmatch(value):
            return None
        value = [int(x) for x in re.findall(r"\d+", value)]
    if isinstance(value, (list, tuple, set, frozenset)) and 0 < len(value) <= MAX_WORLD:
        if all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_WORLD
               for r in value):
            return tuple(sorted(value))
    return None


def _rank_dump(doc: dict[str, Any], rank: int, rank_from: str, name: str,
               count: int) -> RankDump:
    meta_raw = doc.get("mldebug")
    meta: dict[str, Any] = meta_raw if isinstance(meta_raw, dict) else {}
    world = _int(meta.get("world_size"))
    dump = RankDump(rank=rank, file=name, version=_text(doc.get("version", "?")),
                    rank_from=rank_from, entry_count=count,
                    host=_text(meta["host"]) if isinstance(meta.get("host"), str) else None,
                    pid=_int(meta.get("pid")),
                    world_size=world if world is not None and 0 < world <= MAX_WORLD else None,
                    reason=_text(meta["reason"]) if isinstance(meta.get("reason"), str) else None,
                    blocked_in=_blocked_in(meta.get("blocked_in")),
                    dumped_at=_when(meta.get("time")))
    cfg = doc.get("pg_config") or {}
    if isinstance(cfg, dict):
        for key, val in cfg.items():
            if isinstance(val, dict):
                pg_name = _text(val.get("name", key))
                desc = _text(val.get("desc", ""))
                ranks = _parse_ranks(val.get("ranks"))
            elif isinstance(val, (list, tuple)) and len(val) >= 2:
                pg_name, desc, ranks = _text(key), _text(val[0]), _parse_ranks(val[1])
            else:
                continue
            if pg_name == "" and ranks is None:
                continue  # gloo writes {'': {'name': '', 'desc': '', 'ranks': '[]'}}
            dump.pg_config[pg_name] = (desc, ranks)
    status = doc.get("pg_status") or {}
    if isinstance(status, dict):
        for key, val in status.items():
            if isinstance(val, dict):
                dump.pg_status[_text(key)] = PgStatus(  # torch's JSON dump writes strings
                    _num(val.get("last_enqueued_collective")),
                    _num(val.get("last_started_collective")),
                    _num(val.get("last_completed_collective")))
    return dump


def _when(v: Any) -> float | None:
    """A wall-clock time in seconds (mldebug's dump time), or None when not a sane one."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e11:
        return float(v)
    return None


def _blocked_in(v: Any) -> BlockedIn | None:
    """mldebug's ``blocked_in`` block (``{"op", "peer", "frames": [[name, file, line]]}``),
    bounded; None when absent or malformed."""
    if not isinstance(v, dict) or not isinstance(v.get("op"), str):
        return None
    peer = _int(v.get("peer"))
    frames = []
    raw = v.get("frames")
    if isinstance(raw, list):
        for f in raw[:8]:
            if (isinstance(f, (list, tuple)) and len(f) == 3 and isinstance(f[0], str)
                    and isinstance(f[1], str) and _int(f[2]) is not None):
                frames.append(CallFrame(_text(f[0], 256), _text(f[1], 4096), int(f[2])))
    return BlockedIn(_text(v["op"], 64), peer if peer is not None and 0 <= peer < MAX_WORLD
                     else None, tuple(frames))


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and -MAX_INT < v < MAX_INT else None


def _stamp(e: Any) -> int:
    t = e.get("time_created_ns") if isinstance(e, dict) else None
    return t if isinstance(t, int) and not isinstance(t, bool) and 0 < t < MAX_INT else -1


def _num(v: Any) -> int | None:
    """An integer written as a number or as its decimal string ('2', '-1')."""
    if isinstance(v, str) and 0 < len(v) <= 19 and v.lstrip("-").isdecimal():
        return int(v)
    return _int(v)


def _text(v: Any, limit: int = MAX_TEXT) -> str:
    """A string field as text: strings cut at ``limit``, bounded ints and floats spelled,
    anything else (huge ints, containers) as '?'."""
    if isinstance(v, str):
        return v[:limit]
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v) if -MAX_INT < v < MAX_INT else "?"
    if isinstance(v, float):
        return repr(v)
    return "?"


def _texts(v: Any) -> tuple[str, ...]:
    """A field that is a string or a list of strings (dtypes): never split into characters."""
    if not v:
        return ()
    if isinstance(v, (str, int, float)):
        return (_text(v, 64),)
    if isinstance(v, (list, tuple)):
        if len(v) > MAX_TENSORS:
            raise BadDump(f"{len(v)} dtypes, over the {MAX_TENSORS} limit")
        return tuple(_text(x, 64) for x in v)
    raise BadDump(f"a dtype field is a {type(v).__name__}")


def _dim(x: Any) -> int:
    if isinstance(x, int) and not isinstance(x, bool) and 0 <= x < MAX_INT:
        return x
    raise BadDump(f"tensor size {_short_value(x)} is not a size (0 to 2**62)")


def _short_value(x: Any) -> str:
    if isinstance(x, int) and not -MAX_INT < x < MAX_INT:
        return f"an integer of {x.bit_length()} bits"
    return repr(x)[:40] if isinstance(x, (str, float, bool, type(None))) else type(x).__name__


_interned: dict[Any, Any] = {}


def _intern(v: Any) -> Any:
    """One shared copy of equal sizes/dtypes tuples (millions of entries repeat a few)."""
    got = _interned.get(v)
    if got is None:
        if len(_interned) > 1_000_000:
            _interned.clear()
        got = _interned[v] = v
    return got


def _sizes(v: Any) -> tuple[tuple[int, ...], ...]:
    return _intern(_sizes_raw(v))  # type: ignore[no-any-return]


def _sizes_raw(v: Any) -> tuple[tuple[int, ...], ...]:
    if not v:
        return ()
    if not isinstance(v, (list, tuple)) or len(v) > MAX_TENSORS:
        raise BadDump(f"sizes are not a list of at most {MAX_TENSORS} shapes")
    out = []
    for s in v:
        if isinstance(s, (list, tuple)):
            if len(s) > MAX_DIMS:
                raise BadDump(f"a shape of {len(s)} dimensions, over {MAX_DIMS}")
            out.append(tuple(_dim(x) for x in s))
        else:
            out.append((_dim(s),))
    return tuple(out)


_frame_cache: dict[tuple[str, str, int], CallFrame] = {}


def _frames(v: Any) -> tuple[CallFrame, ...]:
    if not v:
        return ()
    if not isinstance(v, (list, tuple)):
        raise BadDump(f"frames are a {type(v).__name__}, not a list")
    out = []
    for f in v[:MAX_FRAMES]:
        if isinstance(f, dict):
            line = _int(f.get("line", 0))
            key = (_text(f.get("name", "?")), _text(f.get("filename", "?")),
                   line if line is not None and line >= 0 else 0)
            fr = _frame_cache.get(key)
            if fr is None:
                if len(_frame_cache) > 1_000_000:
                    _frame_cache.clear()
                fr = _frame_cache[key] = CallFrame(*key)
            out.append(fr)
    return tuple(out)


def parse_profiling_name(name: str) -> tuple[str, str, int | None, int | None]:
    """'nccl:send 0->1' -> ('nccl', 'send', 0, 1); 'gloo:all_reduce' -> ('gloo', 'all_reduce', ...)."""
    backend, _, rest = name.partition(":")
    if not rest:
        backend, rest = "", name
    parts = rest.split(" ", 1)
    op = parts[0]
    src = dst = None
    if len(parts) == 2:
        meta = parts[1].strip()
        if "->" in meta:
            s, d = meta.split("->", 1)
            src, dst = _maybe_int(s), _maybe_int(d)
        elif "<-" in meta:
            d, s = meta.split("<-", 1)
            src, dst = _maybe_int(s), _maybe_int(d)
    return backend, op, src, dst


def _maybe_int(s: str) -> int | None:
    try:
        return int(s)
    except ValueError:
        return None


def _seq(v: Any, default: int) -> int:
    if v is None:
        return default
    n = _int(v)
    if n is None:
        raise BadDump(f"a sequence number is {_short_value(v)}, not an integer")
    return n


_STATIC_KEYS = ("profiling_name", "process_group", "pg_id", "input_sizes", "output_sizes",
                "input_dtypes", "output_dtypes", "frames", "is_p2p")
_static_key = itemgetter(*_STATIC_KEYS)
_NUMBERS = (("time_created_ns", _stamp), ("collective_seq_id", _collective_seq),
            ("p2p_seq_id", _p2p_seq), ("record_id", _record_id),
            ("time_discovered_started_ns", _time("time_discovered_started_ns")),
            ("time_discovered_completed_ns", _time("time_discovered_completed_ns")),
            ("timeout_ms", _time("timeout_ms")))
_NUMBER_ROW_KEYS = (*(k for k, _ in _NUMBERS), "state")
_NUMBER_ROW = itemgetter(*_NUMBER_ROW_KEYS)
_WANTED = frozenset((*_STATIC_KEYS, *_NUMBER_ROW_KEYS))


def _static(e: dict[str, Any]) -> Static:
    """The fields many entries share (op, group, sizes, dtypes, frames), normalised."""
    pg = e.get("process_group") or (_text(e.get("pg_id", "?")), "")
    if isinstance(pg, (list, tuple)) and pg:
        pg_name, pg_desc = _text(pg[0]), _text(pg[1]) if len(pg) > 1 else ""
    else:
        pg_name, pg_desc = _text(pg), ""
    prof = sys.intern(_text(e.get("profiling_name") or "", 1024))
    backend, op, src, dst = parse_profiling_name(prof)
    is_p2p = bool(e.get("is_p2p", op in ("send", "recv")))
    return Static(_int(e.get("pg_id")), sys.intern(pg_name), pg_desc, prof, sys.intern(backend),
                  sys.intern(op), _sizes(e.get("input_sizes")), _sizes(e.get("output_sizes")),
                  _intern(_texts(e.get("input_dtypes"))), _intern(_texts(e.get("output_dtypes"))),
                  is_p2p, _frames(e.get("frames")), src, dst)


def _entry(e: dict[str, Any]) -> Entry:
    """One raw entry as an ``Entry``, converted on its own: the reference the columns
    (``Timeline.entry``) are tested against; loading builds columns instead."""
    if not isinstance(e, dict):
        raise BadDump(f"an entry is a {type(e).__name__}, not a mapping")
    st = _static(e)
    return Entry(
        record_id=_record_id(e), pg_id=st.pg_id, pg_name=st.pg_name, pg_desc=st.pg_desc,
        seq=_collective_seq(e), p2p_seq=_p2p_seq(e), profiling_name=st.profiling_name,
        backend=st.backend, op=st.op, input_sizes=st.input_sizes, output_sizes=st.output_sizes,
        input_dtypes=st.input_dtypes, output_dtypes=st.output_dtypes,
        state=_state_name(e.get("state")), is_p2p=st.is_p2p, frames=st.frames,
        src=st.src, dst=st.dst, time_created_ns=_int(e.get("time_created_ns")),
        time_started_ns=_int(e.get("time_discovered_started_ns")),
        time_completed_ns=_int(e.get("time_discovered_completed_ns")),
        timeout_ms=_int(e.get("timeout_ms")))
