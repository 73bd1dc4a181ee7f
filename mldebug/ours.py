"""Which frames are mldebug's own code, and which a traceback's user frame can be: one rule
for every reader of stacks and tracebacks (``hang``, ``log``, ``why``), so a rank stopped inside one of our hooks (the NanSentinel's check, the
watchdog, printflock) is never named as the user's culprit frame.

A path is ours when it has a ``mldebug/<module>`` part naming a module or package of this
installed package (``.../mldebug/numerics/sentinel.py``, ``mldebug/trace/ring.py``); a user's
own ``mldebug/`` folder with other names is not. Stdlib only.
"""

from __future__ import annotations

import os


def _our_names() -> frozenset[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return frozenset(n.removesuffix(".py") for n in os.listdir(here)
                         if n.endswith(".py") or os.path.isdir(os.path.join(here, n)))
    except OSError:
        return frozenset({"trace", "capture", "debugger", "printing", "numerics", "fr"})


OURS = _our_names() - {"__pycache__", "__init__", "__main__"}


def our_module(path: str) -> str | None:
    """The top module of mldebug a file path belongs to (``numerics``), or None."""
    parts = path.replace("\\", "/").split("/")[-64:]
    for i, part in enumerate(parts[:-1]):  # any mldebug/ part: a checkout has .../mldebug/mldebug/
        if part == "mldebug":
            name = parts[i + 1].removesuffix(".py")
            if name in OURS and (i + 2 < len(parts) or parts[i + 1].endswith(".py")):
                return name
    return None


# a traceback's files that are not the user's code: libraries, the standard library, torch
NOT_USER = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen", "/torch/")


def user_file(path: str) -> bool:
    """Whether a traceback frame's file is the user's code: not a library, the standard
    library, torch, nor mldebug's own hooks (a rank that raised inside the NanSentinel's check
    is the user's step that called it)."""
    return not any(s in path for s in NOT_USER) and our_module(path) is None
