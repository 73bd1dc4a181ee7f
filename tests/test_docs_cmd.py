"""`mldebug docs`: every command, subcommand and page resolves; unknown names; --list/--json;
shell completion of the names through the real generated bash script."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from mldebug.cli import COMMANDS, build_parser, main
from mldebug.cli import docs as docs_cmd


def _subcommands() -> list[str]:
    """'COMMAND SUB' for every subcommand the real parsers define."""
    out = []
    top = build_parser()
    (commands,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in commands.choices.items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [f"{name} {sub}" for sub in action.choices]
    return out


def test_every_command_subcommand_and_page_resolves_to_a_real_heading():
    subs = _subcommands()
    assert {"fr analyze", "mem top", "trace show", "hang analyze", "pdb attach"} <= set(subs)
    pages = sorted(p.stem for p in (REPO / "docs").glob("*.md"))
    for name in [*COMMANDS, *subs, *pages]:
        _, kind, topic, _ = docs_cmd.resolve(name.split())
        text = (REPO / "docs" / f"{topic.page}.md").read_text()
        if topic.section:  # the heading exists outside code blocks, and its text is cut
            part = docs_cmd.section_text(text, topic.section, topic.through)
            assert part.lstrip("#").lstrip().startswith(topic.section), name
            assert 0 < len(part) < len(text), name
        assert kind in {"command", "subcommand", "page", "section"}, name
    for _, topic, _ in docs_cmd.index().values():  # aliases and named sections too
        text = (REPO / "docs" / f"{topic.page}.md").read_text()
        if topic.section:
            docs_cmd.section_text(text, topic.section, topic.through)


@pytest.mark.parametrize(("words", "first", "needle"), [
    (["mem"], "# mldebug memory", "## mldebug mem probe"),
    (["pdb"], "# `mldebug pdb`", "## Post-mortem"),
    (["hang", "analyze"], "[docs/hang.md, from section 'Save and re-analyse'", "hang analyze DIR"),
    (["mem", "top"], "[docs/memory.md, from section 'mldebug mem top'", "## mldebug mem top"),
    (["fr-analyze"], "[docs/fr.md, from section '`mldebug fr analyze`'", "### JSON schema"),
    (["shrink-layers"], "[docs/make-tiny.md", "## mldebug shrink-layers"),
    (["make-tiny-dataset"], "[docs/make-tiny.md", "## mldebug make-tiny-dataset"),
    (["trace"], "[docs/capture.md", "## Full traces: `mldebug trace run`"),
    (["docs"], "[docs/completion.md", "## `mldebug docs`"),
    (["completion"], "# Docs and completion", "## `mldebug completion`"),
    (["nccl"], "# mldebug nccl-log", "## JSON"),
])
def test_names_print_their_page_or_section(words, first, needle, capsys):
    assert main(["docs", *words]) == 0
    out = capsys.readouterr().out
    assert out.startswith(first) and needle in out, out[:300]


def test_a_section_is_cut_where_the_next_one_starts_and_whole_prints_the_page(capsys):
    assert main(["docs", "mem", "top"]) == 0
    out = capsys.readouterr().out
    assert "## mldebug mem top" in out and "## mldebug mem peak" not in out
    assert "## mldebug mem report" not in out
    assert main(["docs", "mem", "top", "--whole"]) == 0
    assert capsys.readouterr().out == (REPO / "docs" / "memory.md").read_text()
    assert main(["docs", "trace"]) == 0  # a span: the ring through 'trace run', not Limits
    out = capsys.readouterr().out
    assert "## A live job" in out and "## Full traces" in out and "## Limits" not in out
    assert "## Stall watchdog" not in out


def test_an_unknown_name_says_did_you_mean_and_lists_the_names_exit_2():
    r = run_cli("docs", "fr", "analyse")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert "no documentation for 'fr analyse'" in r.stderr
    assert "Did you mean 'mldebug docs fr analyze'" in r.stderr
    names = r.stderr.split("Names: ", 1)[1]
    for n in ("mem", "memory", "pdb", "trace show", "completion", "nccl"):
        assert f" {n}," in f" {names}", n
    r = run_cli("docs", "zzzz")
    assert r.returncode == 2 and "Did you mean" not in r.stderr and "Names: " in r.stderr


def test_list_and_json(capsys):
    assert main(["docs", "--list"]) == 0
    rows = {line.split("  ")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "memory.md" in rows["mem"] and "alias" in rows["nccl"] and "nccl-log.md" in rows["nccl"]
    assert "memory.md § mldebug mem top" in rows["mem top"]
    assert main(["docs", "--list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # the JSON envelope (docs/json.md); the old schema string stays one release
    assert doc["schema"] == "mldebug.docs/2" and doc["legacy_schema"] == "mldebug.docs.list/1"
    by_name = {n["name"]: n for n in doc["names"]}
    assert set(COMMANDS) | set(_subcommands()) <= set(by_name)
    assert by_name["pdb"] == {"name": "pdb", "kind": "command", "page": "debugger",
                              "section": None, "through": None, "alias_of": None}
    assert by_name["fr-analyze"]["alias_of"] == "fr analyze"
    assert by_name["fr analyze"]["kind"] == "subcommand"
    assert by_name["safety"]["kind"] == "page"
    assert main(["docs", "fr", "analyze", "--json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert page["schema"] == "mldebug.docs/2" and page["page"] == "fr"
    assert page["legacy_schema"] == "mldebug.docs/1"
    assert page["section"] == "`mldebug fr analyze`" and page["kind"] == "subcommand"
    assert page["text"].startswith("## `mldebug fr analyze`")
    assert main(["docs", "--list", "mem"]) == 2


def _complete_in_bash(tmp_path: Path, line: str) -> list[str]:
    """What the generated bash script's completion function puts in COMPREPLY for ``line``,
    with a real `mldebug` on PATH (this interpreter, this checkout)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "mldebug"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m mldebug \"$@\"\n")
    exe.chmod(0o755)
    script = r"""
source <(mldebug completion bash)
COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<< "$1"; COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
if [[ "$1" == *" " ]]; then COMP_WORDS+=(""); COMP_CWORD=$((COMP_CWORD + 1)); fi
_python_argcomplete mldebug
printf '%s\n' "${COMPREPLY[@]}"
"""
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(REPO))
    r = subprocess.run(["bash", "-c", script, "bash", line], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    return [w.strip() for w in r.stdout.splitlines() if w.strip()]


def test_bash_completion_offers_doc_names_and_subcommands(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    (tmp_path / "memfile.txt").write_text("")  # a file name completion must not offer
    assert _complete_in_bash(tmp_path, "mldebug docs me") == ["mem", "memory"]
    assert _complete_in_bash(tmp_path, "mldebug docs fr ") == [
        "-h", "--help", "--list", "--whole", "--path", "--json",
        "trigger", "analyze", "watch", "env"]
    assert _complete_in_bash(tmp_path, "mldebug docs mem t") == ["top"]
    offered = _complete_in_bash(tmp_path, "mldebug docs ")
    assert {*COMMANDS, "memory", "debugger", "capture", "safety", "nccl"} <= set(offered)
    assert "fr-analyze" not in offered and "memfile.txt" not in offered
    for command, subs in [("mem", {"report", "compare", "plot", "top", "peak", "probe"}),
                          ("fr", {"trigger", "analyze", "watch", "env"}),
                          ("pdb", {"list", "connect", "attach"}), ("trace", {"show", "run"}),
                          ("hang", {"analyze"}), ("numerics", {"report"})]:
        assert subs <= set(_complete_in_bash(tmp_path, f"mldebug {command} ")), command
