"""The sentinel's records: one JSON line per event, one file per rank, in a private directory;
read back (bounded, bad files skipped with their reason) and merged into one verdict.

Layering: :func:`append_record` is what a rank calls (collection); :func:`load_records` reads
a directory (collection of outside data: bounded); :func:`analyze` is pure (records in, a
:class:`SentinelReport` out) and :func:`render` prints it. No torch here.

A record (``kind`` "nonfinite")::

    {"v": 1, "kind": "nonfinite", "rank": 2, "world_size": 4, "host": "node7", "pid": 123,
     "time": 1764600000.0, "step": 7, "micro_batch": 0, "origin": true, "origins": [2],
     "loss_finite": true, "first_bucket": {"index": 0, "params": ["layers.3.gate.weight"]},
     "reduce_overflow": false, "replay": {"status": "reproduced", "reproducible": true,
     "phase": "backward", "module": "layers.3.gate", "cls": "Gate", "tensor": "grad_input[0]",
     "culprit": "...", "inputs_finite": true, "summary": "..."},
     "replays": {"2": "reproduced"}, "action": "raise"}

``kind`` "replica": the replica check found ranks whose parameters differ (``differing``,
``param``); ``kind`` "scaler_skip": GradScaler skipped a step for inf gradients (counted, not
a fault); ``kind`` "collectives": the step's collective fingerprints differed (``index`` of the
first differing collective in the step, ``expected`` entry and ``expected_ranks``, the
``differing`` ranks and their ``entries``, per-rank ``counts``, this rank's ``mine``; entries
as :mod:`mldebug.numerics.collectives` writes them).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError
from mldebug.findings import Finding, Severity

VERSION = 1
MAX_FILES = 100_000
MAX_FILE_BYTES = 16 << 20
MAX_LINE_BYTES = 64 << 10
MAX_RECORDS = 1_000_000
FILE_RE = re.compile(r"^numerics-(?P<host>[A-Za-z0-9._-]{1,128})-rank(?P<rank>\d{1,7})\.jsonl$")


def record_path(directory: Path, host: str, rank: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:128] or "host"
    return directory / f"numerics-{safe}-rank{rank}.jsonl"


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to ``path`` (0600, created if missing, never through a symlink);
    the line is written with one ``write`` so ranks on a shared file system do not interleave."""
    line = (json.dumps(record, default=str, allow_nan=False, separators=(",", ":")) + "\n")
    data = line.encode()[:MAX_LINE_BYTES - 1]
    if not data.endswith(b"\n"):
        data += b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def create_record_file(path: Path) -> None:
    """The rank's record file, created empty when its sentinel starts (0600, never through a
    symlink): a directory a sentinel wrote to is never empty, so ``mldebug numerics report``
    tells 'nothing tripped' from 'not a sentinel's directory'."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600))


# ---- reading (bounded) --------------------------------------------------------------------

@dataclass
class Loaded:
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file or file:line, reason)
    files: int = 0


def load_records(directory: str | Path) -> Loaded:
    """Every record under ``directory`` (files ``numerics-HOST-rankN.jsonl``, also one level
    down, e.g. one subdirectory per node copied together). Bounded: files, bytes per file,
    bytes per line, records; symlinks are not followed; a bad file or line is skipped with why."""
    from mldebug.privdir import read_bounded

    root = Path(directory)
    if not root.is_dir():
        raise MldebugError(f"{root} is not a directory.",
                           "Pass the dir= the NanSentinel wrote to (one file per rank).")
    out = Loaded()
    candidates: list[Path] = []
    try:
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                try:
                    candidates.extend(Path(e.path) for e in sorted(os.scandir(entry.path),
                                                                   key=lambda e: e.name)
                                      if FILE_RE.match(e.name))
                except OSError as e:
                    out.skipped.append((entry.name, f"cannot list: {e.strerror}"))
            elif FILE_RE.match(entry.name):
                candidates.append(Path(entry.path))
            if len(candidates) > MAX_FILES:
                break
    except OSError as e:
        raise MldebugError(f"cannot list {root}: {e.strerror}.", "Check the path and its "
                           "permissions.") from None
    if not candidates:
        raise MldebugError(
            f"{root} holds no NanSentinel record file (numerics-HOST-rankN.jsonl), here or one "
            "level down: not a directory a sentinel wrote to.",
            "Pass the dir= of NanSentinel(...) (default: mldebug-numerics in the job's working "
            "directory, or $MLDEBUG_DIR/mldebug-numerics); each rank's sentinel creates its "
            "file when it starts.")
    if len(candidates) > MAX_FILES:
        out.skipped.append((str(root), f"more than {MAX_FILES} record files; the rest skipped"))
        candidates = candidates[:MAX_FILES]
    for path in candidates:
        name = str(path.relative_to(root))
        if path.is_symlink():
            out.skipped.append((name, "a symlink (not followed)"))
            continue
        try:
            data = read_bounded(path, MAX_FILE_BYTES + 1)
        except OSError as e:
            out.skipped.append((name, f"cannot read: {e.strerror}"))
            continue
        out.files += 1
        if len(data) > MAX_FILE_BYTES:
            out.skipped.append((name, f"larger than {MAX_FILE_BYTES >> 20} MiB; the first "
                                      f"{MAX_FILE_BYTES >> 20} MiB read"))
            data = data[:MAX_FILE_BYTES]
        for n, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            rec, why = parse_line(line)
            if rec is None:
                out.skipped.append((f"{name}:{n}", why))
                continue
            out.records.append(rec)
            if len(out.records) >= MAX_RECORDS:
                out.skipped.append((name, f"more than {MAX_RECORDS} records; the rest skipped"))
                return out
    return out


_KINDS = ("nonfinite", "replica", "scaler_skip", "collectives")


def parse_line(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """One record, or None and why it was refused."""
    if len(line) > MAX_LINE_BYTES:
        return None, f"line longer than {MAX_LINE_BYTES} bytes"
    try:
        rec = json.loads(line, parse_constant=lambda c: None)
    except (ValueError, RecursionError) as e:
        return None, f"not JSON ({str(e)[:80]})"
    if not isinstance(rec, dict):
        return None, "not a JSON object"
    if rec.get("kind") not in _KINDS:
        return None, f"unknown kind {str(rec.get('kind'))[:40]!r}"
    for key in ("rank", "step"):
        v = rec.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 40:
            return None, f"{key} is not a non-negative integer"
    mb = rec.get("micro_batch", 0)
    if not isinstance(mb, int) or isinstance(mb, bool) or not 0 <= mb < 1 << 30:
        return None, "micro_batch is not a non-negative integer"
    if not isinstance(rec.get("host", ""), str):
        return None, "host is not a string"
    if "replay" in rec and not isinstance(rec["replay"], (dict, type(None))):
        return None, "replay is not an object"
    return rec, ""


# ---- analysis (pure) ----------------------------------------------------------------------

@dataclass
class First:
    rank: int
    host: str
    step: int
    micro_batch: int
    module: str | None
    cls: str | None
    phase: str | None  # "forward" / "backward", None when not localised
    tensor: str | None
    reproducible: bool | None
    inputs_finite: bool | None
    loss_finite: bool | None
    params: list[str]


@dataclass
class SentinelReport:
    verdict: str
    first: First | None
    trips: int
    ranks: list[int]
    replica: dict[str, Any] | None
    scaler_skips: int
    findings: list[Finding]
    skipped: list[tuple[str, str]]
    files: int
    records: int
    collectives: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "first": asdict(self.first) if self.first else None,
            "trips": self.trips,
            "ranks": self.ranks,
            "replica": self.replica,
            "scaler_skips": self.scaler_skips,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [{"file": f, "reason": r} for f, r in self.skipped],
            "files": self.files,
            "records": self.records,
            "collectives": self.collectives,
        }


def _s(v: Any, n: int = 200) -> str:
    """Outside text made printable (controls escaped) and bounded."""
    from mldebug.text import sanitize

    return sanitize(v, limit=n)


def _opt_str(v: Any) -> str | None:
    return _s(v) if isinstance(v, str) else None


def _first(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest record of a rank where the value was born (origin), by step, micro-batch,
    then rank; when no rank saw it before the reduce, the earliest record at all."""
    nonfinite = [r for r in recs if r.get("kind") == "nonfinite"]
    origins = [r for r in nonfinite if r.get("origin") is True]
    pool = origins or nonfinite
    if not pool:
        return None
    return min(pool, key=lambda r: (r["step"], r.get("micro_batch", 0), r["rank"]))


