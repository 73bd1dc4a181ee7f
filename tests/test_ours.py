"""mldebug's own frames are never the user's culprit frame (issue #43 item 5): one rule
(``mldebug.ours``) for ``hang`` and ``log``, also for a source checkout, whose paths read
``.../mldebug/mldebug/numerics/sentinel.py`` (the first ``mldebug/`` is the repository)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mldebug.cli import main
from mldebug.hang.frames import frame_kind, our_role
from mldebug.hang.model import StackFrame
from mldebug.ours import our_module

CHECKOUT = "/home/u/src/mldebug/mldebug/numerics/sentinel.py"


@pytest.mark.parametrize(("path", "module"), [
    (CHECKOUT, "numerics"),
    ("/opt/venv/lib/python3.11/site-packages/mldebug/trace/ring.py", "trace"),
    ("mldebug/printing.py", "printing"),
    ("C:\\u\\mldebug\\fr\\node.py", "fr"),
    ("/u/mldebug/train.py", None),  # a user's own folder named mldebug: not ours
    ("/u/mldebug/mldebug_utils/x.py", None),
    ("/u/proj/train.py", None),
    ("mldebug/trace", None),  # a folder, not a frame's file
])
def test_our_module_names_our_packages_only(path, module):
    assert our_module(path) == module


def test_hang_a_checkout_frame_is_ours_and_says_what_it_does():
    """Before: the first `mldebug/` of the path (the repository) was read, so a checkout's
    frames were 'user' frames and could be named as the culprit's call site."""
    f = StackFrame(name="_decide", filename=CHECKOUT, line=520)
    assert frame_kind(f) == "mldebug"
    assert our_role([f]) == "the numerics hooks"


@pytest.mark.parametrize("where", [CHECKOUT,
                                   "/opt/venv/lib/python3.11/site-packages/mldebug/numerics/"
                                   "sentinel.py"])
def test_log_names_the_users_frame_not_the_sentinels(where, tmp_path: Path, capsys):
    """A rank that raised inside NanSentinel.step() (its check found a NaN): the log's verdict
    is at the user's train.py line that entered the block, never sentinel.py."""
    log = tmp_path / "job.log"
    log.write_text(
        "[rank0]:step 10 loss 2.1\n[rank1]:step 10 loss 2.2\n"
        "[rank1]:Traceback (most recent call last):\n"
        '[rank1]:  File "/home/u/proj/train.py", line 88, in <module>\n'
        "[rank1]:    with sentinel.step(batch):\n"
        '[rank1]:  File "/usr/lib/python3.11/contextlib.py", line 144, in __exit__\n'
        "[rank1]:    next(self.gen)\n"
        f'[rank1]:  File "{where}", line 520, in _decide\n'
        "[rank1]:    raise NonFiniteDetected(text, rec)\n"
        "[rank1]:mldebug.numerics.sentinel.NonFiniteDetected: NanSentinel: non-finite loss or "
        "gradients at step 11, born on rank(s) 1\n")
    assert main(["log", str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    text = json.dumps(doc["verdict"])
    assert "train.py:88" in text and "sentinel.py" not in text, doc["verdict"]
    assert doc["culprits"] == [1]
