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
Give it everything the job left - the launcher's log, per-rank logs, torchrun's --log-dir
(error.json files, restarts), flight-recorder dumps, saved stack dumps, NanSentinel records,
or the directories holding them - and it names the
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
                   help="files or directories: logs, elastic error files, flight-recorder "
                        "dumps, stack dumps, sentinel records (sniffed by content)")
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
    from mldebug.why.collect import attempt_of
    from mldebug.why.model import Source

    at = {attempt_of(f.path) for f in files}
    run, attempt = next(iter(at)) or ("", None) if len(at) == 1 else ("", None)
    return Source(_where(files), reader, len(files), what, run, attempt)


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
    return [_evidence(src, v, ranks, _basis(v, direct), consequences=consequences,
                      launcher=_launcher(p))]


def _launcher(parsed: Any) -> Any:
    """torchrun's "Root Cause" entry of the logs, as the join's LauncherClaim, or None."""
    from mldebug.log.rootcause import meaning, root_cause
    from mldebug.why.model import LauncherClaim

    rc = root_cause(parsed)
    if rc is None:
        return None
    what, consequence = meaning(rc)
    return LauncherClaim(rc.said(), rc.rank, what, consequence, rc.to_dict())


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
    used = [f for f in files if str(f.path) not in {p.file for p in ds.problems}] or files
    return [fr_evidence(ds, a, _source(used, "fr", f"fr dumps of {_ranks(sorted(ds.dumps))}"))]


def fr_evidence(ds: Any, a: Any, src: Source) -> Evidence:
    """The flight recorder's claim from loaded dumps (``ds``) and their analysis (``a``):
    what ``why`` makes of dumps it reads and what ``hang`` makes of the dumps it asked the
    ranks for, the same."""
    v = _decide("fr.analyze", a.to_dict())
    scope = sorted(ds.dumps)
    expected = tuple(range(a.world_size)) if a.world_size else None
    consequences = ""
    m = next((m for m in a.mismatches if m.culprit_ranks), None)
    if m is not None:
        fact, code, consequences = _fr_fact(m, scope, a.findings)
        fix = next((f.fix for f in a.findings if f.code == code), "")
        v = {**v, "summary": fact or v["summary"], "code": code, "fix": fix}
    claim = _evidence(src, v, scope, _basis(v, True), expected=expected,
                      consequences=consequences, per_rank=True)
    cut = _running_cut(ds, m) if m is not None else None
    if cut is None:
        return claim
    # a job stopped from outside while it ran: its dumps name no culprit - unless stacks
    # taken with them show the job stuck (mldebug.why.join, rule 8), then the mismatch stands
    v = {**v, "kind": "ok", "culprits": [], "class": "healthy", "summary": cut,
         "code": "fr-running-cut", "fix": ""}
    return _evidence(src, v, scope, _basis(v, True), expected=expected, per_rank=True,
                     if_stuck=claim)


def live_hang_item(report: Any, where: str) -> Evidence:
    """``hang_evidence`` for the stacks ``mldebug hang`` just took (``where``: its --out
    directory, or where it read them)."""
    from mldebug.why.model import Source

    n = len(report.processes) + len(report.lone)
    return hang_evidence(report, Source(where, "hang", n, _stacks_of(report)))


def live_fr_item(dumps: Any, a: Any, where: str) -> Evidence | None:
    """``fr_evidence`` for the flight-recorder dumps ``mldebug hang`` asked the ranks for."""
    from mldebug.why.model import Source

    if dumps is None or a is None or not dumps.dumps:
        return None
    scope = sorted(dumps.dumps)
    return fr_evidence(dumps, a, Source(where, "fr", len(scope), f"fr dumps of {_ranks(scope)}"))


def brief(v: WhyVerdict) -> list[str]:
    """The join's verdict and its chain in a few lines (``mldebug hang``'s "why" section)."""
    from mldebug.why.join import ranks_text

    who = ranks_text(v.culprits) if v.culprits else "no culprit"
    extra = ", ".join(x for x in (v.cls, f"confidence {v.confidence}" if v.confidence else "")
                      if x)
    return ([f"why: {who}: {v.summary}" + (f" [{extra}]" if extra else "")]
            + [f"  {i}. {link.text}" for i, link in enumerate(v.chain, 1)])


_NOT_THERE = ("(not enqueued)", "(no dump)")
CUT_WAIT_S = 30.0  # the ranks had waited under this in the collective when they were dumped
# dumps of a job that was running: on SIGTERM (stopped from outside), on a trigger (`fr
# trigger`), from the capture handler on a signal (`hang --signal`, `trace show`)
_LIVE_REASONS = ("SIGTERM", "triggered", "mldebug.capture: signal")


