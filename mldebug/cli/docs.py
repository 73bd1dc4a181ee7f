"""mldebug docs: print a documentation page, or a command's section of one, from the package.

Every name ``mldebug docs`` knows is in ``TOPICS`` (commands, subcommands, named sections)
and ``ALIASES`` below, plus every page's file name (docs/*.md); tests/test_docs_cmd.py
checks that every registered command and subcommand has an entry and that every section
named here is a heading of its page.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError, UsageError

DESCRIPTION = """\
The pages of docs/ ship inside the package, so they are there wherever mldebug is installed.
A command or subcommand documented in a section of a bigger page prints that section (with
its subsections) after a first line naming the page; --whole prints the whole page.

  mldebug docs            # the index
  mldebug docs hang       # the page of 'mldebug hang'
  mldebug docs fr analyze # the section of docs/fr.md on 'mldebug fr analyze'
  mldebug docs --list     # every name, alias and the page (section) it prints
  mldebug docs --path     # where the pages are"""


@dataclass(frozen=True)
class Topic:
    """Where a name's text is: a page (a docs/*.md stem) and, for part of a page, the heading
    it starts at (the text after the #s, exactly) and, when it spans several sections, the
    heading of the last one."""

    page: str
    section: str | None = None
    through: str | None = None


# Every command (mldebug.cli.COMMANDS), every subcommand ("COMMAND SUB") and the named
# sections of pages that users look for by another name. The one place names meet pages.
TOPICS: dict[str, Topic] = {
    "hang": Topic("hang"),
    "hang analyze": Topic("hang", "Save and re-analyse"),
    "fr": Topic("fr"),
    "fr trigger": Topic("fr", "`mldebug fr trigger`"),
    "fr analyze": Topic("fr", "`mldebug fr analyze`"),
    "fr watch": Topic("fr", "`mldebug fr watch --interval S`"),
    "fr env": Topic("fr", "`mldebug fr env`"),
    "env": Topic("env"),
    "nccl-log": Topic("nccl-log"),
    "log": Topic("log"),
    "why": Topic("why"),
    "dist-test": Topic("dist-test"),
    "numerics": Topic("numerics"),
    "numerics report": Topic("numerics", "Distributed jobs: `NanSentinel`"),
    "make-tiny": Topic("make-tiny"),
    "shrink-layers": Topic("make-tiny", "mldebug shrink-layers"),
    "make-tiny-dataset": Topic("make-tiny", "mldebug make-tiny-dataset"),
    "mem": Topic("memory"),
    "mem report": Topic("memory", "mldebug mem report"),
    "mem compare": Topic("memory", "mldebug mem compare"),
    "mem plot": Topic("memory", "mldebug mem plot"),
    "mem top": Topic("memory", "mldebug mem top"),
    "mem peak": Topic("memory", "mldebug mem peak"),
    "mem probe": Topic("memory", "mldebug mem probe"),
    "pdb": Topic("debugger"),
    "pdb list": Topic("debugger", "A session end to end"),
    "pdb connect": Topic("debugger", "A session end to end"),
    "pdb attach": Topic("debugger", "`mldebug pdb attach PID`: Python 3.14"),
    "trace": Topic("capture", "The execution ring: `mldebug.trace`",
                   through="Full traces: `mldebug trace run`"),
    "trace show": Topic("capture", "A live job: `mldebug trace show --pid PID` / `--job KEY`"),
    "trace run": Topic("capture", "Full traces: `mldebug trace run`"),
    "docs": Topic("completion", "`mldebug docs`"),
    "completion": Topic("completion"),
    # sections known by their own name
    "watchdog": Topic("capture", "Stall watchdog"),
    "signal": Topic("capture", "Dumps on a signal, without ptrace: `mldebug hang --signal`"),
    "nan-sentinel": Topic("numerics", "Distributed jobs: `NanSentinel`"),
    "printflock": Topic("hooks",
                        "Printing from many ranks: `printflock`, `rank_print`, `install_excepthook`"),
    "breakpoint": Topic("hooks", "Debugging one rank: `breakpoint`, `post_mortem`, `ForkedPdb`"),
    "see_memory_usage": Topic("memory", "see_memory_usage"),
    "trace-event": Topic("views", "Trace-event JSON (Perfetto, chrome://tracing)"),
    "errors": Topic("cli", "Errors"),
    "hosts": Topic("cli", "Where to run"),
}

