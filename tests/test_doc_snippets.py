"""Every fenced block of README.md and docs/*.md, extracted (never copied) and checked, so a
snippet cannot rot (issue #40).

Each fence names its language; an untagged fence fails:

- ``python``: run for real in a subprocess (this venv's python, torch available, 60 s) in a
  temporary directory, after PRELUDE below: a 1-rank gloo process group (env:// init on a free port) and a
  tiny torch model (the environment torchrun gives a rank), so the training-code fragments' names (``model``, ``net``, ``ddp_model``,
  ``optimizer``, ``loss``, ``batch``, ``loader``, ``train_step`` ...) exist. Its stdin is a
  pseudo-terminal fed ``c`` lines, so an ``mldebug.breakpoint`` that stops opens a real pdb
  on it and continues. A block after ``<!-- snippet: no-run: REASON -->`` is compile()d and
  its ``import`` / ``from ... import`` lines run for real.
- ``bash`` (commands a user types) and ``console`` (a transcript: ``$ `` lines are commands,
  the rest output): every ``mldebug ...`` command (also after ``python -m``, ``torchrun -m``,
  ``srun``, ``capsh -c``) is parsed by the real argparse parser (``mldebug.cli.build_parser``,
  after the CLI's own ``_prepare``), without running; an ALL-CAPS placeholder (``PID``,
  ``DIR``) may fail its option's type. A transcript whose output is ``mldebug: error: ...`` is
  run for real (from the repo root) and must print that error line. ``recipes/``, ``tests/``,
  ``benchmarks/``, ``scripts/`` paths exist; ``make`` targets exist in the Makefile; ``pip``
  extras exist in pyproject.toml; any other program must be one of OTHER_PROGRAMS.
- ``usage`` (a synopsis): every ``--option`` it names exists in that command's parser.
- ``json``: parses as JSON. ``text``: output or a format, not run.

The README must also say how long ``make test`` takes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pty
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGS = {"python", "bash", "console", "usage", "json", "text"}
NO_RUN = re.compile(r"<!--\s*snippet:\s*no-run:\s*(\S.*?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")

# programs a doc's command may name besides mldebug, python, torchrun, make, pip
OTHER_PROGRAMS = {"git", "cd", "export", "kubectl", "jq", "grep", "head", "cat", "pdsh", "setsid",
                  "/usr/bin/time", "mkdir", "eval", "echo", "scp", "xdg-open", "py-spy", "pgrep",
                  "xargs", "ssh", "pipx", "uv", "tail"}

PRELUDE = r'''
import os, sys, tempfile
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo")  # env://, as under torchrun

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    def forward(self, batch):
        return self.layers(batch).pow(2).mean()

torch.manual_seed(0)
net = model = Net()
ddp_model = DDP(net)
optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
batch = x = torch.randn(4, 8)
loader = [torch.randn(4, 8) for _ in range(3)]
loss = model(batch)
norm = 0.93
out_dir = Path(tempfile.mkdtemp())
def train_step(batch):
    loss = model(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
'''


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    body: str
    no_run: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def extract(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.groups()
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln
                         for ln in lines[i + 1:j])
        prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        marker = NO_RUN.search(prev)
        blocks.append(Block(page, i + 1, lang, body, marker.group(1) if marker else None))
        i = j + 1
    return blocks


BLOCKS = [b for page in PAGES for b in extract(page)]


def of(*langs: str) -> list[pytest.param]:  # type: ignore[valid-type]
    return [pytest.param(b, id=b.name) for b in BLOCKS if b.lang in langs]


def test_every_fence_names_a_known_language() -> None:
    assert len(BLOCKS) > 100, "the extractor found too few blocks"
    bad = [f"{b.name}: {b.lang or '(none)'}" for b in BLOCKS if b.lang not in LANGS]
    assert not bad, f"tag these fences with one of {sorted(LANGS)}: {bad}"


def test_readme_states_make_test_duration() -> None:
    text = (REPO / "README.md").read_text()
    assert re.search(r"`make test` takes about \d+ minutes", text), \
        "the README must say how long `make test` takes on the 2-core machine"


# --- python ----------------------------------------------------------------------------------

def _run_python(code: str, cwd: Path, timeout: float = 60.0) -> tuple[int, str]:
    """Run ``code`` in a new session whose stdin is a pseudo-terminal fed ``c`` lines."""
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), MLDEBUG_PDB_DIR=str(cwd / "pdb"),
               OMP_NUM_THREADS="1")
    try:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
        os.write(master, b"c\n" * 8)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            return -9, out.decode(errors="replace")
        return proc.returncode, out.decode(errors="replace")
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("block", of("python"))
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    compile(block.body, block.name, "exec")
    if block.no_run:
        imports = "\n".join(ln for ln in block.body.splitlines()
                            if re.match(r"(import|from) \S+", ln))
        code = imports + "\nprint('imports ok')\n"
    else:
        code = PRELUDE + "\n" + block.body + "\nprint('snippet ok')\n"
    t0 = time.monotonic()
    rc, out = _run_python(code, tmp_path)
    assert rc == 0 and out.rstrip().endswith("ok"), \
        f"{block.name} failed (rc {rc}, {time.monotonic() - t0:.1f}s):\n{out[-3000:]}"


# --- shell -----------------------------------------------------------------------------------

def commands(block: Block) -> list[tuple[str, list[str]]]:
    """(command line, the output lines after it) for a bash or console block."""
    out: list[tuple[str, list[str]]] = []
    lines = block.body.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i].strip()
        if block.lang == "console":
            if not raw.startswith("$ "):
                if out:
                    out[-1][1].append(lines[i])
                i += 1
                continue
            raw = raw[2:]
        if not raw or raw.startswith("#"):
            i += 1
            continue
        while raw.endswith("\\") and i + 1 < len(lines):
            i += 1
            raw = raw[:-1] + " " + lines[i].strip()
        while i + 1 < len(lines) and not _closed(raw):  # a quote open across lines
            i += 1
            raw += "\n" + lines[i]
        out.append((raw, []))
        i += 1
    return out


def _closed(cmd: str) -> bool:
    try:
        shlex.split(cmd)
    except ValueError:
        return False
    return True


def _words(cmd: str) -> list[list[str]]:
    """The simple commands of a line (split at | ; && & and redirections dropped)."""
    cmd = re.sub(r"\d*>&\d+|\b\d+(?=[<>])", " ", cmd)  # 2>&1, 2>file: no words
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    parts: list[list[str]] = [[]]
    redirect = False
    for tok in lex:
        if tok and set(tok) <= set(";&|"):
            parts.append([])
        elif tok and set(tok) <= set("<>"):
            redirect = True
        elif redirect:
            redirect = False  # the redirection's file
        else:
            parts[-1].append(tok)
    return [p for p in parts if p]


class _ParseError(Exception):
    pass


@contextlib.contextmanager
def _raising_parser():  # type: ignore[no-untyped-def]
    def error(self: argparse.ArgumentParser, message: str) -> None:
        raise _ParseError(f"{self.prog}: {message}")

    old = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = error  # type: ignore[method-assign,assignment]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        argparse.ArgumentParser.error = old  # type: ignore[method-assign]


def parse_mldebug(argv: list[str]) -> str | None:
    """None when the real parser accepts ``argv`` (the words after ``mldebug``), else why."""
    from mldebug import cli
    from mldebug.errors import UsageError

    args, _ = cli._split_debug(list(argv))
    try:
        only = cli._prepare(args)
    except UsageError as e:
        return e.message
    if only is None:
        return None if args and args[0] in ("-h", "--help", "--version") else "no command"
    with _raising_parser():
        try:
            cli.build_parser(only).parse_args(args)
        except _ParseError as e:
            m = re.search(r"invalid \S+ value: '([^']*)'", str(e))
            if m and re.fullmatch(r"[A-Z][A-Z0-9_-]*", m.group(1)):
                return None  # a placeholder (PID, DIR) in a parse-only check
            return str(e)
        except SystemExit:
            return None
    return None


def _makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", text, re.M))


def _pip_extras() -> set[str]:
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return set(data["project"]["optional-dependencies"])


REPO_DIRS = ("recipes/", "tests/", "benchmarks/", "scripts/", "bin/")


def check_words(words: list[str], problems: list[str]) -> None:
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]  # VAR=value prefixes
    if not words or words[0].startswith("("):
        return
    for w in words:
        if w.startswith(REPO_DIRS) and not (REPO / w.rstrip("/")).exists() \
                and not w.startswith("tests/fixtures/") or \
                w.startswith("tests/fixtures/") and not (REPO / w).exists():
            problems.append(f"no such file in the repository: {w}")
    prog = words[0]
    name = prog.rsplit("/", 1)[-1]
    if prog == "setsid":
        return check_words(words[1:], problems)
    if prog == "capsh":
        if "-c" in words:
            for inner in _words(words[words.index("-c") + 1]):
                check_words(inner, problems)
        return
    if prog == "srun":
        return check_words([w for w in words[1:] if not w.startswith("-")][:1] +
                           words[1 + next(i for i, w in enumerate(words[1:])
                                          if not w.startswith("-")) + 1:], problems)
    if prog == "mldebug":
        why = parse_mldebug(words[1:])
        if why:
            problems.append(f"mldebug {shlex.join(words[1:])}: {why}")
        return
    if re.fullmatch(r"python[0-9.]*", name) or prog == "torchrun":
        if "-m" in words:
            rest = words[words.index("-m") + 1:]
            if rest and rest[0] == "mldebug":
                check_words(rest, problems)
            return
        scripts = [w for w in words[1:] if w.endswith(".py")]
        if not scripts and not (len(words) > 1 and words[1] == "-c"):
            problems.append(f"{prog}: names no script")
        return
    if prog == "make":
        missing = [t for t in words[1:] if not t.startswith("-") and "=" not in t
                   and t not in _makefile_targets()]
        if missing:
            problems.append(f"make: no target {missing} in the Makefile")
        return
    if prog in ("pip", "pipx") or words[:2] == ["uv", "tool"]:
        for w in words:
            m = re.search(r"\[([^\]]+)\]$", w)
            if m and "mldebug" in w:
                for extra in m.group(1).split(","):
                    if extra not in _pip_extras():
                        problems.append(f"pip: no extra {extra!r} in pyproject.toml")
        return
    if prog not in OTHER_PROGRAMS and name not in OTHER_PROGRAMS:
        problems.append(f"unknown program {prog!r}: a typo, or add it to OTHER_PROGRAMS")


def _run_error_example(cmd: str, expected: str) -> str | None:
    """Run a documented usage error for real; None when it prints ``expected``."""
    words = _words(cmd)
    if len(words) != 1 or words[0][0] != "mldebug":
        return None
    proc = subprocess.run([sys.executable, "-m", "mldebug", *words[0][1:]], cwd=REPO,
                          capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    first = proc.stderr.strip().splitlines()[:1]
    if proc.returncode not in (1, 2) or first != [expected.strip()]:
        return f"{cmd}: the docs say {expected.strip()!r}, it says {first} (rc {proc.returncode})"
    return None


@pytest.mark.parametrize("block", of("bash", "console"))
def test_shell_block_commands(block: Block) -> None:
    problems: list[str] = []
    cmds = commands(block)
    assert cmds, f"{block.name}: a {block.lang} block with no command"
    for cmd, output in cmds:
        first_out = next((ln for ln in output if ln.strip()), "")
        if block.lang == "console" and first_out.startswith("mldebug: error:") \
                and "..." not in first_out and "elided" not in cmd:
            # a documented error: say it for real when it is cheap and local
            why = _run_error_example(cmd, first_out) if not re.search(
                r"\b(trace show|pdb attach|mem record|make-tiny-dataset)\b", cmd) else None
            if why:
                problems.append(why)
            continue
        for words in _words(cmd):
            check_words(words, problems)
    assert not problems, f"{block.name}:\n  " + "\n  ".join(problems)


# --- usage, json -----------------------------------------------------------------------------

@pytest.mark.parametrize("block", of("usage"))
def test_usage_options_exist(block: Block) -> None:
    from mldebug import cli

    words = block.body.split()
    assert words[0] == "mldebug" and words[1] in cli.COMMANDS, block.name
    parser = cli.build_parser(words[1])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = set(sub.choices[words[1]]._option_string_actions)
    options = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", block.body))
    assert options, block.name
    missing = sorted(options - known)
    assert not missing, f"{block.name}: mldebug {words[1]} has no option {missing}"


@pytest.mark.parametrize("block", of("json"))
def test_json_block_parses(block: Block) -> None:
    json.loads(block.body)