def _running_cut(ds: Any, m: Any) -> str | None:
    """The sentence saying the dumps are a cut through a running job, or None. A job that
    the scheduler stopped with SIGTERM while it trained, or that was asked for its dumps
    while it ran (a trigger, the capture handler's signal), dumps every rank mid-step: the ranks that reached collective #N wait in it, the others are a collective
    short - 'never enqueued' without a fault. Taken for that only when every dump says it was
    written so (``_LIVE_REASONS``), the mismatch is a 'missing' one at most one collective short, and the
    ranks that reached it had waited under CUT_WAIT_S there (a hung job's ranks wait on and
    on). Any other dump reason, a longer wait, or times the dumps lack: not a cut."""
    if m.kind != "missing" or m.p2p or not ds.dumps:
        return None
    if any(not (d.reason or "").startswith(_LIVE_REASONS) for d in ds.dumps.values()):
        return None
    waits = []
    for r in m.culprit_ranks:  # each of them dumped, a collective short at most
        d = ds.dumps.get(r)
        gi = ds.timelines[d.timeline].groups.get(m.pg) if d is not None and d.timeline >= 0 \
            else None
        if gi is None or not gi.seqs or gi.seqs[-1] < m.seq - 1:
            return None
    for r, d in ds.dumps.items():
        if r in m.culprit_ranks:
            continue
        gi = ds.timelines[d.timeline].groups.get(m.pg) if d.timeline >= 0 else None
        if gi is None or d.dumped_at is None:
            return None
        k = gi.positions().get(m.seq)
        if k is None:
            continue
        i = gi.order[gi.starts[k]]
        created = d.created[i] if i < len(d.created) else -1
        if created <= 0:
            return None
        waits.append(d.dumped_at - created / 1e9)
    if not waits or not all(-1.0 <= w < CUT_WAIT_S for w in waits):
        return None
    return (f"the dumps were written while the job ran (on SIGTERM or on request): the ranks "
            f"in collective "
            f"#{m.seq} of pg {m.pg} had waited {max(waits):.1f}s there and "
            f"{_ranks(m.culprit_ranks)} {'was' if len(m.culprit_ranks) == 1 else 'were'} a collective short - a cut through a running job, "
            "no culprit")


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
    return [hang_evidence(report, _source(files, "hang", _stacks_of(report)))]


def _hang_scope(report: Any) -> list[int]:
    return sorted(p.rank for p in [*report.processes, *report.lone] if p.rank is not None)


def _stacks_of(report: Any) -> str:
    return f"stack dumps of {_ranks(_hang_scope(report))}"


def hang_evidence(report: Any, src: Source) -> Evidence:
    """The stacks' claim from a hang report (before ``hang.flight.settle`` adds the flight
    recorder's answer: that is the fr item's): what ``why`` makes of saved dumps and what
    ``hang`` makes of the dumps it just took, the same."""
    v = _decide("hang.analyze", report.to_dict())
    return _evidence(src, v, _hang_scope(report), _basis(v, v["confidence"] == "high"), per_rank=True)


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


def _errors(files: list[Found], notes: list[str]) -> list[tuple[Found, Any]]:
    """The elastic error files that parse (mldebug.why.elastic), each bad one a note."""
    from mldebug.log.parse import classify
    from mldebug.privdir import read_bounded
    from mldebug.why.elastic import MAX_BYTES, parse

    out = []
    for f in files:
        if f.size > MAX_BYTES:
            notes.append(f"{f.path}: {f.size >> 20} MiB, over the {MAX_BYTES >> 20} MiB an "
                         "elastic error file may have; noted, not read")
            continue
        try:
            data = read_bounded(f.path, MAX_BYTES + 1)
        except OSError as e:
            notes.append(f"{f.path}: cannot read ({e.strerror}); skipped")
            continue
        got = parse(data, f.path, classify)
        if isinstance(got, str):
            notes.append(f"{f.path}: elastic error file: {got}")
        else:
            out.append((f, got))
    return out


def _elastic(files: list[Found], notes: list[str]) -> list[Evidence]:
    """One evidence item per attempt (or per loose set) of elastic error files."""
    from mldebug.why.collect import attempt_of

    groups: dict[Any, list[tuple[Found, Any]]] = {}
    for f, err in _errors(files, notes):
        groups.setdefault(attempt_of(f.path), []).append((f, err))
    return [_elastic_claim(g) for _, g in sorted(groups.items(), key=lambda kv: str(kv[0]))]


def _when(stamp: int | None) -> str:
    import time

    if stamp is None:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))
    except (OverflowError, OSError, ValueError):
        return ""


