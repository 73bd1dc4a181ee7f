"""The fr command line: env lines, analyze output/JSON/--all, usage errors, no torch import."""

from __future__ import annotations

import json
import subprocess
import sys

import fr_synth as synth
from conftest import REPO, run_cli


def test_env_prints_current_and_old_names():
    r = run_cli("fr", "env", "--dir", "/scratch/fr", "--buffer-size", "500")
    assert r.returncode == 0, r.stderr
    lines = dict(line.split("  #")[0].removeprefix("export ").split("=", 1)
                 for line in r.stdout.splitlines() if line.startswith("export "))
    assert lines["TORCH_FR_BUFFER_SIZE"] == "500" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in lines
    # torch 2.9+ warns on every rank when the old buffer name is set: printed commented out
    assert "# export TORCH_NCCL_TRACE_BUFFER_SIZE=500  # torch before 2.9 only" in r.stdout
    assert lines["TORCH_FR_DUMP_ON_TIMEOUT"] == lines["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and lines["TORCH_NCCL_DESYNC_DEBUG"] == "1"
    assert lines["TORCH_FR_DUMP_TEMP_FILE"] == "/scratch/fr/nccl/fr_rank"
    assert lines["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/fr/nccl/fr_rank"
    assert "before torch 2.9" in r.stdout


def test_enable_sets_no_name_this_torch_warns_about(tmp_path):
    """Issue #40: fr.enable() made every rank print torch's 'TORCH_NCCL_TRACE_BUFFER_SIZE is
    deprecated' warning. A real 1-rank gloo job under enable(): no deprecation line."""
    import subprocess
    import sys

    from mldebug.fr.recorder import native_env, torch_before

    assert not torch_before(2, 9)  # this venv's torch 2.13
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in native_env(tmp_path)
    assert native_env(tmp_path, legacy=True)["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    code = ("import socket, torch, torch.distributed as dist, mldebug.fr as fr\n"
            "fr.enable()\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
            "dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, "
            "world_size=1)\n"
            "dist.all_reduce(torch.ones(2)); dist.destroy_process_group(); print('ok')\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TORCH_")}
    env.update(PYTHONPATH=str(REPO), MLDEBUG_FR_DIR=str(tmp_path / "fr"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert "deprecated" not in r.stderr, r.stderr


def test_analyze_human_json_and_all(tmp_path):
    synth.write(tmp_path, synth.spmd_job(4, 9, fault="skip", culprit=3, at=6))
    r = run_cli("fr", "analyze", str(tmp_path), "--frames", "1", env={"NO_COLOR": "1", "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert "Culprit rank(s): 3" in r.stdout and "gather_metrics at /job/train.py:57" in r.stdout
    assert "main at /job/train.py:99" not in r.stdout  # --frames 1
    j = run_cli("fr", "analyze", str(tmp_path), "--json")
    doc = json.loads(j.stdout)
    m = doc["mismatches"][0]
    assert (m["pg"], m["seq"], m["kind"], m["culprit_ranks"]) == ("0", 6, "missing", [3])
    assert m["call_sites"][0]["frames"][0] == "gather_metrics at /job/train.py:57"
    assert doc["missing_ranks"] == [] and doc["never_enqueued"] == [3]
    (err,) = [f for f in doc["findings"] if f["severity"] == "error"]
    assert err["code"] == "fr-missing" and "mldebug hang" in err["fix"] and "3" in err["title"]
    a = run_cli("fr", "analyze", str(tmp_path), "--all", env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert "0:#5" in a.stdout and "rank 3" in a.stdout


def test_analyze_usage_errors(tmp_path):
    r = run_cli("fr", "analyze", str(tmp_path / "nope"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "junk").write_bytes(b"\x80\x04junk")
    r = run_cli("fr", "analyze", str(tmp_path))
    assert r.returncode == 1 and "none of the files could be loaded" in r.stderr
    r = run_cli("fr")
    assert r.returncode == 2 and "subcommand" in r.stderr


def test_trigger_with_nothing_registered_says_what_to_do(tmp_path):
    r = run_cli("fr", "trigger", "--dir", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                "--timeout", "3")
    assert r.returncode == 1
    assert "does not exist" in r.stdout and "0 dump(s)" in r.stdout


def test_cli_and_fr_package_do_not_import_torch():
    code = ("import sys, mldebug.cli, mldebug.fr, mldebug.fr.analyze, mldebug.fr.collect, "
            "mldebug.cli.fr; mldebug.cli.build_parser(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


def test_node_script_is_stdlib_only():
    import ast
    from pathlib import Path

    import mldebug.fr.node as node
    from mldebug.fr.collect import NODE_MODULES

    tree = ast.parse(Path(node.__file__).read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    # besides the stdlib, only what the fan-out bundles with it (mldebug.nodekit)
    mods -= set(NODE_MODULES)
    assert {m.split(".")[0] for m in mods} <= set(sys.stdlib_module_names) | {"__future__"}, mods
