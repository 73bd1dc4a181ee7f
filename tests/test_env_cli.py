"""mldebug env end to end: the real CLI in a subprocess, crafted environments, real probes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO, run_cli

# Variables of the families mldebug reports, cleared so the host's own settings don't leak in.
FAMILIES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "TORCH_DISTRIBUTED_", "CUDA_", "PYTORCH_",
            "MASTER_", "WORLD_SIZE", "RANK", "LOCAL_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FAMILIES)}
    env.update(extra)
    return env


def env_json(*args: str, **extra: str) -> tuple[int, dict]:
    r = run_cli("env", "--json", *args, env=clean_env(**extra), timeout=60)
    assert r.stdout.strip(), r.stderr
    return r.returncode, json.loads(r.stdout)


def by_code(doc: dict) -> dict[str, dict]:
    return {f["code"]: f for f in doc["findings"]}


def real_interfaces() -> list[str]:
    return sorted(os.listdir("/sys/class/net"))


def test_socket_ifname_that_matches_nothing_names_the_real_interfaces():
    rc, doc = env_json(NCCL_SOCKET_IFNAME="eth9")
    f = by_code(doc)["nccl-socket-ifname-no-match"]
    assert rc == 1 and f["severity"] == "error"
    for name in real_interfaces():
        assert name in f["detail"]
    assert f["hosts"] == [socket.gethostname().split(".")[0]]


def test_deprecated_and_new_both_set_is_a_conflict():
    rc, doc = env_json(TORCH_NCCL_TRACE_BUFFER_SIZE="100", TORCH_FR_BUFFER_SIZE="2000")
    f = by_code(doc)["env-deprecated-conflict"]
    assert rc == 1 and "TORCH_FR_BUFFER_SIZE" in f["title"]


def test_clean_environment_exits_zero_and_reports_facts():
    rc, doc = env_json()
    assert rc == 0, [f for f in doc["findings"] if f["severity"] == "error"]
    node = doc["nodes"][0]
    # the JSON envelope (docs/json.md); the old integer schema stays one release
    assert doc["schema"] == "mldebug.env/2" and doc["legacy_schema"] == 1
    assert doc["differences"] == []
    assert node["python"]["version"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}")
    import torch  # the test process may import torch; mldebug env must not

    assert node["torch"]["status"] == "ok" and node["torch"]["version"] == torch.__version__
    assert {i["name"] for i in node["interfaces"]} == set(real_interfaces())
    assert node["limits"]["shm_bytes"] == os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize


def test_env_variables_are_reported_and_human_output_puts_findings_first():
    env = clean_env(NCCL_DEBUG="INFO", CUDA_LAUNCH_BLOCKING="1", NO_COLOR="1")
    r = run_cli("env", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.index("NCCL_DEBUG=INFO is a debugging setting") < out.index("Facts")
    assert "CUDA_LAUNCH_BLOCKING" in out[out.index("Facts"):]
    assert "\x1b[" not in out


def test_env_does_not_import_torch_in_process():
    code = textwrap.dedent("""
        import sys, io, contextlib
        from mldebug.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(["env", "--json"])
        print(rc, "torch" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(PYTHONPATH=str(REPO)), timeout=60, cwd=REPO)
    assert r.stdout.split() == ["0", "False"], r.stderr


def fake_torch(tmp_path: Path, init: str, version: str = "__version__ = '9.9.9'\n") -> str:
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(init)
    if version is not None:
        (pkg / "version.py").write_text(version)
    return str(tmp_path) + os.pathsep + str(REPO)


def test_broken_torch_install_is_a_finding_not_a_crash(tmp_path):
    path = fake_torch(tmp_path, "raise ImportError('libcudart.so.12: cannot open')\n",
                      version="__version__ = \n")  # truncated file
    rc, doc = env_json(PYTHONPATH=path)
    f = by_code(doc)["torch-broken"]
    assert rc == 1 and f["detail"].startswith("SyntaxError") and "version.py" in f["detail"]


def test_torch_that_fails_to_import_is_a_finding(tmp_path):
    path = fake_torch(tmp_path, "raise ImportError('libcudart.so.12: cannot open')\n")
    rc, doc = env_json("--torch-import", PYTHONPATH=path)
    assert rc == 1 and "libcudart.so.12" in by_code(doc)["torch-broken"]["detail"]