def analyze(loaded: Loaded) -> SentinelReport:
    recs = loaded.records
    findings: list[Finding] = []
    nonfinite = [r for r in recs if r.get("kind") == "nonfinite"]
    ranks = sorted({r["rank"] for r in recs})
    scaler_skips = len({(r["rank"], r["step"]) for r in recs if r.get("kind") == "scaler_skip"})
    first_rec = _first(recs)
    first: First | None = None
    verdict = "no non-finite value recorded"
    if first_rec is not None:
        rp = first_rec.get("replay") if isinstance(first_rec.get("replay"), dict) else {}
        assert isinstance(rp, dict)
        bucket = first_rec.get("first_bucket") if isinstance(first_rec.get("first_bucket"),
                                                             dict) else {}
        assert isinstance(bucket, dict)
        params = [_s(p, 120) for p in (bucket.get("nonfinite_params") or bucket.get("params")
                                       or [])[:16] if isinstance(p, str)]
        reproducible = rp.get("reproducible") if isinstance(rp.get("reproducible"), bool) else None
        phase = rp.get("phase") if rp.get("phase") in ("forward", "backward") else None
        first = First(
            rank=first_rec["rank"], host=_s(first_rec.get("host", ""), 128),
            step=first_rec["step"], micro_batch=first_rec.get("micro_batch", 0),
            module=_opt_str(rp.get("module")) if phase else None,
            cls=_opt_str(rp.get("cls")) if phase else None, phase=phase,
            tensor=_opt_str(rp.get("tensor")) if phase else None,
            reproducible=reproducible,
            inputs_finite=rp.get("inputs_finite") if isinstance(rp.get("inputs_finite"), bool)
            else None,
            loss_finite=first_rec.get("loss_finite") if isinstance(
                first_rec.get("loss_finite"), bool) else None,
            params=params)
        verdict = _verdict(first, first_rec, rp)
        findings.extend(_findings(first, first_rec, rp))
        # the other ranks: the same step everywhere, and the same action
        same_step = [r for r in nonfinite if r["step"] == first.step]
        actions = {_s(r.get("action", "")) for r in same_step}
        if len(actions) > 1:
            findings.append(Finding(
                Severity.ERROR, "ranks took different actions at the same trip",
                f"step {first.step}: actions {sorted(actions)}",
                "Construct NanSentinel with the same action= on every rank.",
                code="numerics-actions-differ"))
        world = first_rec.get("world_size")
        if isinstance(world, int) and 0 < world <= 1 << 20 and first_rec.get("origins") is not None:
            seen = {r["rank"] for r in same_step}
            missing = sorted(set(range(world)) - seen)
            if missing:
                from mldebug.render import fold_ints

                findings.append(Finding(
                    Severity.WARNING, f"no record from {len(missing)} rank(s) at step {first.step}",
                    f"ranks {fold_ints(missing)} of {world} wrote nothing for that step",
                    "Copy every node's record directory into one (records are per rank); a "
                    "rank that died before writing says so in its log (mldebug log).",
                    code="numerics-records-missing"))
    replica = _replica(recs)
    if replica is not None:
        findings.append(Finding(
            Severity.ERROR,
            f"replica check: rank {replica['rank']} holds different weights at step "
            f"{replica['step']}",
            f"data-parallel replicas must be identical after the optimizer step; ranks "
            f"{replica['differing']} differ from the others"
            + (f" (first parameter: {replica['param']})" if replica.get("param") else ""),
            "Suspect silent data corruption on that rank's device (run the GPU's diagnostics, "
            "e.g. dcgmi diag -r 3, and drain the node), or code that updates weights on one rank "
            "only (a rank-dependent branch before optimizer.step).",
            code="numerics-replica-diverged"))
        if first is None:
            verdict = (f"replica divergence: rank {replica['rank']} ({replica['host']}), step "
                       f"{replica['step']}, holds weights that differ from the other replicas")
    coll = _collectives(recs)
    if coll is not None:
        findings.insert(0, _collectives_finding(coll))
        if first is None or coll["step"] <= first.step:
            verdict = _collectives_verdict(coll)
    if scaler_skips:
        findings.append(Finding(
            Severity.INFO, f"GradScaler skipped {scaler_skips} step(s) for inf gradients",
            "mixed-precision loss scaling at work: counted, not a fault",
            "Nothing to do unless it happens every step (then the scale collapses: check the "
            "loss and the model in fp32).", code="numerics-scaler-skips"))
    if loaded.skipped:
        findings.append(Finding(
            Severity.WARNING, f"{len(loaded.skipped)} record file(s) or line(s) skipped",
            "\n".join(f"{_s(f, 120)}: {_s(r, 120)}" for f, r in loaded.skipped[:10]),
            "Records are JSON lines written by NanSentinel; remove or fix the files named.",
            code="numerics-records-skipped"))
    return SentinelReport(verdict=verdict, first=first, trips=len({(r["step"], r.get(
        "micro_batch", 0)) for r in nonfinite}), ranks=ranks, replica=replica,
        scaler_skips=scaler_skips, findings=findings, skipped=loaded.skipped,
        files=loaded.files, records=len(recs), collectives=coll)


