"""mldebug why: one verdict from everything a job left (logs, FR dumps, stacks, sentinel
records), each file read by the reader its content calls for; the join is mldebug.why.join."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mldebug.cli._common import add_json_argument

if TYPE_CHECKING:
    from mldebug.why.collect import Found
    from mldebug.why.model import Evidence, Source, WhyVerdict

DESCRIPTION = """\
Give it everything the job left - the launcher's log, per-rank logs, flight-recorder dumps,
saved stack dumps, NanSentinel records, or the directories holding them - and it names the
rank to look at and why, as one chain of evidence with the source of each step:

  mldebug why job.log dumps/
  mldebug why /shared/run-17/            a directory: every file sniffed by its content
  mldebug why job.log fr/ --json

Each file is read by the reader its content calls for (`mldebug log`, `fr analyze`,
`hang analyze`, `numerics report`); a specific claim (a rank's own exception or dump)
beats a generic one, agreeing sources raise the confidence, conflicts are shown with the
winner and why. Rules: docs/why.md. Exit code 0 whenever something was read."""

# log verdict codes that rest on the culprit's own lines (mldebug.why.model.DIRECT); the
# others with a culprit are inferences (from silence, from the others' waits)
LOG_DIRECT_PREFIXES = ("log-first-failure-",)
LOG_DIRECT = frozenset({"log-killed", "log-crash", "log-size-mismatch",
                        "log-fingerprint-mismatch", "log-monitored-barrier",
                        "log-watchdog-stall"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="files or directories: logs, flight-recorder dumps, stack dumps, "
                        "sentinel records (sniffed by content)")
    add_json_argument(p)


def _where(files: list[Found]) -> str:
    if len(files) == 1:
        return str(files[0].path)
    roots = sorted({f.root for f in files})
    if len(roots) == 1 and os.path.isdir(roots[0]):
        return roots[0]
    try:
        return os.path.commonpath([str(f.path) for f in files]) + os.sep
    except ValueError:
        return ", ".join(roots[:3])


def _source(files: list[Found], reader: str, what: str) -> Source:
    from mldebug.why.model import Source

    return Source(_where(files), reader, len(files), what)


def _basis(v: dict[str, Any], direct: bool) -> str:
    from mldebug.why.model import DIRECT, GENERIC, HEALTHY, INFERRED

    if v["culprits"]:
        return DIRECT if direct else INFERRED
    if v["kind"] in ("ok", "progress") or v["class"] == "healthy":
        return HEALTHY
    return GENERIC


def _evidence(source: Source, v: dict[str, Any], scope: list[int], basis: str,
              **more: Any) -> Evidence:
    from mldebug.why.model import Evidence

    return Evidence(source, tuple(sorted(set(scope))), tuple(v["culprits"]), v["class"],
                    str(v["summary"]), v["confidence"], str(v["code"]), basis,
                    fix=str(v.get("fix") or ""), **more)


def _decide(key: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The reader's own verdict, as its `--json` envelope gives it (the same decider)."""
    from mldebug.cli.envelope import DECIDERS

    findings = list(doc.get("findings") or [])
    v, _ = DECIDERS[key](doc)
    assert v is not None
    fix = next((f.get("fix") for f in findings if f.get("code") == v["code"]), "")
    return {**v, "fix": v.get("fix") or fix or ""}


def _too_big(files: list[Found], limit: int, reader: str, notes: list[str]) -> list[Found]:
    kept = []
    for f in files:
        if f.size > limit:
            notes.append(f"{f.path}: {f.size >> 20} MiB, over {reader}'s limit of "
                         f"{limit >> 20} MiB; noted, not read")
        else:
            kept.append(f)
    return kept


def _log(files: list[Found], notes: list[str]) -> list[Evidence]:
    from mldebug.errors import UsageError
    from mldebug.log.analyze import analyze
    from mldebug.log.collect import load

    todo = list(files)
    while todo:
        try:
            report = analyze(load([str(f.path) for f in todo]))
            break
        except UsageError as e:  # one file is not a text log (binary, compressed): noted
            bad = [f for f in todo if e.message.startswith(f"{f.path}:")]
            if not bad:
                raise
            notes.append(f"{e.message} Skipped.")
            todo = [f for f in todo if f not in bad]
    else:
        return []
    p = report.parsed
    notes += [f"log: {n}" for n in p.notes]
    doc = report.to_dict()
    v = _decide("log", doc)
    code = str(v["code"])
    direct = code.startswith(LOG_DIRECT_PREFIXES) or code in LOG_DIRECT
    victims = sorted(r for r, st in p.ranks.items()
                     if r not in v["culprits"] and st.consequences)
    consequences = (f"{_ranks(victims)} timed out or lost a peer after it"
                    if v["culprits"] and victims else "")
    ranks = sorted(p.ranks)
    src = _source(todo, "log", f"log lines of {_ranks(ranks)}" if ranks else "no rank named")
    return [_evidence(src, v, ranks, _basis(v, direct), consequences=consequences)]


def _ranks(rs: list[int] | tuple[int, ...]) -> str:
    from mldebug.why.join import ranks_text

    return ranks_text(rs)


def _fr(files: list[Found], notes: list[str]) -> list[Evidence]:
    from mldebug.fr.analyze import analyze
    from mldebug.fr.loader import MAX_FILE_BYTES, load_files

    files = _too_big(files, MAX_FILE_BYTES, "fr", notes)
    if not files:
        return []
    ds = load_files([f.path for f in files])
    notes += [f"fr: {p.file}: {p.error}" for p in ds.problems]
    if not ds.dumps:
        return []
    a = analyze(ds)
    notes += [f"fr: {n}" for n in a.notes]
    v = _decide("fr.analyze", a.to_dict())
    scope = sorted(ds.dumps)
    consequences = ""
    m = next((m for m in a.mismatches if m.culprit_ranks), None)
    if m is not None:
        fact, code, consequences = _fr_fact(m, scope, a.findings)
        fix = next((f.fix for f in a.findings if f.code == code), "")
        v = {**v, "summary": fact or v["summary"], "code": code, "fix": fix}
    expected = tuple(range(a.world_size)) if a.world_size else None
    used = [f for f in files if str(f.path) not in {p.file for p in ds.problems}] or files
    src = _source(used, "fr", f"fr dumps of {_ranks(scope)}")
    return [_evidence(src, v, scope, _basis(v, True), expected=expected,
                      consequences=consequences, per_rank=True)]


_NOT_THERE = ("(not enqueued)", "(no dump)")


def _fr_fact(m: Any, scope: list[int], findings: list[Any]) -> tuple[str, str, str]:
    """The mismatch that names the culprits, in one sentence; its finding's code; what the
    other ranks did (the consequences)."""
    code = f"fr-{m.kind}"
    where = f"#{m.seq} of pg {m.pg}"
    present = [g for g in m.groups if g.description not in _NOT_THERE]
    op = present[0].description.split(" ", 1)[0] if present else "the collective"
    who = _ranks(m.culprit_ranks)
    if m.kind == "missing":
        fact = f"{who} never enqueued {op} {where}"
        if not set(m.culprit_ranks) & set(scope):
            fact += " (no dump of it)"
    elif m.kind == "skipped":
        fact = f"{who} skipped {op} {where} (it went on to a later collective)"
    else:
        fact = next((f.title for f in findings if f.code == code), "")
    others = [f"{_ranks(g.ranks)} " + (f"{'waits' if len(g.ranks) == 1 else 'wait'} in "
                                       f"{g.description} {where}" if g.state in
                                       ("scheduled", "started") else g.description)
              for g in present if not set(g.ranks) & set(m.culprit_ranks)]
    return fact, code, "; ".join(others[:3])


def _hang(files: list[Found], notes: list[str]) -> list[Evidence]:
    from mldebug.hang.analyze import analyze
    from mldebug.hang.collect import MAX_DUMP_BYTES, load

    files = _too_big(files, MAX_DUMP_BYTES, "hang", notes)
    if not files:
        return []
    coll = load([str(f.path) for f in files])
    notes += [f"hang: {e.host}: {e.error}" for e in coll.errors]
    if not coll.processes:
        return []
    report = analyze(coll)
    v = _decide("hang.analyze", report.to_dict())
    scope = sorted(p.rank for p in coll.processes if p.rank is not None)
    src = _source(files, "hang", f"stack dumps of {_ranks(scope)}")
    return [_evidence(src, v, scope, _basis(v, v["confidence"] == "high"), per_rank=True)]


def _numerics(files: list[Found], notes: list[str]) -> list[Evidence]:
    from mldebug.numerics.records import MAX_FILE_BYTES, Loaded, analyze, parse_line
    from mldebug.privdir import read_bounded

    files = _too_big(files, MAX_FILE_BYTES, "numerics", notes)
    loaded = Loaded()
    for f in files:
        try:
            data = read_bounded(f.path, MAX_FILE_BYTES)
        except OSError as e:
            notes.append(f"{f.path}: cannot read ({e.strerror}); skipped")
            continue
        loaded.files += 1
        for n, line in enumerate(data.split(b"\n"), 1):
            if line.strip():
                rec, why = parse_line(line)
                if rec is None:
                    loaded.skipped.append((f"{f.path}:{n}", why))
                else:
                    loaded.records.append(rec)
    notes += [f"numerics: {where}: {why}" for where, why in loaded.skipped[:20]]
    if not loaded.records:
        return []
    report = analyze(loaded)
    v = _decide("numerics.report", report.to_dict())
    scope = sorted({int(r["rank"]) for r in loaded.records})
    worlds = [r.get("world_size") for r in loaded.records]
    world = max((w for w in worlds if isinstance(w, int) and 0 < w <= 1 << 20), default=None)
    src = _source(files, "numerics", f"sentinel records of {_ranks(scope)}")
    return [_evidence(src, v, scope, _basis(v, True),
                      expected=tuple(range(world)) if world else None)]


READERS: dict[str, Callable[[list[Any], list[str]], list[Any]]] = {
    "log": _log, "fr": _fr, "hang": _hang, "numerics": _numerics}


def gather(paths: list[str]) -> tuple[list[Evidence], list[str]]:
    """Every reader's evidence items from ``paths``, and the notes of what was skipped."""
    from mldebug.why.collect import READER, collect

    inputs = collect(paths)
    notes = list(inputs.notes)
    by_reader: dict[str, list[Found]] = {}
    for f in inputs.files:
        by_reader.setdefault(READER[f.kind], []).append(f)
    items: list[Evidence] = []
    for reader in ("log", "fr", "hang", "numerics"):
        if by_reader.get(reader):
            items += READERS[reader](by_reader[reader], notes)
    return items, notes


def document(v: WhyVerdict, items: list[Evidence], notes: list[str]) -> dict[str, Any]:
    from mldebug.cli.envelope import verdict
    from mldebug.findings import Finding, Severity

    sev = Severity.INFO if v.kind == "ok" else (Severity.ERROR if v.culprits else
                                                Severity.WARNING)
    f = Finding(sev, v.summary, "\n".join(link.text for link in v.chain), v.fix, code=v.code)
    return {
        "verdict": verdict(v.kind, v.summary, v.culprits, v.cls, v.confidence, v.code),
        "findings": [f.to_dict()],
        "chain": [link.to_dict() for link in v.chain],
        "sources": [e.source.to_dict() for e in items],
        "evidence": [e.to_dict() for e in items],
        "notes": notes,
    }


MAX_NOTES_SHOWN = 20


def render(v: WhyVerdict, items: list[Evidence], notes: list[str]) -> None:
    from mldebug.why.join import ranks_text

    who = ranks_text(v.culprits) if v.culprits else "no culprit"
    extra = ", ".join(x for x in (v.cls, f"confidence {v.confidence}" if v.confidence else "")
                      if x)
    print(f"why: {who}: {v.summary}" + (f" [{extra}]" if extra else ""))
    if v.chain:
        print("evidence chain:")
        for i, link in enumerate(v.chain, 1):
            print(f"  {i}. {link.text}")
    if v.fix:
        print(f"fix: {v.fix}")
    print("sources read:")
    for e in items:
        s = e.source
        count = f"{s.files} files: " if s.files > 1 else ""
        print(f"  {s.reader:<9}{s.path}  ({count}{s.what})")
    if notes:
        print("notes:")
        for n in notes[:MAX_NOTES_SHOWN]:
            print(f"  {n}")
        if len(notes) > MAX_NOTES_SHOWN:
            print(f"  ... and {len(notes) - MAX_NOTES_SHOWN} more (--json lists them all)")


def run(args: argparse.Namespace) -> int:
    from mldebug.errors import MldebugError
    from mldebug.why.join import join

    items, notes = gather(args.paths)
    if not items:
        shown = "; ".join(notes[:3]) or "no file found"
        raise MldebugError(f"nothing in {', '.join(args.paths)} could be read as a log, a "
                           f"flight-recorder dump, a stack dump or a sentinel record ({shown}).",
                           "Pass the job's text logs, the dumps `mldebug fr trigger` or "
                           "`mldebug hang --out` wrote, or NanSentinel's record directory.")
    v = join(items)
    if args.json:
        from mldebug.cli._common import print_doc

        print_doc(document(v, items, notes))
    else:
        render(v, items, notes)
    return 0
