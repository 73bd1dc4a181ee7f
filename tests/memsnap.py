"""Realistic PyTorch memory snapshots for tests, following ``torch.cuda.memory._snapshot``'s
documented schema exactly (segments with blocks; device_traces of alloc / free_requested /
free_completed / segment_alloc / segment_free / oom / snapshot entries with frames).

A small caching-allocator model places every allocation in a segment (bump pointer, reset when
the segment empties; a new 20 MiB-or-larger segment when nothing fits), so a leaked block pins
its segment the way it does on a GPU. Frames are innermost first - C++ allocator frames, then
torch's Python frames, then the user's - and shared between events like torch's symbolizer
shares them.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1024**2
SEG = 20 * MiB
CPP = [{"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
        "filename": "/opt/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1207},
       {"name": "at::empty_cuda", "filename": "/opt/pytorch/aten/src/ATen/cuda/EmptyTensor.cpp",
        "line": 27}]
TORCH_LINEAR = {"name": "forward", "line": 125,
                "filename": "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py"}
TORCH_AUTOGRAD = {"name": "backward", "line": 353,
                  "filename": "/usr/lib/python3.11/site-packages/torch/autograd/__init__.py"}
TRAIN = {"name": "train", "filename": "/workspace/train.py", "line": 88}


def _site(name: str, line: int, *torch_frames: dict[str, Any]) -> list[dict[str, Any]]:
    user = {"name": name, "filename": "/workspace/model.py", "line": line}
    return [*CPP, *torch_frames, user, TRAIN]


WEIGHT = _site("__init__", 20)
ACT = _site("forward", 40, TORCH_LINEAR)
TMP = _site("forward", 42)
LEAK = _site("forward", 45)  # the TiledMLP story: a reference kept every forward
GRAD = [*CPP, TORCH_AUTOGRAD, {"name": "train", "filename": "/workspace/train.py", "line": 91}]
PIN = _site("prefetch", 60)
BIG = _site("forward", 50, TORCH_LINEAR)


@dataclass
class _Seg:
    address: int
    total: int
    bump: int = 0
    live: dict[int, tuple[int, list[dict[str, Any]]]] = field(default_factory=dict)  # off -> ..


class Allocator:
    """Just enough of the caching allocator to emit a consistent trace and final state."""

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self.segs: list[_Seg] = []
        self.where: dict[int, _Seg] = {}
        self.trace: list[dict[str, Any]] = []
        self.next_addr = 0x7F0000000000
        self.t = 1_700_000_000_000_000
        self.recording = True

    def _ev(self, action: str, addr: int, size: int, frames: list[dict[str, Any]],
            **extra: Any) -> None:
        self.t += 37
        if self.recording:
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                               "time_us": self.t, "frames": list(frames), **extra})

    def alloc(self, size: int, frames: list[dict[str, Any]]) -> int:
        size = (size + 511) // 512 * 512
        seg = next((s for s in self.segs if s.bump + size <= s.total), None)
        if seg is None:
            total = max(SEG, (size + 2 * MiB - 1) // (2 * MiB) * 2 * MiB)
            seg = _Seg(self.next_addr, total)
            self.next_addr += total + 64 * MiB
            self.segs.append(seg)
            self._ev("segment_alloc", seg.address, total, frames)
        addr = seg.address + seg.bump
        seg.live[seg.bump] = (size, frames)
        seg.bump += size
        self.where[addr] = seg
        self._ev("alloc", addr, size, frames)
        return addr

    def free(self, addr: int) -> None:
        seg = self.where.pop(addr)
        size, frames = seg.live.pop(addr - seg.address)
        self._ev("free_requested", addr, size, frames)
        self._ev("free_completed", addr, size, frames)
        if not seg.live:
            seg.bump = 0

    def oom(self, size: int, frames: list[dict[str, Any]], device_free: int) -> None:
        self.t += 37
        self.trace.append({"action": "oom", "addr": 0, "size": size, "stream": 0,
                           "time_us": self.t, "device_free": device_free, "frames": list(frames)})

    def snapshot(self) -> dict[str, Any]:
        segments = []
        for s in self.segs:
            blocks = []
            off = 0
            allocated = 0
            for boff in sorted(s.live):
                size, frames = s.live[boff]
                if boff > off:
                    blocks.append({"address": s.address + off, "size": boff - off,
                                   "requested_size": 0, "state": "inactive", "frames": []})
                blocks.append({"address": s.address + boff, "size": size, "requested_size": size,
                               "state": "active_allocated", "frames": list(frames)})
                allocated += size
                off = boff + size
            if off < s.total:
                blocks.append({"address": s.address + off, "size": s.total - off,
                               "requested_size": 0, "state": "inactive", "frames": []})
            segments.append({"device": self.device, "address": s.address, "total_size": s.total,
                             "allocated_size": allocated, "active_size": allocated,
                             "requested_size": allocated, "stream": 0,
                             "segment_type": "large", "segment_pool_id": (0, 0),
                             "is_expandable": False, "frames": [], "blocks": blocks})
        self.t += 37
        self.trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0,
                           "time_us": self.t, "frames": []})
        return {"segments": segments, "device_traces": [self.trace],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "",
                                       "expandable_segments": False}}


def training(*, layers: int = 4, steps: int = 3, leak: bool = True, fragment: bool = False,
             oom: bool = False, act: int = 8 * MiB, leak_size: int = 2 * MiB,
             record_init: bool = False) -> dict[str, Any]:
    """A forward/backward loop over ``layers`` for ``steps`` (weights allocated before the
    trace unless ``record_init``), optionally leaking one tensor per layer forward,
    fragmenting the cache with pinned blocks, and ending in an OOM."""
    a = Allocator()
    a.recording = record_init
    for _ in range(layers):
        a.alloc(16 * MiB, WEIGHT)
    a.recording = True
    for _ in range(steps):
        acts = []
        for _ in range(layers):
            acts.append(a.alloc(act, ACT))
            a.free(a.alloc(act // 2, TMP))
            if leak:
                a.alloc(leak_size, LEAK)
        for x in reversed(acts):
            g = a.alloc(act, GRAD)
            a.free(x)
            a.free(g)
    if fragment:
        # a small pinned buffer lands in each fresh segment after a large temporary
        for _ in range(6):
            big = a.alloc(SEG - MiB, BIG)
            a.alloc(MiB, PIN)
            a.free(big)
            a.segs[-1].bump = a.segs[-1].total  # the freed head cannot host the next big one
    if oom:
        a.oom(40 * 1024 * MiB, BIG, device_free=300 * MiB)
    return a.snapshot()


def many_events(n: int) -> dict[str, Any]:
    """A trace of about ``n`` events (the benchmark's): 10 events per layer and step."""
    layers = 50
    return training(layers=layers, steps=max(1, n // (10 * layers)), leak=True,
                    act=MiB, leak_size=4096)


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_bytes(pickle.dumps(doc, protocol=4))
    return path


def main() -> None:
    """python tests/memsnap.py OUT.pickle [--steps N] [--oom] [--fragment] [--no-leak]"""
    import argparse

    ap = argparse.ArgumentParser(description="write a generated memory snapshot")
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--oom", action="store_true")
    ap.add_argument("--fragment", action="store_true")
    ap.add_argument("--no-leak", action="store_true")
    a = ap.parse_args()
    write(a.out, training(layers=a.layers, steps=a.steps, leak=not a.no_leak, oom=a.oom,
                          fragment=a.fragment))


if __name__ == "__main__":
    main()