def _where(first: First) -> str:
    host = f" ({first.host})" if first.host else ""
    mb = f", micro-batch {first.micro_batch}" if first.micro_batch else ""
    return f"rank {first.rank}{host}, step {first.step}{mb}"


def _verdict(first: First, rec: dict[str, Any], rp: dict[str, Any]) -> str:
    where = _where(first)
    if rec.get("origin") is not True and rec.get("reduce_overflow"):
        return (f"first non-finite: step {first.step}: every rank's gradients were finite "
                "before the all-reduce and not after it: the reduction itself overflowed")
    if first.reproducible is True and first.phase:
        cls = f" ({first.cls})" if first.cls else ""
        fin = "finite inputs" if first.phase == "forward" else "finite incoming gradients"
        src = f", from {fin}" if first.inputs_finite else \
            (", from non-finite inputs (the data)" if first.phase == "forward" else "")
        return (f"first non-finite: {where}, {first.phase} of {first.module or '<root>'}{cls}"
                f"{src}; reproducible on replay, so data or model, not hardware")
    if first.reproducible is False:
        return (f"first non-finite: {where}; not reproducible on replay: suspect "
                "non-determinism or hardware (silent data corruption)")
    why = _s(rp.get("error") or rp.get("status") or "no replay", 120)
    return f"first non-finite: {where}; not localised ({why})"