# other names users type -> a TOPICS name or a page. "COMMAND-SUB" (fr-analyze) is an alias
# of every subcommand without being listed here (hyphen_aliases).
ALIASES: dict[str, str] = {
    "nccl": "nccl-log",
    "nccl_log": "nccl-log",
    "tiny": "make-tiny",
    "dataset": "make-tiny-dataset",
    "shrink": "shrink-layers",
    "snapshot": "mem report",
    "disttest": "dist-test",
    "hang-signal": "signal",
    "sentinel": "nan-sentinel",
    "nan": "numerics",
    "html": "views",
    "perfetto": "trace-event",
    "debugpy": "debugger",
    "ide": "debugger",
    "bench": "benchmarks",
    "matrix": "faults",
    "security": "safety",
    "kubernetes": "k8s",
    "kubectl": "k8s",
}


def hyphen_aliases() -> dict[str, str]:
    """``fr-analyze`` -> ``fr analyze`` for every subcommand in TOPICS."""
    return {k.replace(" ", "-"): k for k in TOPICS if " " in k}


def docs_dir() -> Path:
    """The pages: ``mldebug/docs`` in an installed package (a link to ../docs in a checkout)."""
    return Path(__file__).resolve().parent.parent / "docs"


def pages() -> list[str]:
    return sorted(p.stem for p in docs_dir().glob("*.md"))


def _kind(name: str) -> str:
    from mldebug.cli import COMMANDS

    if name in COMMANDS:
        return "command"
    if name.split(" ", 1)[0] in COMMANDS:
        return "subcommand"
    return "section" if TOPICS[name].section else "page"


def index() -> dict[str, tuple[str, Topic, str | None]]:
    """Every name -> (kind, topic, the name it is an alias of or None), in --list order:
    commands and subcommands, sections, pages, aliases."""
    out: dict[str, tuple[str, Topic, str | None]] = {}
    for name, topic in TOPICS.items():
        out[name] = (_kind(name), topic, None)
    for page in pages():
        out.setdefault(page, ("page", Topic(page), None))
    for alias, target in {**ALIASES, **hyphen_aliases()}.items():
        kind, topic, _ = out[target] if target in out else ("page", Topic(target), None)
        out.setdefault(alias, ("alias", topic, target))
    return out


def completions(words: list[str], prefix: str) -> list[str]:
    """What ``mldebug docs WORDS PREFIX<TAB>`` offers: the names (no generated COMMAND-SUB
    forms) after no word, the subcommands of a command after one."""
    if not words:
        hyphens = hyphen_aliases()
        names = [n for n in index() if " " not in n and n not in hyphens]
    else:
        lead = " ".join(words) + " "
        names = [n[len(lead):] for n in TOPICS if n.startswith(lead) and
                 " " not in n[len(lead):]]
    return [n for n in names if n.startswith(prefix)]


def _complete(prefix: str, parsed_args: argparse.Namespace | None = None,
              **_: Any) -> list[str]:
    words = list(getattr(parsed_args, "name", None) or [])
    return completions(words, prefix)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from mldebug.cli._common import add_json_argument

    name = p.add_argument(
        "name", nargs="*", metavar="NAME",
        help="a command, a subcommand (fr analyze), a page or an alias; --list shows them "
             "(default: the index)")
    name.completer = _complete  # type: ignore[attr-defined]  # argcomplete's hook
    p.add_argument("--list", action="store_true",
                   help="every name, what it is and the page (section) it prints")
    p.add_argument("--whole", action="store_true",
                   help="print the whole page, not only the name's section")
    p.add_argument("--path", action="store_true", help="print the docs directory and exit")
    add_json_argument(p)


# --- the text -------------------------------------------------------------------------------

def headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, text) of every markdown heading outside fenced code blocks."""
    out = []
    fence: str | None = None
    for i, line in enumerate(text.splitlines()):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            mark = stripped[:3]
            fence = mark if fence is None else (None if mark == fence else fence)
            continue
        if fence is None and line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            if level <= 6 and line[level:level + 1] == " ":
                out.append((i, level, line[level:].strip()))
    return out


def section_text(text: str, section: str, through: str | None = None) -> str:
    """The lines from heading ``section`` to the end of its section (its subsections in it),
    or to the end of the section of ``through`` when given."""
    heads = headings(text)
    lines = text.splitlines(keepends=True)

    def find(title: str, after: int = -1) -> tuple[int, int]:
        for i, level, t in heads:
            if t == title and i > after:
                return i, level
        raise MldebugError(f"the documentation has no section {title!r}.",
                           "Reinstall mldebug (pip install -e .); if it persists, report it.")

    start, level = find(section)
    last, last_level = find(through, start) if through else (start, level)
    end = next((i for i, lv, _ in heads if i > last and lv <= last_level), len(lines))
    return "".join(lines[start:end])


@dataclass
class DocsPage:
    """What ``mldebug docs NAME`` prints: the name, where its text is, the text."""

    name: str
    kind: str
    topic: Topic
    alias_of: str | None
    file: Path
    text: str
    whole: bool

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "mldebug.docs/1", "name": self.name, "kind": self.kind,
                "alias_of": self.alias_of, "page": self.topic.page,
                "section": None if self.whole else self.topic.section,
                "through": None if self.whole else self.topic.through,
                "file": str(self.file), "text": self.text}


@dataclass
class DocsList:
    """``mldebug docs --list``: every name, its kind and the page (section) it prints."""

    rows: list[tuple[str, str, Topic, str | None]]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "mldebug.docs.list/1",
                "names": [{"name": n, "kind": k, "page": t.page, "section": t.section,
                           "through": t.through, "alias_of": a} for n, k, t, a in self.rows]}


def _where(t: Topic) -> str:
    where = f"{t.page}.md"
    if t.section:
        where += f" § {t.section}" + (f" .. {t.through}" if t.through else "")
    return where


def _render_list(report: DocsList) -> None:
    width = max(len(n) for n, *_ in report.rows)
    for name, kind, topic, alias in report.rows:
        via = f" (= {alias})" if alias else ""
        print(f"{name:<{width}}  {kind:<10}  {_where(topic)}{via}")


def _render_page(report: DocsPage) -> None:
    t = report.topic
    if t.section and not report.whole:
        print(f"[docs/{t.page}.md, from section '{t.section}'"
              + (f" through '{t.through}'" if t.through else "")
              + f"; the whole page: mldebug docs {t.page} --whole]\n")
    print(report.text, end="")


def resolve(words: list[str]) -> tuple[str, str, Topic, str | None]:
    """(name, kind, topic, alias_of) of the words given; an unknown name is a usage error with
    the closest names and the list of names."""
    known = index()
    name = " ".join(words).strip().removesuffix(".md")
    for candidate in (name, name.lower()):
        if candidate in known:
            kind, topic, alias = known[candidate]
            return candidate, kind, topic, alias
    import difflib

    hyphens = hyphen_aliases()
    listed = [n for n in known if n not in hyphens]
    close = difflib.get_close_matches(name.lower(), listed, n=3, cutoff=0.6)
    fix = ((("Did you mean " + " or ".join(f"'mldebug docs {c}'" for c in close) + "? ")
            if close else "") + "Names: " + ", ".join(listed) + " (mldebug docs --list).")
    raise UsageError(f"no documentation for {name!r}.", fix)


def run(args: argparse.Namespace) -> int:
    from mldebug.cli._common import print_report

    d = docs_dir()
    if args.path:
        print(d)
        return 0
    if args.list:
        if args.name:
            raise UsageError("--list takes no NAME.", "Run 'mldebug docs --list' alone.")
        rows = [(n, k, t, a) for n, (k, t, a) in index().items()]
        print_report(DocsList(rows), args.json, _render_list, show_secrets=True)
        return 0
    name, kind, topic, alias = resolve(args.name or ["index"])
    file = d / f"{topic.page}.md"
    text = file.read_text()
    if topic.section and not args.whole:
        text = section_text(text, topic.section, topic.through)
    page = DocsPage(name, kind, topic, alias, file, text, args.whole or not topic.section)
    print_report(page, args.json, _render_page, show_secrets=True)  # our own text: no secrets
    return 0
