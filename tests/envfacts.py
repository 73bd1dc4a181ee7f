"""Synthetic node facts for the env rule tests (the shape node.py prints)."""

from __future__ import annotations

import copy
from typing import Any

from mldebug.env.facts import NodeFacts

BASE: dict[str, Any] = {
    "schema": 1,
    "host": "node1",
    "os": {"name": "Ubuntu 22.04.4 LTS", "kernel": "5.15.0-105-generic", "cpus": 96,
           "machine": "x86_64", "container": False, "glibc": "glibc 2.35",
           "cpu_model": "Intel(R) Xeon(R) Platinum 8480+"},
    "packages": {"torch": "2.9.1+cu128", "numpy": "2.1.3", "transformers": "4.57.1"},
    "topology": "        GPU0    GPU1\nGPU0     X      NV18\nGPU1    NV18     X\n",
    "python": {"version": "3.11.9", "executable": "/opt/venv/bin/python"},
    "env": {},
    "interfaces": [
        {"name": "lo", "kind": "loopback", "up": True, "running": True,
         "addresses": ["127.0.0.1"]},
        {"name": "eth0", "kind": "ethernet", "up": True, "running": True,
         "addresses": ["10.0.0.11"]},
        {"name": "docker0", "kind": "docker", "up": True, "running": True,
         "addresses": ["172.17.0.1"]},
    ],
    "ib_devices": [],
    "limits": {"shm_bytes": 64 << 30, "memlock_soft": None, "core_soft": None,
               "cgroup_memory_bytes": None},
    "ptrace": {"yama_ptrace_scope": 0, "cap_sys_ptrace": False, "uid": 1000},
    "core": {"pattern": "core", "pipe_handler": None},
    "py_spy": {"path": "/opt/venv/bin/py-spy", "version": "0.4.0", "runs": True},
    "gpus": {"source": "nvml", "driver": "550.54.15",
             "devices": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)],
             "p2p": [["X" if i == j else "OK" for j in range(8)] for i in range(8)]},
    "master_addr": None,
    "ports": [],
    "torch": {"status": "ok", "installed": True, "version": "2.9.1+cu128", "cuda": "12.8",
              "hip": None, "nccl": "2.27.5", "cuda_build": True},
}


def ib(*names: str, state: str = "ACTIVE") -> list[dict[str, Any]]:
    return [{"name": n, "ports": [{"port": 1, "state": state, "link_layer": "InfiniBand"}]}
            for n in names]


def make(env: dict[str, str] | None = None, host: str = "node1", **over: Any) -> NodeFacts:
    """NodeFacts from BASE with ``env`` and top-level keys replaced (dicts are merged)."""
    d = copy.deepcopy(BASE)
    d["host"] = host
    d["env"] = dict(env or {})
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return NodeFacts.from_dict(d)