def _findings(first: First, rec: dict[str, Any], rp: dict[str, Any]) -> list[Finding]:
    where = _where(first)
    detail = []
    if first.params:
        detail.append("non-finite before the all-reduce: " + ", ".join(first.params))
    if first.loss_finite is not None:
        detail.append(f"loss finite: {str(first.loss_finite).lower()}")
    if rp.get("culprit"):
        detail.append(_s(rp["culprit"], 300))
    if rp.get("summary"):
        detail.append(_s(rp["summary"], 300))
    text = "\n".join(detail)
    if first.reproducible is True:
        if first.phase == "forward" and first.inputs_finite is False:
            fix = ("The batch itself carries inf/nan: validate the data of that step on that "
                   "rank (the record names the step and micro-batch).")
        else:
            fix = (f"Run that step's batch through {first.module or 'the model'} under "
                   "DebugUnderflowOverflow (mldebug docs numerics): clamp or rescale there, keep "
                   "it in fp32 (autocast(enabled=False)), or lower the learning rate.")
        return [Finding(Severity.ERROR, f"non-finite {first.phase or ''} value born on {where}",
                        text, fix, code="numerics-nonfinite-reproducible")]
    if first.reproducible is False:
        return [Finding(Severity.ERROR, f"non-finite value on {where} did not recur on replay",
                        text, "Suspect the device of that rank (silent data corruption): run "
                        "its diagnostics (dcgmi diag -r 3), check ECC/Xid errors (nvidia-smi -q "
                        "-d ECC; dmesg | grep Xid), and turn on the replica check "
                        "(replica_check_every=N); or non-determinism in the model.",
                        code="numerics-nonfinite-not-reproducible")]
    return [Finding(Severity.WARNING, f"non-finite value on {where}, not localised", text,
                    "Replay needs the batch and NanSentinel(replay=True); pass loss_fn= when the "
                    "model's output is not the loss.", code="numerics-nonfinite-not-localised")]


