"""Installing mldebug where users install it: into a training environment that already has torch,
and as a CLI alone (no torch). Real venvs and real pip; nothing is downloaded beyond what the
configured pip index serves (the core dependencies), and no torch wheel is installed: the
"training environment" sees the test runner's torch through a .pth file, as an image's
site-packages would be seen."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

RUNNER_SITE = sysconfig.get_paths()["purelib"]  # holds torch 2.13.0 (and setuptools)


def _run(*cmd: str | Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    if env is None:  # the venvs must not see this checkout through the test's PYTHONPATH
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL, cwd="/")  # not the checkout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what `pip install <checkout>` reads, so no build files land in the repository."""
    d = tmp_path_factory.mktemp("checkout") / "mldebug"
    d.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, d / name)
    shutil.copytree(REPO / "mldebug", d / "mldebug",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return d


@pytest.fixture(scope="module")
def wheel(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout built once into a wheel, with the build's warnings checked."""
    wheels = tmp_path_factory.mktemp("wheels")
    r = _run(sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
             "-w", wheels, checkout)
    assert r.returncode == 0, r.stderr[-3000:]
    build_log = r.stdout + r.stderr
    assert "SetuptoolsDeprecationWarning" not in build_log, build_log[-3000:]
    return next(wheels.glob("mldebug-*.whl"))


def _venv(path: Path, *, see_runner: bool) -> Path:
    """A new venv without pip; with ``see_runner`` it also sees the runner's site-packages."""
    r = _run(sys.executable, "-m", "venv", "--without-pip", path)
    assert r.returncode == 0, r.stderr
    py = path / "bin" / "python"
    if see_runner:
        site = _run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        (Path(site.stdout.strip()) / "training_env.pth").write_text(RUNNER_SITE + "\n")
    return py


def _torch_state(py: Path) -> dict[str, str]:
    """Which torch the environment imports (found, not imported: that takes seconds)."""
    r = _run(py, "-c", "import json, os, importlib.util as u, importlib.metadata as m; "
             "d = m.distribution('torch'); rec = d.locate_file(d._path / 'RECORD'); "
             "print(json.dumps({'version': m.version('torch'), 'file': u.find_spec('torch').origin, "
             "'record_mtime': str(os.stat(rec).st_mtime_ns)}))")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_install_into_an_environment_with_torch_leaves_torch_untouched(
        wheel: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    py = _venv(tmp_path / "train-env", see_runner=True)
    before = _torch_state(py)
    assert before["version"].startswith("2.13.0")
    report = tmp_path / "pip-report.json"
    r = _run(py, "-m", "pip", "install", "--report", report, f"{wheel}[torch]")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    installed = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert installed == ["mldebug"], installed
    assert "Requirement already satisfied: torch" in r.stdout
    assert _torch_state(py) == before
    own_site = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                    .stdout.strip())
    assert not list(own_site.glob("torch*")), "pip put a second torch into the environment"
    r = _run(py, "-c", "import mldebug; print(mldebug.__file__)")
    assert r.returncode == 0 and str(own_site) in r.stdout, r.stderr


def test_cli_only_install_runs_the_torch_free_commands(wheel: Path, tmp_path: Path) -> None:
    py = _venv(tmp_path / "cli", see_runner=False)
    r = _run(sys.executable, "-m", "pip", "--python", py, "install", wheel)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = _run(py, "-c", "import torch")
    assert r.returncode == 1 and "No module named 'torch'" in r.stderr
    exe = py.parent / "mldebug"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{py.parent}{os.pathsep}{env['PATH']}"
    r = _run(exe, "hang", "--help", env=env)
    assert r.returncode == 0 and "usage: mldebug hang" in r.stdout, r.stderr
    r = _run(exe, "env", "--json", env=env)
    assert r.returncode in (0, 1) and "findings" in json.loads(r.stdout), r.stderr
    r = _run(exe, "nccl-log", REPO / "tests" / "fixtures" / "nccl" / "fastsocket.log", "--json",
             env=env)
    assert r.returncode in (0, 1) and "findings" in json.loads(r.stdout), r.stderr
    import fr_synth as synth

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    synth.write(dumps, synth.spmd_job(2, 4, fault="skip", culprit=1, at=2))
    r = _run(exe, "fr", "analyze", dumps, env=env)
    assert r.returncode in (0, 1) and "rank 1" in r.stdout, r.stdout + r.stderr
    r = _run(exe, "--help", env=env)
    assert " log " in r.stdout
    r = _run(exe, "log", REPO / "tests" / "fixtures" / "log" / "cppo-6-sigkill.log", "--json",
             env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["culprits"] == [0], r.stderr
