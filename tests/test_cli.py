"""The CLI shell: registry, help, version, usage errors, and no torch on import."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, run_cli

from mldebug import __version__
from mldebug.cli import COMMANDS, HELP, available_commands, build_parser, main


def test_help_lists_every_available_command_with_a_description(capsys, monkeypatch):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in available_commands():
        assert name in out
        assert HELP[name].split()[0] in out
    assert "hang" in available_commands() and "dist-test" in available_commands()
    # printed from the registry alone, it is the whole parser's text on a wide terminal
    monkeypatch.setenv("COLUMNS", "300")
    assert out == build_parser().format_help()
    assert main([]) == 2 and capsys.readouterr().out == out


def test_top_level_help_imports_no_command_module_and_no_typing():
    code = ("import sys, contextlib, io\n"
            "from mldebug.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['--help']) == 0\n"
            "print(sorted(m for m in sys.modules if m.startswith('mldebug.cli.') or m in ('typing', "
            "'argparse') or m.startswith('mldebug.env')))")
    # -S: no site hooks (the dev venv's .pth files import typing themselves)
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_registry_modules_follow_the_command_contract():
    assert list(HELP) == list(COMMANDS)  # every command has its --help line, in the same order
    for name, mod in available_commands().items():
        assert mod.__name__ == COMMANDS[name]
        assert isinstance(HELP[name], str) and HELP[name] and not hasattr(mod, "HELP")
        assert callable(mod.add_arguments) and callable(mod.run)


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mldebug {__version__}"


def test_unknown_command_and_bad_flag_exit_2(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
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


def test_every_command_name_maps_to_its_module():
    assert COMMANDS == {
        "hang": "mldebug.cli.hang",
        "fr": "mldebug.cli.fr",
        "env": "mldebug.cli.env",
        "nccl-log": "mldebug.cli.nccl_log",
        "log": "mldebug.cli.log",
        "why": "mldebug.cli.why",
        "dist-test": "mldebug.cli.dist_test",
        "numerics": "mldebug.cli.numerics",
        "make-tiny": "mldebug.cli.make_tiny",
        "shrink-layers": "mldebug.cli.shrink_layers",
        "make-tiny-dataset": "mldebug.cli.make_tiny_dataset",
        "mem": "mldebug.cli.mem",
        "pdb": "mldebug.cli.pdb",
        "trace": "mldebug.cli.trace",
        "docs": "mldebug.cli.docs",
        "completion": "mldebug.cli.completion",
    }


def test_a_registered_command_whose_module_is_missing_is_an_error(monkeypatch, capsys):
    monkeypatch.setitem(COMMANDS, "ghost", "mldebug.cli.no_such_module")
    monkeypatch.setitem(HELP, "ghost", "a command whose module is gone")
    assert main(["ghost"]) == 1
    err = capsys.readouterr().err
    assert "command 'ghost' is registered but its module mldebug.cli.no_such_module is missing" in err


def _actions(parser, path="mldebug"):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}")
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield path, action


def test_every_option_and_positional_has_help():
    missing = [f"{path} {'/'.join(a.option_strings) or a.dest}"
               for path, a in _actions(build_parser()) if not (a.help or "").strip()]
    assert missing == []


def test_a_misspelt_command_gets_did_you_mean(capsys):
    assert main(["hnag"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'hnag'" in err and "Did you mean 'mldebug hang'?" in err


def test_a_bare_number_after_hang_is_a_pid():
    from mldebug.cli import _prepare

    args = ["hang", "12345", "--json"]
    assert _prepare(args) == "hang"
    assert build_parser("hang").parse_args(args).pid == 12345


def test_an_unexpected_exception_is_one_line_with_a_saved_traceback(monkeypatch, tmp_path, capsys):
    import mldebug.cli.docs as docs_cmd

    def broken(args):
        raise ZeroDivisionError("boom")

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setattr(docs_cmd, "run", broken)
    assert main(["docs"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error (a bug in mldebug): ZeroDivisionError: boom" in err
    (saved,) = (tmp_path / "mldebug" / "bugs").iterdir()
    assert (saved.stat().st_mode & 0o777) == 0o600
    assert (saved.parent.stat().st_mode & 0o777) == 0o700
    assert "Traceback" in saved.read_text() and "ZeroDivisionError: boom" in saved.read_text()
    assert str(saved) in err
    assert main(["docs", "--debug"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_docs_prints_pages_from_the_package(capsys):
    assert main(["docs", "hang"]) == 0
    assert capsys.readouterr().out.startswith("# mldebug hang")
    assert main(["docs", "nosuch"]) == 2
    assert "Names: " in capsys.readouterr().err


def test_completion_scripts_and_a_real_completion(tmp_path, capsys):
    for shell in ("bash", "zsh"):
        assert main(["completion", shell]) == 0
        assert "mldebug" in capsys.readouterr().out
    out = tmp_path / "completions"
    env = dict(__import__("os").environ, _ARGCOMPLETE="1", COMP_LINE="mldebug ha",
               COMP_POINT="10", _ARGCOMPLETE_STDOUT_FILENAME=str(out),
               PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-m", "mldebug"], env=env, cwd=REPO, timeout=60,
                   capture_output=True)
    assert out.read_text().split() == ["hang"]


@pytest.mark.parametrize(("args", "needle"), [
    (["env", "--timeout", "nan"], "--timeout must be positive and finite, not nan"),
    (["env", "--connect-timeout", "-3"], "--connect-timeout must be positive and finite"),
    (["hang", "--nodes", ""], "--nodes is empty"),
    (["env", "--hostfile", "/dev/zero"], "is larger than 16 MiB"),
    (["env", "--exclude", "node1"], "--exclude needs a host list or a SLURM job"),
])
def test_hostile_cli_input_is_one_clear_line(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_a_non_utf8_hostfile_is_a_usage_error(tmp_path, capsys):
    f = tmp_path / "hosts"
    f.write_bytes(b"node1\nnode\xff2\n")
    assert main(["env", "--hostfile", str(f)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


def test_wcoll_names_the_host_list(tmp_path, monkeypatch):
    from mldebug.cli._common import fanout_options

    f = tmp_path / "hosts"
    f.write_text("node[1-3]\n")
    monkeypatch.setenv("WCOLL", str(f))
    args = build_parser("env").parse_args(["env", "-x", "node2"])
    opts = fanout_options(args)
    assert opts.hosts == ["node1", "node2", "node3"] and opts.exclude == ["node2"]


def test_real_cli_misspelt_command_and_bare_pid():
    r = run_cli("hnag")
    assert r.returncode == 2 and "Did you mean 'mldebug hang'?" in r.stderr
    r = run_cli("hang", "999999999", "--json")
    assert r.returncode == 1 and "invalid choice" not in r.stderr and "Traceback" not in r.stderr


def test_short_flags_users_type_from_habit():
    p = build_parser()
    assert p.parse_args(["hang", "-o", "d"]).out == "d"
    assert p.parse_args(["fr", "trigger", "-o", "d"]).out == "d"
    assert p.parse_args(["make-tiny", "llama", "-o", "d"]).out == "d"
    assert p.parse_args(["hang", "-x", "n1", "-w", "n[1-2]"]).exclude == "n1"
    assert p.parse_args(["dist-test", "--nproc_per_node", "2"]).nproc == 2
    assert p.parse_args(["dist-test", "--nproc-per-node", "2"]).nproc == 2


def _tmpfs(path, *opts):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=64k", *opts)), "tmpfs",
                        str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


def test_a_read_only_or_full_output_is_one_clear_line_not_a_bug(tmp_path):
    ro, full = tmp_path / "ro", tmp_path / "full"
    _tmpfs(ro, "ro")
    _tmpfs(full)
    try:
        (full / "fill").write_bytes(b"\0" * 60_000)
        r = run_cli("hang", "--pattern", "zzz-none", "--out", str(ro / "x"))
        assert r.returncode == 1 and "read-only" in r.stderr and "internal error" not in r.stderr, r.stderr
        fixture = REPO / "tests" / "fixtures" / "log"
        with open(full / "out.json", "w") as out:
            r2 = subprocess.run([sys.executable, "-m", "mldebug", "log", str(fixture), "--json"],
                                stdout=out, stderr=subprocess.PIPE, text=True, cwd=REPO)
        assert r2.returncode == 1, r2.stderr
        assert "cannot write the output: the disk is full" in r2.stderr and "internal error" not in r2.stderr
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)
        subprocess.run(["umount", str(full)], capture_output=True)
