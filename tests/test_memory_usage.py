"""see_memory_usage, the NVML device mapping (with a stand-in NVML module), memory.record."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from mldebug.errors import MldebugError
from mldebug.memory import nvml
from mldebug.memory.recorder import rank_path
from mldebug.memory.usage import MemoryUsage

GiB = 1024**3


class _Err(Exception):
    pass


class FakeNVML:
    """Just the NVML calls resolve() makes, over a node described as data.

    gpus: PCI-ordered list of (uuid, bus id, used bytes, [(mig uuid, gi, ci, used), ...]).
    """

    def __init__(self, gpus):
        self.gpus = gpus

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if i >= len(self.gpus):
            raise _Err("invalid index")
        return ("gpu", i)

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return ("gpu", [g[1] for g in self.gpus].index(bus))

    def nvmlDeviceGetUUID(self, h):
        return (self.gpus[h[1]][0] if h[0] == "gpu" else self.gpus[h[1]][3][h[2]][0]).encode()

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        if not self.gpus[h[1]][3]:
            raise _Err("not supported")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, k):
        if k >= len(self.gpus[h[1]][3]):
            raise _Err("not found")
        return ("mig", h[1], k)

    def nvmlDeviceGetGpuInstanceId(self, m):
        return self.gpus[m[1]][3][m[2]][1]

    def nvmlDeviceGetComputeInstanceId(self, m):
        return self.gpus[m[1]][3][m[2]][2]

    def nvmlDeviceGetMemoryInfo(self, h):
        used = self.gpus[h[1]][2] if h[0] == "gpu" else self.gpus[h[1]][3][h[2]][3]
        return type("Mem", (), {"used": used})()


NODE = FakeNVML([
    ("GPU-aaaa1111-0000-0000-0000-000000000000", "00000000:07:00.0", 1 * GiB, []),
    ("GPU-bbbb2222-0000-0000-0000-000000000000", "00000000:0F:00.0", 2 * GiB, []),
    ("GPU-cccc3333-0000-0000-0000-000000000000", "00000000:47:00.0", 3 * GiB,
     [("MIG-dddd4444-0000-0000-0000-000000000000", 1, 0, 5 * 2**20),
      ("MIG-eeee5555-0000-0000-0000-000000000000", 2, 0, 7 * 2**20)]),
])


@pytest.mark.parametrize("env,index,used,how", [
    ({}, 1, 2 * GiB, "NVML index 1"),
    ({"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, 1, 1 * GiB, "index 0"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-cccc3333,GPU-aaaa1111"}, 0, 3 * GiB, "UUID GPU-cccc3333"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-bbbb2222-0000-0000-0000-000000000000"}, 0, 2 * GiB, "UUID"),
    ({"CUDA_VISIBLE_DEVICES": "MIG-eeee5555-0000-0000-0000-000000000000"}, 0, 7 * 2**20, "MIG"),
    ({"CUDA_VISIBLE_DEVICES": "MIG-GPU-cccc3333-0000-0000-0000-000000000000/1/0"}, 0,
     5 * 2**20, "MIG"),
])
def test_nvml_device_for_every_cuda_visible_devices_form(env, index, used, how):
    handle, found = nvml.resolve(NODE, index, env)
    assert NODE.nvmlDeviceGetMemoryInfo(handle).used == used
    assert how in found


def test_nvml_index_without_pci_order_is_flagged_and_torch_ids_win():
    _, how = nvml.resolve(NODE, 0, {"CUDA_VISIBLE_DEVICES": "1"})
    assert "assumes CUDA_DEVICE_ORDER=PCI_BUS_ID" in how
    # CUDA's fastest-first order put bus 47 first: torch's UUID / bus id say which one it is
    h, _ = nvml.resolve(NODE, 0, {}, uuid="cccc3333-0000-0000-0000-000000000000")
    assert NODE.nvmlDeviceGetMemoryInfo(h).used == 3 * GiB
    h, _ = nvml.resolve(NODE, 0, {}, pci_bus_id="00000000:0F:00.0")
    assert NODE.nvmlDeviceGetMemoryInfo(h).used == 2 * GiB
    # a MIG entry stays a MIG instance even when torch knows the parent's bus id
    h, _ = nvml.resolve(NODE, 0, {"CUDA_VISIBLE_DEVICES": "MIG-dddd4444"}, pci_bus_id="x")
    assert NODE.nvmlDeviceGetMemoryInfo(h).used == 5 * 2**20
    assert nvml.used_bytes(0, {"CUDA_VISIBLE_DEVICES": "GPU-ffff"}, nvml=NODE) is None
    with pytest.raises(LookupError):
        nvml.visible_entry({"CUDA_VISIBLE_DEVICES": "0"}, 1)


def test_line_format_and_deltas():
    a = MemoryUsage("before", "n1", 0, proc_rss=int(0.5 * GiB), node_used=84 * GiB,
                    node_total=2000 * GiB)
    b = MemoryUsage("after", "n1", 0, ma=int(3.73 * GiB), max_ma=int(7.45 * GiB), ca=0,
                    max_ca=0, nv=None, proc_rss=int(0.7 * GiB), node_used=84 * GiB,
                    node_total=2000 * GiB)
    assert a.line() == "before: CPU proc 0.50 GiB / node 84.00 GiB (4.2%)"
    line = b.line(a)
    assert line.startswith("after: MA 3.73 GiB | Max_MA 7.45 GiB | CA 0.00 GiB")
    assert "CPU proc 0.70 GiB (+0.20)" in line and "NV" not in line


SCRIPT = r"""
import mldebug, sys
u = mldebug.see_memory_usage("start", ranks="all")
b = bytearray(200 * 2**20); b[::4096] = b"\x01" * len(range(0, len(b), 4096))
v = mldebug.see_memory_usage("after 200MiB", ranks=(1,))
w = mldebug.see_memory_usage("rank 0 only")
assert mldebug.see_memory_usage("off", force=False) is None
print("DELTA", v.proc_rss - u.proc_rss, "torch" in sys.modules)
"""


def test_see_memory_usage_prints_per_rank_and_returns_numbers():
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("[") and ":1] start: CPU proc " in lines[0]
    assert ":1] after 200MiB: CPU proc " in lines[1] and "(+0.2" in lines[1]
    assert not any("rank 0 only" in x for x in lines)  # this is rank 1
    delta, imported = lines[-1].split()[1:]
    assert 190 * 2**20 <= int(delta) <= 260 * 2**20
    assert imported == "False"  # see_memory_usage never imports torch itself


def test_record_per_rank_names_and_clear_error_without_cuda():
    assert str(rank_path("mem-{host}-{rank}.pickle", "n3", 7, 99)) == "mem-n3-7.pickle"
    assert str(rank_path("/d/mem.pickle", "n3", 7, 99)) == "/d/mem-n3-7.pickle"
    assert str(rank_path("/d/mem.pickle", "n3", None, 99)) == "/d/mem-n3-pid99.pickle"
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the error path is for CPU-only machines")
    import mldebug.memory

    with pytest.raises(MldebugError, match="CUDA is not available") as e:
        with mldebug.memory.record("x.pickle"):
            pass
    assert "see_memory_usage" in e.value.fix
    assert not os.path.exists("x.pickle")


def test_recipe_leak_shows_proc_rss_climbing_every_step():
    r = subprocess.run([sys.executable, str(REPO / "recipes" / "memory_leak.py"), "--steps", "5"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    procs = [float(line.split("CPU proc ")[1].split()[0]) for line in r.stdout.splitlines()
             if "after step" in line]
    assert len(procs) == 5
    # 2 layers x a 16384x256 fp32 activation kept per step = 32 MiB; noise is allowed
    assert procs[-1] - procs[0] >= 0.07, procs
    assert sum(b > a for a, b in zip(procs, procs[1:], strict=False)) >= 3, procs


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs CUDA")
def test_see_memory_usage_on_cuda_has_gpu_columns():
    import torch

    import mldebug

    t = torch.zeros(256, 1024, 1024, device="cuda")  # 1 GiB
    u = mldebug.see_memory_usage("gpu", ranks="all")
    assert u is not None and u.ma is not None and u.ma >= GiB
    del t
    v = mldebug.see_memory_usage("freed", ranks="all")
    assert v is not None and v.ma is not None and v.ma < GiB and v.max_ma is not None
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return
    assert v.nv is not None and v.nv >= v.ca  # NV includes the cache and the context
