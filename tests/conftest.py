"""Shared fixtures: the local pdsh/sshd cluster, helpers to run the CLI and torchrun jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cluster import ClusterUnavailable, LocalCluster  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
REQUIRE_CLUSTER = os.environ.get("MLDEBUG_REQUIRE_CLUSTER") == "1"


def cluster_unavailable(reason: str) -> None:
    """Fail (CI: MLDEBUG_REQUIRE_CLUSTER=1) or skip when the local cluster cannot start."""
    if REQUIRE_CLUSTER:
        pytest.fail(f"local cluster required but unavailable: {reason}", pytrace=False)
    pytest.skip(f"local cluster unavailable: {reason}")


def start_cluster(workdir: Path, names: list[str],
                  node_env: dict[str, dict[str, str]] | None = None) -> LocalCluster:
    """A started LocalCluster, or fail/skip (see cluster_unavailable) when it cannot start."""
    c = LocalCluster(workdir, names, node_env=node_env)
    try:
        c.start()
    except (ClusterUnavailable, OSError, subprocess.SubprocessError) as e:
        c.stop()
        cluster_unavailable(str(e))
    return c


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three sshd nodes (node1..node3) in their own namespaces, reachable by pdsh."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"), ["node1", "node2", "node3"])
    yield c
    c.stop()


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (python -m mldebug)."""
    full_env = dict(env if env is not None else os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "mldebug", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd or REPO,
        stdin=subprocess.DEVNULL,
    )