def _elastic_claim(group: list[tuple[Found, Any]]) -> Evidence:
    from mldebug.why.elastic import culprit
    from mldebug.why.model import DIRECT, GENERIC, Evidence

    errs = [e for _, e in group]
    c = culprit(errs)
    others = [e for e in errs if e is not c]
    scope = tuple(sorted({e.rank for e in errs if e.rank is not None}))
    when = _when(c.timestamp)
    own = f"its error file{', ' + when if when else ''}"
    at = f"{c.frame}; " if c.frame else ""
    src = _source([f for f, _ in group], "elastic",
                  f"error files of {_ranks(list(scope))}" if scope else "error files, no rank")
    reactions = "; ".join(e.short() for e in others if not e.primary)
    if c.primary and c.rank is not None:
        fact = f"{c.who} raised {c.exception} ({at}{own})"
        if c.rank_from == "local":
            fact += " (the local rank of the --log-dir path: the global rank is not recorded)"
        rival = [e for e in others if e.primary and (
            e.timestamp is None or c.timestamp is None or e.timestamp <= c.timestamp)]
        fix = (f"Fix the error at {c.frame}: it is this rank's own exception"
               + ("; the others' errors came after it." if others else ".")
               if c.frame else f"Read the traceback in {c.path}.")
        return Evidence(src, scope, (c.rank,), "exception", fact,
                        "high" if others and not rival else "medium", "elastic-error-file",
                        DIRECT, consequences=reactions, fix=fix)
    if c.primary:
        fact = (f"a rank raised {c.exception} ({at}{own}), but the file does not say which "
                "rank: pass the --log-dir tree, or name the file rank<N>.json")
        return Evidence(src, scope, (), "exception", fact, "low", "elastic-rank-unknown",
                        GENERIC)
    fact = (f"no error file records a rank's own failure, only reactions to a peer's: "
            f"{c.short()}{', ' + when if when else ''}")
    return Evidence(src, scope, (), None, fact, "low", "elastic-peer-only", GENERIC)


MAX_PAST = 20  # earlier attempts summarised, one chain line each


def _past(files: list[Found]) -> list[Evidence]:
    """One evidence item for an earlier attempt: its error files' root cause, else what its
    logs say; its source carries the attempt (mldebug.why.join: history, no vote)."""
    from dataclasses import replace

    from mldebug.why.collect import READER

    errors = [f for f in files if READER[f.kind] == "elastic"]
    logs = [f for f in files if READER[f.kind] == "log"]
    scratch: list[str] = []  # an earlier attempt's own notes are not the verdict's
    found = _errors(errors, scratch) if errors else []
    if found:
        from mldebug.why.elastic import culprit

        e = _elastic_claim(found)
        return [replace(e, fact=culprit([err for _, err in found]).short(),
                        source=replace(e.source, path=_attempt_dir(e.source)))]
    if logs:
        try:
            items = _log(logs, scratch)
        except Exception:  # an earlier attempt's unreadable log: no summary line
            return []
        return [replace(e, fact=e.fact[:200], source=replace(e.source, path=_attempt_dir(e.source)))
                for e in items]
    return []


def _attempt_dir(s: Source) -> str:
    from pathlib import Path

    return str(Path(s.run) / f"attempt_{s.attempt}") + os.sep if s.attempt is not None else s.path


READERS: dict[str, Callable[[list[Any], list[str]], list[Any]]] = {
    "log": _log, "elastic": _elastic, "fr": _fr, "hang": _hang, "numerics": _numerics}


def gather(paths: list[str]) -> tuple[list[Evidence], list[str]]:
    """Every reader's evidence items from ``paths``, and the notes of what was skipped. Of a
    torchrun --log-dir run restarted, the last attempt's files are read as the job's; each
    earlier attempt gives one summary item (its source names the attempt)."""
    from mldebug.why.collect import READER, collect, split_attempts

    inputs = collect(paths)
    notes = list(inputs.notes)
    current, earlier = split_attempts(inputs.files)
    by_reader: dict[str, list[Found]] = {}
    for f in current:
        by_reader.setdefault(READER[f.kind], []).append(f)
    items: list[Evidence] = []
    for reader in ("log", "elastic", "fr", "hang", "numerics"):
        if by_reader.get(reader):
            items += READERS[reader](by_reader[reader], notes)
    if items:
        for files in list(earlier.values())[-MAX_PAST:]:
            items += _past(files)
    if len(earlier) > MAX_PAST:
        notes.append(f"{len(earlier) - MAX_PAST} earlier torchrun attempts not summarised "
                     f"(the last {MAX_PAST} are)")
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
        "launcher": v.correction,
        "notes": notes,
    }


MAX_NOTES_SHOWN = 20


def render(v: WhyVerdict, items: list[Evidence], notes: list[str]) -> None:
    head, *chain = brief(v)
    print(head)
    if chain:
        print("evidence chain:")
        print("\n".join(chain))
    if v.fix:
        print(f"fix: {v.fix}")
    print("sources read:")
    for e in items:
        s = e.source
        count = f"{s.files} files: " if s.files > 1 else ""
        if s.attempt is not None:
            count = f"attempt {s.attempt}, {count}"
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
        raise MldebugError(f"nothing in {', '.join(args.paths)} could be read as a log, an "
                           f"elastic error file, a flight-recorder dump, a stack dump or a sentinel record ({shown}).",
                           "Pass the job's text logs, the dumps `mldebug fr trigger` or "
                           "`mldebug hang --out` wrote, or NanSentinel's record directory.")
    v = join(items)
    if args.json:
        from mldebug.cli._common import print_doc

        print_doc(document(v, items, notes))
    else:
        render(v, items, notes)
    return 0
