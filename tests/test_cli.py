"""The CLI shell: registry, help, version, usage errors, and no torch on import."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, run_cli

from mldebug import __version__
from mldebug.cli import COMMANDS, available_commands, main


def test_help_lists_every_available_command_with_a_description(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, mod in available_commands().items():
        assert name in out
        assert mod.HELP.split()[0] in out
    assert "hang" in available_commands() and "dist-test" in available_commands()


def test_registry_modules_follow_the_command_contract():
    for name, mod in available_commands().items():
        assert mod.__name__ == COMMANDS[name]
        assert isinstance(mod.HELP, str) and mod.HELP
        assert callable(mod.add_arguments) and callable(mod.run)


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mldebug {__version__}"


def test_unknown_command_and_bad_flag_exit_2(capsys):
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["hang", "--no-such-flag"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err
    assert main([]) == 2


def test_importing_the_cli_does_not_import_torch():
    code = ("import sys, mldebug, mldebug.cli; from mldebug.cli import available_commands; "
            "available_commands(); mldebug.printflock; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_real_cli_subprocess_help_and_hang_without_torch_import():
    r = run_cli("--help")
    assert r.returncode == 0 and "commands" in r.stdout
    code = ("import sys, mldebug.cli; rc = mldebug.cli.main(['hang', '--pattern', 'zzz-none']); "
            "assert 'torch' not in sys.modules; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1, r.stderr