def test_slow_torch_import_times_out_into_a_finding(tmp_path):
    path = fake_torch(tmp_path, "import time\ntime.sleep(120)\n")
    import time

    start = time.monotonic()
    rc, doc = env_json("--torch-import", "--torch-timeout", "1", PYTHONPATH=path)
    elapsed = time.monotonic() - start
    f = by_code(doc)["torch-probe-timeout"]
    assert f["severity"] == "warning" and rc == 0
    assert f["title"] == "inspecting torch 9.9.9 did not finish within 1.0s"
    assert doc["nodes"][0]["torch"]["version"] == "9.9.9"  # read before the import hung
    assert elapsed < 30  # the probe was killed, not waited for


def test_torch_import_mode_reports_backends():
    rc, doc = env_json("--torch-import", "--torch-timeout", "60")
    t = doc["nodes"][0]["torch"]
    assert t["mode"] == "import" and t["backends"]["gloo"] is True
    assert t["cuda_available"] is False or t["device_count"] >= 1


def test_check_port_reachable_and_closed_and_master_addr():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        open_port = srv.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]  # bound, never listening: refused
            rc, doc = env_json("--check-port", f"127.0.0.1:{open_port}",
                               "--check-port", f"127.0.0.1:{closed_port}")
    ports = {p["target"]: p for p in doc["nodes"][0]["ports"]}
    assert ports[f"127.0.0.1:{open_port}"]["open"] is True
    assert ports[f"127.0.0.1:{closed_port}"]["open"] is False
    f = by_code(doc)["port-unreachable"]
    assert rc == 1 and f"127.0.0.1:{closed_port}" in f["title"]

    rc, doc = env_json("--check-port", MASTER_ADDR="no-such-host.invalid", MASTER_PORT="29500")
    found = by_code(doc)
    assert rc == 1 and "no-such-host.invalid" in found["master-addr-unresolvable"]["title"]


def test_bad_arguments_are_usage_errors():
    r = run_cli("env", "--check-port", "nocolon", env=clean_env())
    assert r.returncode == 2 and "HOST:PORT" in r.stderr
    r = run_cli("env", "--preset", "bogus", env=clean_env())
    assert r.returncode == 2


def test_preset_prints_exports():
    r = run_cli("env", "--preset", "nccl", env=clean_env())
    assert r.returncode == 0
    assert "export NCCL_DEBUG=INFO" in r.stdout and "# " in r.stdout


FAKE_NVML = '''
"""Stand-in for nvidia-ml-py (no GPU on the test machine): two L4s without P2P, as in the book."""
NVML_P2P_CAPS_INDEX_READ = 0
class _Mem:  total = 24 * 2**30
class _Pci:  busId = b"00000000:01:00.0"
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return b"NVIDIA L4"
def nvmlDeviceGetMemoryInfo(h): return _Mem()
def nvmlDeviceGetPciInfo(h): return _Pci()
def nvmlDeviceGetP2PStatus(a, b, cap): return 1  # NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
def nvmlSystemGetDriverVersion(): return "550.54.15"
def nvmlSystemGetCudaDriverVersion(): return 12040
'''


def test_gpu_facts_from_nvml_drive_the_gpu_checks(tmp_path):
    (tmp_path / "pynvml.py").write_text(FAKE_NVML)
    rc, doc = env_json(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}", LOCAL_WORLD_SIZE="4")
    gpus = doc["nodes"][0]["gpus"]
    assert [d["name"] for d in gpus["devices"]] == ["NVIDIA L4", "NVIDIA L4"]
    assert gpus["p2p"] == [["X", "CNS"], ["CNS", "X"]] and gpus["driver"] == "550.54.15"
    found = by_code(doc)
    assert "GPU0-GPU1: CNS" in found["gpu-p2p-unsupported"]["detail"]
    assert "LOCAL_WORLD_SIZE=4 but only 2 GPU(s)" in found["world-more-ranks-than-gpus"]["title"]
    cpu_torch = not doc["nodes"][0]["torch"].get("cuda") and not doc["nodes"][0]["torch"].get("hip")
    assert ("torch-cpu-build-on-gpu-node" in found) is cpu_torch
    assert rc == 1
