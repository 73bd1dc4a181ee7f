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

# Every process a test starts inherits this mark (tests pass dict(os.environ, ...)), so the
# ones still running when the session ends are found, named and killed, and the session
# fails: a leaked torchrun rank keeps burning CPU under every later test.
# Under pytest-xdist the workers inherit the controller's mark, so the controller's check at
# the end also finds what a worker's test leaked.
SESSION_MARK = (os.environ["MLDEBUG_TEST_SESSION"]
                if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("MLDEBUG_TEST_SESSION")
                else f"{os.getpid()}-{os.urandom(4).hex()}")
os.environ["MLDEBUG_TEST_SESSION"] = SESSION_MARK


# Test modules that are independent of each other and of everything else running: only
# tmp_path (or a private directory through the environment), no sshd cluster, no second
# user, no scan of every process on the machine; the rank processes they start are found by
# pid or by their own directory, and torchrun's --standalone picks a free port. `make test`
# runs them first with pytest-xdist on both cores, a module at a time per worker
# (-m parallel --dist loadfile: tests of one module may share a fixture or a registry), then
# the rest one at a time (-m "not parallel"): the sshd cluster, a second user, `--pattern`
# or whole-machine scans, and timings that two busy cores would blur.
PARALLEL_SAFE = frozenset({
    "test_findings", "test_fr_analyze", "test_fr_loader", "test_fr_real", "test_fr_cli",
    "test_hostile_parsers", "test_layers", "test_names", "test_logprefix", "test_render",
    "test_nccl_log_context", "test_nccl_log_known", "test_nccl_log_real", "test_nccl_log_scale",
    "test_nccl_log_input", "test_nccl_log_catalogue", "test_log_catalogue",
    "test_nccl_log_torch", "test_nccl_log_ifaces",
    "test_numerics_detector", "test_numerics_report", "test_numerics_llama", "test_numerics_cuda",
    "test_env_rules", "test_env_report", "test_env_contract", "test_env_ifname_diff_presets",
    "test_hang_analyze", "test_hang_faulthandler", "test_hang_jobs",
    "test_tiny_quirks", "test_tiny_tokenizer", "test_tiny_shrink", "test_tiny_dataset",
    "test_tiny_layers", "test_tiny_models", "test_tiny_hostile",
    "test_memory_snapshot", "test_memory_usage",
    "test_env_cli", "test_numerics_sentinel", "test_trace_unit", "test_fr_recorder", "test_fr_bench",
    # torchrun or rank-like processes, each found by pid or its own directory
    # (not test_log: its real jobs time out after 4 s on purpose, which two busy cores blur;
    # its one failure in the parallel part was the interleaved-traceback bug fixed in 05da444)
    "test_hang_gpu", "test_dist_test", "test_debugger_remote", "test_capture_unit",
    "test_cli", "test_docs_cmd", "test_json_envelope", "test_dist", "test_hang_early", "test_printing", "test_nccl_log",
    # jobs that mostly wait (collective timeouts, DDP steps) and reach their ranks only through
    # their own dump or session directory or by pid; benchmarks that assert no timing
    # (not test_numerics_sentinel_ddp: beside the parallel part its 4-rank job ended with
    # "terminate called without an active exception" after every case had passed, 3 times in
    # about 20 loaded runs, and once in the serial part - torch's teardown at exit, which the
    # recipe now skips with os._exit once its output is flushed)
    "test_fr_jobs", "test_fr_targeting", "test_numerics_ddp",
    "test_trace_jobs", "test_pdb", "test_debugger_ide", "test_debugger_list", "test_views",
    "test_install", "test_numerics_bench", "test_memory_bench", "test_bench_guard",
    # fixture-based analysis of the fault matrix's real dumps
    "test_fr_faults", "test_log_faults", "test_cli_typos", "test_ours", "test_why",
    # the docs' snippets: each Python block in its tmp_path on a free port, parse-only commands
    "test_doc_snippets",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the PARALLEL_SAFE modules' tests ``parallel``. With pytest-xdist (``-n 2 --dist
    loadgroup``) every cluster test runs in one worker: the sshd nodes of the session cluster
    (and the larger ones some tests start) use fixed names and 127.0.1.x addresses, which two
    workers would both claim."""
    here = Path(__file__).parent
    missing = sorted(m for m in PARALLEL_SAFE if not (here / f"{m}.py").exists())
    if missing:
        raise pytest.UsageError(f"conftest.PARALLEL_SAFE names no such test module: {missing}")
    for item in items:
        if item.path.stem in PARALLEL_SAFE:
            item.add_marker(pytest.mark.parallel)
        if item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.xdist_group("cluster"))


def _leaked() -> list[tuple[int, str]]:
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read(1 << 20)
            if f"MLDEBUG_TEST_SESSION={SESSION_MARK}".encode() not in env.split(b"\0"):
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read(512).rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != b"Z":
            found.append((int(entry), cmd))
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import signal
    import time

    if hasattr(session.config, "workerinput"):
        return
    time.sleep(0.5)  # children a last test killed are still exiting
    leaked = [(pid, cmd) for pid, cmd in _leaked() if "sshd" not in cmd and "slurm" not in cmd]
    if not leaked:
        return
    for pid, _ in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    lines = "\n".join(f"  pid {pid}: {cmd[:200]}" for pid, cmd in leaked[:20])
    sys.stderr.write(f"\nERROR: {len(leaked)} process(es) started by the tests were still "
                     f"running at the end (killed now); a test does not stop its job:\n"
                     f"{lines}\n")
    session.exitstatus = 1


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


def second_user(prefix: str) -> Iterator[int]:
    """A real second user (``useradd``, no home) for the module's tests, removed after them;
    skips where there is no root or no useradd. Use from a module-scoped fixture."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user (useradd)")
    name = f"{prefix}{os.getpid() % 100000}"
    r = subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", name],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"useradd is unavailable here: {r.stderr.strip()[:200]}")
    try:
        yield pwd.getpwnam(name).pw_uid
    finally:
        subprocess.run(["userdel", name], capture_output=True)