def _replica(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
    reps = [r for r in recs if r.get("kind") == "replica"]
    if not reps:
        return None
    r = min(reps, key=lambda r: (r["step"], r["rank"]))
    differing = [d for d in (r.get("differing") or []) if isinstance(d, int)][:64]
    first_rank = differing[0] if differing else r["rank"]
    host = next((_s(x.get("host", ""), 128) for x in reps if x["rank"] == first_rank), "")
    return {"rank": first_rank, "host": host, "step": r["step"], "differing": differing,
            "param": _opt_str(r.get("param"))}


def _collectives(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest collective-fingerprint mismatch (every rank recorded the same one)."""
    from mldebug.numerics.collectives import clean_entry

    cs = [r for r in recs if r.get("kind") == "collectives"]
    if not cs:
        return None
    r = min(cs, key=lambda r: (r["step"], r["rank"]))
    differing = sorted({d for d in (r.get("differing") or []) if isinstance(d, int)
                        and not isinstance(d, bool) and 0 <= d < 1 << 30})[:64]
    entries_in = r.get("entries") if isinstance(r.get("entries"), dict) else {}
    assert isinstance(entries_in, dict)
    entries = {str(k)[:8]: clean_entry(v) for k, v in list(entries_in.items())[:64]}
    index = r.get("index")
    n = r.get("expected_ranks")
    return {"step": r["step"], "index": index if isinstance(index, int) and not
            isinstance(index, bool) and 0 <= index < 1 << 30 else None,
            "expected": clean_entry(r.get("expected")),
            "expected_ranks": n if isinstance(n, int) and not isinstance(n, bool) else None,
            "differing": differing, "entries": entries,
            "ranks_recorded": sorted({x["rank"] for x in cs if x["step"] == r["step"]})[:1024]}


def _collectives_verdict(c: dict[str, Any]) -> str:
    from mldebug.numerics.collectives import describe

    ranks = ", ".join(map(str, c["differing"])) or "?"
    if c["index"] is None:
        return (f"collective mismatch at step {c['step']}: rank(s) {ranks} made a different "
                "sequence of collectives (beyond the first kept entries)")
    theirs = next(iter(c["entries"].values()), None)
    return (f"collective mismatch at step {c['step']}: collective #{c['index'] + 1} since the "
            f"previous check is {describe(theirs)} on rank(s) {ranks} but {describe(c['expected'])} on "
            f"{c['expected_ranks']} rank(s)")


def _collectives_finding(c: dict[str, Any]) -> Finding:
    from mldebug.numerics.collectives import describe

    detail = "\n".join(f"rank {k}: {describe(v)}" for k, v in list(c["entries"].items())[:16])
    if c["expected"] is not None:
        detail += f"\nthe other {c['expected_ranks']} rank(s): {describe(c['expected'])}"
    return Finding(
        Severity.ERROR,
        f"rank(s) {', '.join(map(str, c['differing'])) or '?'} made a different collective at "
        f"step {c['step']}" + (f" (#{c['index'] + 1} since the previous check)" if c["index"] is not None
                               else ""),
        detail.strip(),
        "Find the rank-dependent branch before that collective on those ranks (a reduce op, a "
        "tensor shape or dtype chosen per rank, a collective skipped or added): every rank must "
        "make the same collectives in the same order. gloo may complete such a mismatch with "
        "wrong values; NCCL may hang or corrupt silently.", code="numerics-collectives-differ")


def render(report: SentinelReport, console: Any) -> None:
    from rich.text import Text

    from mldebug.findings import render_findings

    console.print(Text(report.verdict, style="bold"))
    console.print(Text(f"{report.records} record(s) from {len(report.ranks)} rank(s) in "
                       f"{report.files} file(s); {report.trips} trip(s)", style="dim"))
    if report.findings:
        console.print()
        render_findings(report.findings, console)
