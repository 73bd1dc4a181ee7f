"""Load flight-recorder dumps safely: a restricted unpickler, any file names, bad files named.

Dumps come from other machines, so they are never given to ``pickle.load``: the unpickler
here builds plain containers, numbers and strings only and refuses anything that names a
Python object. JSON dumps (``_dump_fr_trace_json``) are read too.

Ranks that recorded the same timeline share one copy (see ``model``): each file's entries are
projected onto the fields analysis compares, and compared, at C speed, with the timelines
already kept; only a new timeline is normalised into ``Entry`` objects.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import io
import json
import os
import pickle
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

from mldebug.fr.model import DumpSet, Entry, Frame, LoadProblem, PgStatus, RankDump, Timeline
from mldebug.names import trailing_number

# Globals a dump may name: containers that old picklers spell as globals. Nothing callable.
_ALLOWED_GLOBALS = {
    ("builtins", "set"), ("builtins", "frozenset"), ("__builtin__", "set"),
    ("__builtin__", "frozenset"), ("collections", "OrderedDict"),
}


class UnsafePickle(pickle.UnpicklingError):
    """The pickle asks for a Python object; flight-recorder dumps never do."""


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickle(f"{module}.{name}")


def safe_loads(data: bytes) -> Any:
    """Decode a dump (pickle or JSON) building only plain data; raises on anything else."""
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        return json.loads(data)
    return _Restricted(io.BytesIO(data)).load()



# Fields that decide whether two ranks recorded the same timeline (time stamps, record and
# thread ids are excluded: they differ between ranks that did the same thing).
_PROJ_KEYS = ("process_group", "collective_seq_id", "p2p_seq_id", "profiling_name",
              "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "state",
              "is_p2p", "frames")
_proj = itemgetter(*_PROJ_KEYS)


def _project(entries: list[dict[str, Any]]) -> list[Any]:
    try:
        return list(map(_proj, entries))
    except (KeyError, TypeError):  # older versions lack some fields
        return [tuple(e.get(k) for k in _PROJ_KEYS) if isinstance(e, dict) else e
                for e in entries]


def expand_inputs(inputs: Sequence[str | Path]) -> list[Path]:
    """Files named directly, plus every regular, non-hidden file inside named directories."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            for child in sorted(p.iterdir()):
                if child.name.startswith(".") or child.name.endswith((".tmp", ".trigger")):
                    continue
                try:
                    if stat.S_ISREG(child.stat().st_mode):
                        files.append(child)
                except OSError:
                    continue
        else:
            files.append(p)
    return files


