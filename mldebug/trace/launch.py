"""``mldebug trace run -- python train.py``: rewrite the command so the script runs under
``python -m mldebug.trace run`` with mldebug importable, and run it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from mldebug.errors import UsageError


def traced_argv(command: list[str], out: str, lines: bool) -> list[str]:
    """python [opts] SCRIPT ARGS -> python -m mldebug.trace run [--lines] --out OUT SCRIPT ARGS."""
    cmd = command[1:] if command[:1] == ["--"] else list(command)
    if not cmd:
        raise UsageError("no command to run.", "e.g. mldebug trace run -- python train.py")
    if not os.path.basename(cmd[0]).startswith("python"):
        raise UsageError(f"{cmd[0]} is not a Python interpreter.",
                         "Pass 'python SCRIPT ...'; under torchrun use "
                         "'torchrun ... -m mldebug.trace run SCRIPT'.")
    i = 1
    while i < len(cmd) and cmd[i].startswith("-") and cmd[i] not in ("-m", "-c"):
        i += 1
    if i >= len(cmd) or cmd[i] in ("-m", "-c"):
        raise UsageError("only 'python SCRIPT ARGS' can be traced this way.",
                         "Give the script's path: mldebug trace run -- python train.py")
    return [*cmd[:i], "-m", "mldebug.trace", "run", *(["--lines"] if lines else []),
            "--out", out, *cmd[i:]]


def trace_command(command: list[str], out: str, lines: bool, environ: Mapping[str, str],
                  python: str) -> int:
    argv = traced_argv(command, str(Path(out).resolve()), lines)
    env = dict(environ)
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.call(argv, env=env)
