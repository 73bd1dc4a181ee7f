"""Step time with NanSentinel on against off, side by side in one 2-rank DDP job.

    .venv/bin/python benchmarks/bench_sentinel.py [--rounds 9] [--steps 20] [--cuda]
        [--workloads mlp,llama]

Re-runs itself under ``torchrun --standalone --nproc_per_node 2`` (gloo on CPU, NCCL with
``--cuda``, one GPU per rank). Per workload, two DDP copies of the same model are trained
interleaved, round after round (the order rotates): ``off`` (plain DDP, the builtin C++
all-reduce), ``on`` (the same with ``NanSentinel(fingerprint=False)``: comm hook checking each
bucket before the all-reduce and folding the flag into it, loss check, one read of the flags
per step; replica check off) and ``fp`` (``NanSentinel`` with its default collective
fingerprint: every collective of the step hashed, one 16-byte all-reduce per step).
A step is forward + backward + optimizer step + zero_grad. Prints rank 0's median and minimum
step time over rounds and the ratios on/off (wall time, and the process's CPU time, which
other work on a shared machine disturbs less), then the replica-hash cost per call: the local
hash alone (``param_hash``) and the whole ``check_replicas`` (hash + one small all-reduce).

Workloads: ``mlp`` (4 x Linear(256, 256) + ReLU, batch 64) and ``llama`` (a tiny Llama from
mldebug's make-tiny machinery, built from a config offline: 4 layers, hidden 64, vocab 128,
batch 4 x 64 tokens).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mlp(device: Any) -> tuple[Any, Callable[[Any], Any], Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(256, 1)).to(device)
    x = torch.randn(64, 256, device=device)
    y = torch.randn(64, 1, device=device)
    return model, lambda m: (m(x) - y).pow(2).mean(), (x, y)


def llama(device: Any) -> tuple[Any, Callable[[Any], Any], Any]:
    import torch

    from mldebug.tiny.build import from_config, make_config, offline, pick_auto_class

    offline()
    cfg = make_config({"model_type": "llama", "vocab_size": 128, "hidden_size": 64,
                       "intermediate_size": 128, "num_hidden_layers": 4,
                       "num_attention_heads": 4, "num_key_value_heads": 2,
                       "max_position_embeddings": 128})
    torch.manual_seed(0)
    _, auto = pick_auto_class("llama", ["LlamaForCausalLM"])
    model = from_config(auto, cfg).to(device)
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(0)).to(device)
    batch = {"input_ids": ids, "labels": ids, "use_cache": False}
    return model, lambda m: m(**batch).loss, batch


WORKLOADS = {"mlp": mlp, "llama": llama}


def bench_one(name: str, device: Any, args: argparse.Namespace, out_dir: str, rank: int,
              sync: Callable[[], None]) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from mldebug.numerics.sentinel import NanSentinel

    model_off, loss_off, _ = WORKLOADS[name](device)
    model_on, loss_on, batch = WORKLOADS[name](device)
    model_fp, loss_fp, _ = WORKLOADS[name](device)
    ddp_off = DDP(model_off)
    ddp_on = DDP(model_on)
    ddp_fp = DDP(model_fp)
    opt_off = torch.optim.SGD(ddp_off.parameters(), lr=1e-4)
    opt_on = torch.optim.SGD(ddp_on.parameters(), lr=1e-4)
    opt_fp = torch.optim.SGD(ddp_fp.parameters(), lr=1e-4)
    sentinel = NanSentinel(ddp_on, opt_on, dir=os.path.join(out_dir, name),
                           loss_fn=lambda m, b, f=loss_on: f(m), fingerprint=False)
    sentinel_fp = NanSentinel(ddp_fp, opt_fp, dir=os.path.join(out_dir, name + "-fp"),
                              loss_fn=lambda m, b, f=loss_fp: f(m))

    def step_off() -> None:
        loss_off(ddp_off).backward()
        opt_off.step()
        opt_off.zero_grad(set_to_none=True)

    def step_on() -> None:
        with sentinel.step(batch):
            loss_on(ddp_on).backward()
        opt_on.step()
        opt_on.zero_grad(set_to_none=True)

    def step_fp() -> None:
        with sentinel_fp.step(batch):
            loss_fp(ddp_fp).backward()
        opt_fp.step()
        opt_fp.zero_grad(set_to_none=True)

    labels = ("off", "on", "fp")
    times: dict[str, list[float]] = {k: [] for k in labels}
    cpu: dict[str, list[float]] = {k: [] for k in labels}
    for fn in (step_off, step_on, step_fp) * 2:  # warm-up (DDP rebuilds buckets)
        fn()
    fns = [("off", step_off), ("on", step_on), ("fp", step_fp)]
    for r in range(args.rounds):
        order = fns[r % 3:] + fns[:r % 3]
        if r % 2:
            order.reverse()
        for label, fn in order:
            dist.barrier()
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                fn()
            sync()
            times[label].append((time.perf_counter() - t0) / args.steps)
            cpu[label].append((time.process_time() - c0) / args.steps)
    # replica hash: the local hash, and the whole check (hash + all-reduce), per call
    hash_t, check_t = [], []
    for _ in range(args.rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            sentinel.param_hash()
        sync()
        hash_t.append((time.perf_counter() - t0) / args.steps)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            sentinel.check_replicas()
        check_t.append((time.perf_counter() - t0) / args.steps)
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        mn = {k: min(v) for k, v in times.items()}
        n_params = sum(p.numel() for p in model_on.parameters())
        print(f"{name:6} params={n_params:,} device={device.type} world={dist.get_world_size()} "
              f"rounds={args.rounds} steps={args.steps}")
        print(f"  step off  median {med['off'] * 1e3:8.3f} ms   min {mn['off'] * 1e3:8.3f} ms")
        print(f"  step on   median {med['on'] * 1e3:8.3f} ms   min {mn['on'] * 1e3:8.3f} ms")
        print(f"  step fp   median {med['fp'] * 1e3:8.3f} ms   min {mn['fp'] * 1e3:8.3f} ms")
        print(f"  ratio on/off: median {med['on'] / med['off']:.3f}x   "
              f"min {mn['on'] / mn['off']:.3f}x   (wall time)")
        print(f"  ratio fp/off: median {med['fp'] / med['off']:.3f}x   "
              f"min {mn['fp'] / mn['off']:.3f}x   (wall time; fp/on median "
              f"{med['fp'] / med['on']:.3f}x)")
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        cmn = {k: min(v) for k, v in cpu.items()}
        print(f"  process CPU time per step: off {cmed['off'] * 1e3:.3f} ms, on "
              f"{cmed['on'] * 1e3:.3f} ms, fp {cmed['fp'] * 1e3:.3f} ms; ratio on/off median "
              f"{cmed['on'] / cmed['off']:.3f}x min {cmn['on'] / cmn['off']:.3f}x; fp/off "
              f"median {cmed['fp'] / cmed['off']:.3f}x min {cmn['fp'] / cmn['off']:.3f}x")
        h, c = statistics.median(hash_t), statistics.median(check_t)
        print(f"  replica hash: local {h * 1e6:8.1f} us/call, check_replicas "
              f"{c * 1e6:8.1f} us/call ({c / med['off']:.2f} of a step)", flush=True)
    sentinel.detach()
    sentinel_fp.detach()
    dist.barrier()


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    if args.cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    sync = torch.cuda.synchronize if args.cuda else (lambda: None)
    out_dir = tempfile.mkdtemp(prefix="bench-sentinel-")
    for name in args.workloads.split(","):
        bench_one(name, device, args, out_dir, rank, sync)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cuda", action="store_true", help="NCCL, one GPU per rank")
    p.add_argument("--workloads", default="mlp,llama")
    p.add_argument("--nproc", type=int, default=2)
    args = p.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return 0
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(args.nproc), os.path.abspath(__file__), "--rounds", str(args.rounds), "--steps",
           str(args.steps), "--workloads", args.workloads] + (["--cuda"] if args.cuda else [])
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