def load_files(paths: Iterable[str | Path], workers: int | None = None) -> DumpSet:
    """Load every dump; unreadable, empty, truncated or unsafe files become problems.

    Large sets are scanned by ``workers`` processes (default: up to 8, one per CPU, when
    there are 64 files or more); each returns only a fingerprint of the file's timeline, and
    one file per distinct timeline is then read in full here.
    """
    files = [str(p) for p in paths]
    if workers is None:
        workers = min(8, os.cpu_count() or 1) if len(files) >= 64 else 1
    was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived containers, no cycles: the collector only costs
    try:
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=workers) as pool:
                return _assemble(list(pool.map(
                    _scan_light, files, chunksize=max(1, len(files) // (workers * 4)))))
        return _assemble(_scan(f, keep=True) for f in files)  # one file's entries at a time
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class _Scanned:
    file: str
    error: str | None = None
    dump: RankDump | None = None
    fingerprint: bytes = b""
    raw_entries: list[dict[str, Any]] | None = None


def _scan_light(path: str) -> _Scanned:
    return _scan(path, keep=False)


def _scan(name: str, keep: bool) -> _Scanned:
    try:
        data = Path(name).read_bytes()
    except OSError as e:
        return _Scanned(name, f"cannot read: {e.strerror or e}")
    doc, err = _decode(data)
    if err is not None or doc is None:
        return _Scanned(name, err or "unreadable")
    rank, rank_from = _rank_of(doc, name)
    if rank is None:
        return _Scanned(name, "the dump does not say its rank and the file name ends in no "
                        "number; rename it to end in the rank, e.g. fr_rank3")
    raw_entries = doc.get("entries") or []
    if not isinstance(raw_entries, list):
        return _Scanned(name, "'entries' is not a list; not a flight-recorder dump")
    dump = _rank_dump(doc, rank, rank_from, name, len(raw_entries))
    fp = hashlib.blake2b(pickle.dumps(_project(raw_entries), protocol=4),
                         digest_size=20).digest()
    return _Scanned(name, dump=dump, fingerprint=fp, raw_entries=raw_entries if keep else None)


def _assemble(scanned: Iterable[_Scanned]) -> DumpSet:
    ds = DumpSet()
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
            raw = sc.raw_entries
            if raw is None:  # scanned by a worker: read this timeline's file in full
                again = _scan(sc.file, keep=True)
                raw = again.raw_entries or []
            try:
                entries = [_entry(e) for e in raw]
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                ds.problems.append(LoadProblem(sc.file, f"malformed entry ({type(e).__name__}: "
                                               f"{e}); not a flight-recorder dump of a known version"))
                continue
            idx = by_fp[sc.fingerprint] = len(ds.timelines)
            ds.timelines.append(Timeline([dump.rank], entries))
        dump.timeline = idx
        ds.dumps[dump.rank] = dump
    return ds


def load(inputs: Sequence[str | Path]) -> DumpSet:
    return load_files(expand_inputs(inputs))


def _decode(data: bytes) -> tuple[dict[str, Any] | None, str | None]:
    if not data:
        return None, "empty file (the rank died or was killed while dumping?); skipped"
    try:
        doc = safe_loads(data)
    except UnsafePickle as e:
        return None, (f"refused: the pickle asks for the Python object '{e}', which a "
                      "flight-recorder dump never contains; it may run code, so it was not "
                      "loaded. Do not open it with pickle.load")
    except (EOFError, pickle.UnpicklingError, ValueError, IndexError, json.JSONDecodeError,
            UnicodeDecodeError, MemoryError) as e:
        return None, (f"truncated or corrupt ({type(e).__name__}: {str(e)[:80]}); the dump was "
                      "probably cut short; skipped")
    if not isinstance(doc, dict) or "entries" not in doc:
        return None, "not a flight-recorder dump (no 'entries'); skipped"
    return doc, None


def _rank_of(doc: dict[str, Any], name: str) -> tuple[int | None, str]:
    meta = doc.get("mldebug")
    for value in (doc.get("rank"), meta.get("rank") if isinstance(meta, dict) else None):
        if isinstance(value, int):
            return value, "content"
    number = trailing_number(name)
    if number is not None:
        return number, "filename"
    return None, ""


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    if isinstance(value, (list, tuple, set, frozenset)) and value:
        try:
            return tuple(sorted(int(r) for r in value))
        except (TypeError, ValueError):
            return None
    return None


def _rank_dump(doc: dict[str, Any], rank: int, rank_from: str, name: str,
               count: int) -> RankDump:
    meta_raw = doc.get("mldebug")
    meta: dict[str, Any] = meta_raw if isinstance(meta_raw, dict) else {}
    dump = RankDump(rank=rank, file=name, version=str(doc.get("version", "?")),
                    rank_from=rank_from, entry_count=count,
                    host=meta.get("host"), pid=meta.get("pid"),
                    world_size=meta.get("world_size"), reason=meta.get("reason"))
    cfg = doc.get("pg_config") or {}
    if isinstance(cfg, dict):
        for key, val in cfg.items():
            if isinstance(val, dict):
                pg_name = str(val.get("name", key))
                desc = str(val.get("desc", ""))
                ranks = _parse_ranks(val.get("ranks"))
            elif isinstance(val, (list, tuple)) and len(val) >= 2:
                pg_name, desc, ranks = str(key), str(val[0]), _parse_ranks(val[1])
            else:
                continue
            if pg_name == "" and ranks is None:
                continue  # gloo writes {'': {'name': '', 'desc': '', 'ranks': '[]'}}
            dump.pg_config[pg_name] = (desc, ranks)
    status = doc.get("pg_status") or {}
    if isinstance(status, dict):
        for key, val in status.items():
            if isinstance(val, dict):
                dump.pg_status[str(key)] = PgStatus(
                    _int(val.get("last_enqueued_collective")),
                    _int(val.get("last_started_collective")),
                    _int(val.get("last_completed_collective")))
    return dump


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _sizes(v: Any) -> tuple[tuple[int, ...], ...]:
    if not v:
        return ()
    return tuple(tuple(int(x) for x in s) if isinstance(s, (list, tuple)) else (int(s),)
                 for s in v)


_frame_cache: dict[tuple[str, str, int], Frame] = {}


def _frames(v: Any) -> tuple[Frame, ...]:
    out = []
    for f in v or ():
        if isinstance(f, dict):
            key = (str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line", 0) or 0))
            fr = _frame_cache.get(key)
            if fr is None:
                fr = _frame_cache[key] = Frame(*key)
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


def _entry(e: dict[str, Any]) -> Entry:
    pg = e.get("process_group") or (str(e.get("pg_id", "?")), "")
    if isinstance(pg, (list, tuple)):
        pg_name, pg_desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    else:
        pg_name, pg_desc = str(pg), ""
    prof = str(e.get("profiling_name") or "")
    backend, op, src, dst = parse_profiling_name(prof)
    seq = e.get("collective_seq_id", e.get("seq_id", -1))
    is_p2p = bool(e.get("is_p2p", op in ("send", "recv")))
    return Entry(
        record_id=int(e.get("record_id", -1)),
        pg_id=_int(e.get("pg_id")),
        pg_name=pg_name,
        pg_desc=pg_desc,
        seq=int(seq if seq is not None else -1),
        p2p_seq=int(e.get("p2p_seq_id") or 0),
        profiling_name=prof,
        backend=backend,
        op=op,
        input_sizes=_sizes(e.get("input_sizes")),
        output_sizes=_sizes(e.get("output_sizes")),
        input_dtypes=tuple(str(d) for d in e.get("input_dtypes") or ()),
        output_dtypes=tuple(str(d) for d in e.get("output_dtypes") or ()),
        state=str(e.get("state") or "?"),
        is_p2p=is_p2p,
        frames=_frames(e.get("frames")),
        src=src,
        dst=dst,
        time_created_ns=_int(e.get("time_created_ns")),
        time_started_ns=_int(e.get("time_discovered_started_ns")),
        time_completed_ns=_int(e.get("time_discovered_completed_ns")),
        timeout_ms=_int(e.get("timeout_ms")),
    )
