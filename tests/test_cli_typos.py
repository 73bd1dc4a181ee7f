"""Mistakes a user makes at the command line (issue #40): a mistyped option or subcommand at
every level gets a did-you-mean and the usage of the command it belongs to; a missing optional
dependency names the extra that installs it, never 'internal error'."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mldebug.cli import main
from mldebug.errors import OPTIONAL_MODULES

TYPOS = [
    # argv, the command whose usage is printed, the suggestion
    (["hang", "--jsno"], "mldebug hang", "Did you mean --json (for --jsno)?"),
    (["log", "--world_size", "4", "x.log"], "mldebug log",
     "Did you mean --world-size (for --world_size)?"),
    (["log", "--wrld-size=4", "x.log"], "mldebug log",
     "Did you mean --world-size (for --wrld-size)?"),
    (["fr", "analyze", "--jsno", "d"], "mldebug fr analyze", "Did you mean --json (for --jsno)?"),
    (["fr", "analyse", "d"], "mldebug fr", "Did you mean 'mldebug fr analyze'?"),
    (["numerics", "reprot", "d"], "mldebug numerics", "Did you mean 'mldebug numerics report'?"),
    (["mem", "reprot", "x"], "mldebug mem", "Did you mean 'mldebug mem report'?"),
    (["trace", "shwo"], "mldebug trace", "Did you mean 'mldebug trace show'?"),
    (["env", "--jsn"], "mldebug env", "Did you mean --json (for --jsn)?"),
]


@pytest.mark.parametrize("argv,prog,hint", TYPOS, ids=[" ".join(t[0][:2]) for t in TYPOS])
def test_a_typo_gets_a_did_you_mean_and_its_commands_usage(argv, prog, hint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} "), err
    assert f"{prog}: error: " in err and hint in err, err
    assert "Traceback" not in err


def test_an_option_far_from_any_gets_no_guess(capsys):
    assert main(["hang", "--zzzzqqq"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzqqq" in err and "Did you mean" not in err
    assert err.startswith("usage: mldebug hang ")


def test_the_optional_module_table_covers_every_extra_of_pyproject():
    import re
    from importlib.metadata import requires

    listed = {(dist, extra) for dist, extra in OPTIONAL_MODULES.values()}
    seen = set()
    for req in requires("mldebug") or []:  # "transformers>=4.45; extra == \"tiny\""
        m = re.match(r"([A-Za-z0-9_.-]+)[^;]*;\s*extra\s*==\s*['\"]([\w-]+)['\"]", req)
        if m is None or m[2] in ("all", "dev") or m[1] == "mldebug":
            continue
        seen.add(m[2])
        assert (m[1], m[2]) in listed, f"{m[1]} of [{m[2]}] is not in OPTIONAL_MODULES"
    assert {"torch", "tiny", "plot", "gpu", "ide", "lovely", "bench"} <= seen


def _without(module: str, argv: list[str], tmp_path) -> subprocess.CompletedProcess[str]:
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from mldebug.cli import main\n"
            f"sys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


def test_make_tiny_without_transformers_names_the_tiny_extra(tmp_path):
    r = _without("transformers", ["make-tiny", "gpt2", "-o", str(tmp_path / "t")], tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr == ("mldebug: error: mldebug make-tiny needs transformers, which is not "
                        "installed in this Python.\n  Install it: pip install 'mldebug[tiny]'.\n")


def test_a_missing_module_that_is_no_extra_is_still_a_bug(tmp_path):
    code = ("from mldebug.cli import _main_guarded\n"
            "import mldebug.cli as c\n"
            "def boom(args):\n"
            "    import mldebug_no_such_module  # noqa\n"
            "c._main = boom\n"
            "raise SystemExit(_main_guarded(['env'], False))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60, env={"HOME": str(tmp_path), "PATH": "/usr/bin"})
    assert r.returncode == 1 and "internal error (a bug in mldebug)" in r.stderr, r.stderr


def test_a_far_guess_is_not_offered(capsys):
    """--html on a command without it is not 'did you mean --help?'."""
    assert main(["hang", "analyze", "x", "--html", "v.html"]) == 2
    assert "Did you mean" not in capsys.readouterr().err
