"""The fault matrix's training job: a real gloo training loop that injects one named fault on
a chosen set of ranks (benchmarks/faults/catalogue.py lists them; docs/faults.md says what a
right verdict is for each).

    torchrun --standalone --nproc_per_node 4 benchmarks/faults/job.py \
        --fault skip_collective --culprits 2 --side DIR [--mode manual] [--timeout 15]

Every rank trains a small MLP: a batch (from a tensor, or a DataLoader where the fault needs
one), forward, backward, the gradient sync of its ``--mode`` (``manual``: one flat
all_reduce, a control broadcast from rank 0 and a logging all_reduce; ``ddp``; ``fsdp2``
``fully_shard``; ``subgroup``: gradients reduced in pairs made by ``new_group``, the loss in
the world; ``pipeline``: activations passed stage to stage by send/recv), optimizer step. At
step ``--fault-step`` the culprit ranks inject the fault; the others go on as usual.

Nothing the job prints names the fault or the culprit: the routes read what a user's job
would print. The runner's side channel is ``--side DIR``: ``ready-rank<R>`` (pid) once the
process group is up, ``injected-rank<R>`` when a culprit injects, ``step-rank<R>`` (the last
step begun), and ``fr/`` where ``mldebug.fr.enable`` dumps on failure.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import fcntl
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

FOREVER = 3600.0
# How long a culprit's fault lasts: for ever in a job of its own; in a pool of cases (--pool),
# long enough for every other rank to time out, then the fault lets go and the next case runs.
HOLD = FOREVER
POOLED = False


class CaseOver(Exception):
    """A pooled culprit's fault has let go: its case is over (the others timed out)."""


def later(fn: Any) -> None:
    """Run ``fn`` once HOLD has passed (what ends a blocking call in a pool)."""
    t = threading.Timer(HOLD, fn)
    t.daemon = True
    t.start()
ARGS: argparse.Namespace
RANK = -1
WORLD = 0
CULPRIT = False


def side(name: str, text: str) -> None:
    """Write one side-channel file for the runner (atomic: written, then renamed)."""
    d = Path(ARGS.side)
    tmp = d / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, d / name)


def injected() -> None:
    side(f"injected-rank{RANK}", f"{time.time():.3f}\n")


def hit(step: int) -> bool:
    return CULPRIT and step == ARGS.fault_step


def on(name: str, step: int) -> bool:
    return ARGS.fault == name and hit(step)


# --- the faults that live outside any collective ----------------------------------------

class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def hold_gil(seconds: float) -> None:
    """A C call that keeps the GIL (ctypes.PyDLL does not release it): a timed lock on a
    mutex this thread already holds."""
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    until = _Timespec(int(time.time() + seconds), 0)
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(until))


_held = threading.Lock()


def take_lock_held_by_thread() -> None:
    ready = threading.Event()

    def holder() -> None:
        _held.acquire()
        ready.set()
        time.sleep(HOLD)
        _held.release()

    threading.Thread(target=holder, name="cache-refresher", daemon=True).start()
    ready.wait()
    _held.acquire()  # the refresher thread never lets go


def flock_held_by_child() -> None:
    path = Path(ARGS.side) / f"ckpt-rank{RANK}.lock"
    path.touch()
    pid = os.fork()
    if pid == 0:  # the holder: another process that took the lock and hangs on to it
        fd = os.open(path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(os.open(path.with_suffix(".held"), os.O_WRONLY | os.O_CREAT, 0o600), b"1")
        time.sleep(HOLD)
        os._exit(0)
    while not path.with_suffix(".held").exists():
        time.sleep(0.01)
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.waitpid(pid, 0)
    os.close(fd)


def read_fifo() -> None:
    path = Path(ARGS.side) / f"control-rank{RANK}.fifo"
    os.mkfifo(path)
    later(lambda: os.close(os.open(path, os.O_WRONLY)))
    with open(path, "rb") as f:  # open blocks: nobody ever opens it for writing
        f.read()


def read_socket() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    later(cli.close)
    conn.recv(1)  # the peer never writes
    conn.close()
    srv.close()


def prompt() -> None:
    r, w = os.pipe()  # a terminal-like stdin that never answers (torchrun gives /dev/null)
    sys.stdin = os.fdopen(r)
    _keep.append(w)
    later(lambda: os.write(w, b"n\n"))
    input("Overwrite existing checkpoint? [y/N] ")


_keep: list[Any] = []


def queue_dead_producer(with_hook: bool) -> None:
    q: queue.Queue[torch.Tensor] = queue.Queue()

    def producer() -> None:
        shard = {"rows": 0}
        q.put(torch.ones(4))
        raise KeyError(f"shard index {shard['rows']} has no 'tokens' column")

    if with_hook:
        from mldebug import install_excepthook

        install_excepthook()
    threading.Thread(target=producer, name="prefetch", daemon=True).start()
    q.get(timeout=0.5)
    try:
        q.get(timeout=HOLD)  # the producer died: nothing more ever comes
    except queue.Empty:
        pass


def busy_python() -> int:
    n = 0
    deadline = time.monotonic() + HOLD
    while time.monotonic() < deadline:  # polls a flag nobody sets
        n += 1
    return n


def busy_forward(model: torch.nn.Module, x: torch.Tensor) -> None:
    deadline = time.monotonic() + HOLD
    with torch.no_grad():
        while time.monotonic() < deadline:  # a forward that never converges
            torch.tanh(model.net[0](torch.randn(64, 32)))  # type: ignore[index]


def evaluate(model: torch.nn.Module) -> float:
    """A long evaluation on one rank with no collective in it."""
    total = 0.0
    deadline = time.monotonic() + HOLD
    with torch.no_grad():
        while time.monotonic() < deadline:
            total += float(model(torch.randn(256, 32)).sum())
    return total


def save_checkpoint(model: torch.nn.Module) -> None:
    """A slow checkpoint write on one rank (storage that crawls)."""
    path = Path(ARGS.side) / f"ckpt-rank{RANK}.pt"
    deadline = time.monotonic() + HOLD
    with open(path, "wb") as f:
        while time.monotonic() < deadline:
            f.write(b"\0" * 4096)
            f.flush()
            time.sleep(0.05)


class Rows(Dataset):  # type: ignore[type-arg]
    def __init__(self, stuck: bool = False, crash: bool = False, first: int = 8) -> None:
        self.stuck, self.crash, self.first = stuck, crash, first  # the first bad record

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.stuck and i >= self.first:
            time.sleep(HOLD)  # a worker stuck: the shard's storage never answers
        if self.crash and i >= self.first:
            raise ValueError(f"corrupt record {i}: expected 32 features, got 31")
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g)


# --- the model and the modes --------------------------------------------------------------

class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def sync_manual(model: torch.nn.Module, step: int, loss: torch.Tensor) -> None:
    """One flat gradient all_reduce, a control broadcast from rank 0, a logging all_reduce;
    the desync faults change one of them on the culprits."""
    g = flat_grad(model)
    ctrl = torch.tensor([float(step)])
    f = ARGS.fault if hit(step) else ""
    if f:
        injected()
    if ARGS.fault == "network_stall" and step == ARGS.fault_step:
        if RANK == 0:
            injected()  # the runner takes the network down now
        time.sleep(1.0)
    if f == "reordered_collectives":
        dist.broadcast(ctrl, src=0)
        dist.all_reduce(g)
    elif f == "skip_collective":
        dist.broadcast(ctrl, src=0)
    else:
        if f == "extra_collective":
            dist.all_reduce(g.clone())
        if f == "other_op":
            dist.all_gather([torch.empty_like(g) for _ in range(WORLD)], g)
        elif f == "dtype_mismatch":
            dist.all_reduce(g.double())
        elif f == "shape_mismatch":
            dist.all_reduce(torch.cat([g, torch.zeros(5)]))
        else:
            dist.all_reduce(g)
        src = (RANK if RANK != 0 else 1) if f == "wrong_broadcast_src" else 0
        dist.broadcast(ctrl, src=src)
    dist.all_reduce(loss.detach().clone())


def make_pairs() -> list[Any]:
    """Every rank calls new_group for each pair, in the same order (as torch requires)."""
    pairs = [list(range(i, min(i + 2, WORLD))) for i in range(0, WORLD, 2)]
    groups = []
    for i, members in enumerate(pairs):
        if ARGS.fault == "pg_creation_order" and CULPRIT and i == 0 and len(pairs) > 1:
            injected()
            groups = [None] * len(pairs)
            groups[1] = dist.new_group(pairs[1])
            groups[0] = dist.new_group(pairs[0])
            break
        if ARGS.fault == "new_group_not_all" and CULPRIT and RANK in members:
            injected()
            groups.append(None)  # this rank skips its own pair's group: it syncs in the world
            continue
        groups.append(dist.new_group(members))
    return [(members, g) for members, g in zip(pairs, groups, strict=True)]


def sync_subgroup(model: torch.nn.Module, step: int, loss: torch.Tensor,
                  pairs: list[Any]) -> None:
    g = flat_grad(model)
    members, group = next((m, gr) for m, gr in pairs if RANK in m)
    if on("subgroup_skip", step):
        injected()
    else:
        dist.all_reduce(g, group=group)
    dist.all_reduce(loss.detach().clone())


def pipeline_step(model: torch.nn.Module, step: int, x: torch.Tensor) -> torch.Tensor:
    """Stage r receives its activation from r-1 and sends to r+1; the last stage's loss is
    all-reduced so every stage learns it."""
    h = torch.empty(64, 32)
    if RANK == 0:
        h = x
    else:
        dist.recv(h, src=RANK - 1)
    out = torch.tanh(model.net[0](h)[:, :32])  # type: ignore[index]
    if RANK < WORLD - 1:
        peer = RANK + 1
        if on("p2p_wrong_peer", step):
            injected()
            peer = RANK + 2 if RANK + 2 < WORLD else 0 if RANK != 0 else RANK + 1
            peer = peer if peer != RANK + 1 else (RANK + 2) % WORLD
        dist.send(out.detach().contiguous(), dst=peer)
    loss = out.pow(2).mean()
    dist.all_reduce(loss.detach().clone())
    return loss


# --- the loop -----------------------------------------------------------------------------

def outside(step: int, model: torch.nn.Module, x: torch.Tensor) -> None:
    """The faults a culprit meets before its step's collectives."""
    f = ARGS.fault
    if not hit(step) or f in ("skip_collective", "extra_collective", "reordered_collectives",
                              "other_op", "dtype_mismatch", "shape_mismatch",
                              "wrong_broadcast_src", "subgroup_skip", "p2p_wrong_peer"):
        return
    table = {
        "thread_lock": take_lock_held_by_thread,
        "flock": flock_held_by_child,
        "fifo_read": read_fifo,
        "socket_read": read_socket,
        "input_prompt": prompt,
        "queue_dead_producer": lambda: queue_dead_producer(False),
        "thread_exception_hook": lambda: queue_dead_producer(True),
        "gil_hold": lambda: hold_gil(HOLD),
        "busy_python": busy_python,
        "busy_forward": lambda: busy_forward(model, x),
        "long_eval": lambda: evaluate(model),
        "long_checkpoint": lambda: save_checkpoint(model),
        "sigkill": lambda: os.kill(os.getpid(), signal.SIGKILL),
        "sigsegv": lambda: ctypes.string_at(0),
        "sigstop": lambda: os.kill(os.getpid(), signal.SIGSTOP),
        "exit0": lambda: sys.exit(0),
        "exception": lambda: (_ for _ in ()).throw(
            RuntimeError(f"loss scaler state has no entry for step {step}")),
        "dist_store_error": lambda: None,
    }
    fn = table.get(f)
    if fn is not None:
        injected()
        if f == "exit0":
            print("early stopping: validation loss did not improve", flush=True)
        fn()
        if POOLED:
            raise CaseOver(f)


def batches(step0: int) -> Any:
    """The batch source: a DataLoader with a worker where the fault lives in one."""
    f = ARGS.fault
    if f in ("dataloader_stuck", "dataloader_crash", "healthy_dataloader"):
        stuck = CULPRIT and f == "dataloader_stuck"
        crash = CULPRIT and f == "dataloader_crash"
        # batch k holds records 4k..4k+3: the fault step's batch is the first bad one
        loader = DataLoader(Rows(stuck=stuck, crash=crash, first=4 * ARGS.fault_step),
                            batch_size=4, num_workers=1,
                            prefetch_factor=1)
        it = iter(loader)
        while True:
            yield next(it).repeat(16, 1)
    while True:
        yield torch.randn(64, 32)


def update(model: torch.nn.Module, opt: torch.optim.Optimizer | None) -> None:
    """The optimizer step: plain SGD by hand where the gradients are synced by hand (the
    torch.optim step imports torch._dynamo, 1.7 s of CPU per rank on every start)."""
    if opt is not None:
        opt.step()
        opt.zero_grad()
        return
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.01 * p.grad
                p.grad = None


def more(step: int, steps: int, deadline: float | None) -> bool:
    """Whether to run another step. A job that trains for a duration agrees on when to stop
    (one all_reduce of "my time is up", MAX): ranks that stopped a step apart would desync."""
    if deadline is None:
        return step < steps
    now = time.monotonic()
    done = step >= steps and now >= deadline
    if POOLED:  # observed while it trains: it ends once the runner has looked (or much later)
        done = done and ((Path(ARGS.side) / "looked").exists() or now >= deadline + 90)
    flag = torch.tensor([1.0 if done else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return not flag.item()


def train(model: torch.nn.Module, opt: torch.optim.Optimizer | None, train_model: torch.nn.Module,
          pairs: list[Any]) -> None:
    steps = ARGS.steps
    if ARGS.fault == "uneven_last_batch" and CULPRIT:
        steps = ARGS.fault_step  # this rank's shard has fewer batches
    deadline = time.monotonic() + ARGS.duration if ARGS.duration else None
    data = batches(0)
    step = 0
    while more(step, steps, deadline):
        side(f"step-rank{RANK}", f"{step}\n")
        if ARGS.fault in ("dataloader_stuck", "dataloader_crash") and hit(step):
            injected()
        x = next(data)
        if POOLED and ARGS.fault == "dataloader_stuck" and hit(step):
            raise CaseOver(ARGS.fault)
        outside(step, model, x)
        if ARGS.fault == "slow_straggler" and CULPRIT:
            time.sleep(ARGS.step_time * 1.5)  # a slower host: late every step, never stuck
        if ARGS.mode == "pipeline":
            pipeline_step(model, step, x)
            step += 1
            continue
        loss = train_model(x).pow(2).mean()
        if on("nan_branch", step):
            injected()
            loss = loss * float("nan")
        if torch.isnan(loss):  # a guard many training loops have: skip the bad batch
            print(f"step {step}: loss is nan, skipping batch", flush=True)
            step += 1
            continue
        loss.backward()
        if ARGS.mode == "manual":
            sync_manual(model, step, loss)
        elif ARGS.mode == "subgroup":
            sync_subgroup(model, step, loss, pairs)
        elif on("skip_backward_sync", step):
            injected()  # DDP/FSDP: this rank's backward never runs the gradient collectives
        update(model, opt)
        if ARGS.mode in ("ddp", "fsdp2"):
            dist.all_reduce(loss.detach().clone())
        time.sleep(ARGS.step_time)
        step += 1
    if ARGS.fault == "uneven_last_batch" and CULPRIT:
        injected()
    print(f"training done after {step} steps", flush=True)
    dist.barrier()


# --- stragglers (#44): slow, never stuck ------------------------------------------------

class SlowRows(Dataset):  # type: ignore[type-arg]
    """Records read from storage that answers in ``ms`` per batch of 4 (a sleep: I/O)."""

    def __init__(self, ms: float) -> None:
        self.s = ms / 4000

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.s)
        return torch.randn(32, generator=torch.Generator().manual_seed(i))


def _calibrate(model: torch.nn.Module, ms: float) -> int:
    """Forward+backward passes that take about ``ms`` on rank 0, the same count on every
    rank (a fixed amount of work: a culprit's slower compute is more of it)."""
    x = torch.randn(256, 32)
    n = torch.zeros(1)
    if RANK == 0:
        times = []
        for _ in range(7):
            t = time.perf_counter()
            model(x).pow(2).mean().backward()
            times.append(time.perf_counter() - t)
        n[0] = max(1, round(ms / 1000 / sorted(times)[3]))
    dist.broadcast(n, src=0)
    model.zero_grad()
    return int(n.item())


def train_stragglers(model: torch.nn.Module) -> None:
    """Every step: a batch from a DataLoader (``--phase-ms``), compute (forward+backward,
    about ``--phase-ms``), the gradients all_reduced in ``--collectives`` buckets, an SGD
    update; the step inside ``mldebug.step()``. The culprit's ``--slow-phase`` takes
    ``--slow-factor`` x ``--phase-ms`` longer: ``data`` (its storage), ``compute`` (more
    passes), ``comm`` (its first gradient all_reduce returns that much later: a delay inside
    its collective call, after gloo's transfer)."""
    import mldebug
    import mldebug.fr
    import mldebug.stepclock

    base = ARGS.phase_ms
    extra = ARGS.slow_factor if CULPRIT else 0.0
    slow = ARGS.slow_phase if CULPRIT else ""
    iters = _calibrate(model, base)
    if slow == "compute":
        iters = max(iters + 1, round(iters * (1 + extra)))
    loader = DataLoader(SlowRows(base * (1 + extra) if slow == "data" else base),
                        batch_size=4, num_workers=0)
    it = iter(loader)
    params = list(model.parameters())
    cuts = [params[:1], params[1:3], params[3:]] if ARGS.collectives == 3 else [params]
    side(f"ready-rank{RANK}", f"{os.getpid()}\n")
    if CULPRIT and slow:
        injected()
    for step in range(ARGS.steps):
        x = next(it).repeat(64, 1)
        with mldebug.step():
            for _ in range(iters):
                model(x).pow(2).mean().backward()
            for k, bucket in enumerate(cuts):
                g = torch.cat([p.grad.reshape(-1) for p in bucket if p.grad is not None])
                dist.all_reduce(g)
                if k == 0 and slow == "comm":
                    time.sleep(extra * base / 1000)
            update(model, None)
        if step % 10 == 0:
            side(f"step-rank{RANK}", f"{step}\n")
    mldebug.fr.dump("end of training")
    mldebug.stepclock.flush()
    print(f"training done after {ARGS.steps} steps", flush=True)
    dist.barrier()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fault", default="healthy")
    p.add_argument("--culprits", default="", help="comma-separated ranks that inject the fault")
    p.add_argument("--side", default="", help="the runner's side-channel directory")
    p.add_argument("--mode", default="manual",
                   choices=["manual", "ddp", "fsdp2", "subgroup", "pipeline"])
    p.add_argument("--timeout", type=float, default=15.0, help="collective timeout, seconds")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--duration", type=float, default=0.0,
                   help="train at least this long (healthy jobs the live routes watch)")
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--no-fr", action="store_true", help="do not enable the flight recorder")
    p.add_argument("--trace", action="store_true",
                   help="record each rank's execution ring (mldebug.trace.enable)")
    p.add_argument("--slow-phase", default="", choices=["", "data", "compute", "comm"],
                   help="stragglers: the culprit's slower phase")
    p.add_argument("--slow-factor", type=float, default=0.0,
                   help="stragglers: the culprit's phase takes this x --phase-ms longer")
    p.add_argument("--phase-ms", type=float, default=30.0,
                   help="stragglers: data and compute time per step")
    p.add_argument("--collectives", type=int, default=1, choices=[1, 3],
                   help="stragglers: gradient all_reduces per step")
    p.add_argument("--pool", help="a JSON list of cases ({fault, culprits, mode, side}) to run "
                   "one after another in these ranks")
    p.add_argument("--hold-margin", type=float, default=4.0,
                   help="pooled: a fault lets go this long after the collective timeout")
    return p.parse_args(argv)


def main() -> None:
    global ARGS, RANK
    ARGS = parse()
    RANK = int(os.environ.get("RANK", "0"))
    if ARGS.pool:
        pool()
        return
    set_case(ARGS.fault, ARGS.culprits, ARGS.mode, ARGS.side)
    side(f"started-rank{RANK}", f"{os.getpid()}\n")
    if not ARGS.no_fr:
        import mldebug.fr

        mldebug.fr.enable(dump_dir=str(Path(ARGS.side) / "fr"))
    if ARGS.trace:
        import mldebug.trace

        mldebug.trace.enable(events="calls", ring=2048, dir=str(Path(ARGS.side) / "trace"))
        mldebug.install_dump_handler(dir=str(Path(ARGS.side) / "capture"))  # rings on request
    kwargs: dict[str, Any] = {}
    if ARGS.fault == "world_size_hardcoded":
        kwargs = {"world_size": 2 * int(os.environ["WORLD_SIZE"]), "rank": RANK}
    if ARGS.fault == "master_port_mismatch" and CULPRIT:
        injected()
        os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=ARGS.timeout), **kwargs)
    one_case()
    dist.destroy_process_group()


def set_case(fault: str, culprits: str, mode: str, side_dir: str) -> None:
    global CULPRIT
    ARGS.fault, ARGS.mode, ARGS.side = fault, mode, side_dir
    CULPRIT = RANK in {int(r) for r in culprits.split(",") if r}


def one_case() -> None:
    """One case on the current default process group: model, mode, the training loop."""
    global WORLD
    WORLD = dist.get_world_size()
    timeout = datetime.timedelta(seconds=ARGS.timeout)
    torch.manual_seed(1234 + RANK)
    if ARGS.fault == "dist_store_error":
        store = dist.distributed_c10d._get_default_store()
        if CULPRIT:
            injected()  # this rank never publishes its shard manifest
        else:
            store.set(f"manifest/{RANK}", "ok")
        store.wait([f"manifest/{r}" for r in range(WORLD)], timeout)
    pairs = make_pairs() if ARGS.mode == "subgroup" else []
    model = MLP()
    if ARGS.fault == "straggler":
        train_stragglers(model)
        return
    train_model: torch.nn.Module = model
    if ARGS.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model)
    elif ARGS.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (WORLD,))
        for layer in model.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if ARGS.mode in ("ddp", "fsdp2") else None
    side(f"ready-rank{RANK}", f"{os.getpid()}\n")
    if ARGS.mode in ("ddp", "fsdp2") and ARGS.fault == "skip_backward_sync":
        _ddp_skip(train_model, model, opt)
        return
    train(model, opt, train_model, pairs)


def pool() -> None:
    """Several cases one after another in the same ranks (the quick subset: torch is imported
    once, not once per case). Each case gets a fresh default process group on a prefix of
    torchrun's store; a rank whose collective times out prints its traceback as an uncaught
    one would; a culprit whose fault let go ends its case quietly; every rank then waits for
    the others before the next case."""
    global HOLD, POOLED
    import json

    POOLED = True
    HOLD = ARGS.timeout + ARGS.hold_margin
    cases = json.loads(Path(ARGS.pool).read_text())
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=datetime.timedelta(seconds=600))
    world = int(os.environ["WORLD_SIZE"])
    for i, c in enumerate(cases):
        # the runner says when it has read the case before (its part of the output ends
        # there): a case's start-up lines must not land in the part of the one before
        gate = Path(c["side"]) / "go"
        while not gate.exists():
            time.sleep(0.05)
        set_case(c["fault"], c["culprits"], c["mode"], c["side"])
        ARGS.duration = float(c.get("duration", 0.0))
        side(f"started-rank{RANK}", f"{os.getpid()}\n")
        dist.init_process_group("gloo", store=dist.PrefixStore(f"case{i}", base), rank=RANK,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=ARGS.timeout))
        # what a training script prints as it starts (each case is a job's whole log)
        from mldebug.printing import rank_print

        rank_print(f"training: world_size={world}")
        try:
            one_case()
        except CaseOver:
            pass
        except Exception:
            # as torch prints an uncaught exception in a rank: every line behind [rankN]:
            text = "".join(traceback.format_exc().splitlines(keepends=True))
            sys.stderr.write("".join(f"[rank{RANK}]: {ln}" for ln in text.splitlines(True)))
            sys.stderr.flush()
        ctl = dist.PrefixStore(f"case{i}/end", base)
        ctl.set(str(RANK), "1")
        ctl.wait([str(r) for r in range(world)], datetime.timedelta(seconds=HOLD + 120))
        dist.destroy_process_group()
        side(f"done-rank{RANK}", f"{time.time():.3f}\n")  # after its last line


def _ddp_skip(train_model: torch.nn.Module, model: torch.nn.Module,
              opt: torch.optim.Optimizer | None) -> None:
    """DDP / FSDP2: at the fault step the culprit computes its loss without the wrapped model
    (a branch that calls the inner module), so its backward runs no gradient collective."""
    for step in range(ARGS.steps):
        side(f"step-rank{RANK}", f"{step}\n")
        x = torch.randn(64, 32)
        if hit(step):
            injected()
            with torch.no_grad():
                model(x)
            dist.all_reduce(torch.zeros(1))
            time.sleep(ARGS.step_time)
            continue
        loss = train_model(x).pow(2).mean()
        loss.backward()
        update(model, opt)
        dist.all_reduce(loss.detach().clone())
        time.sleep(ARGS.step_time)
    dist.barrier()


if __name__ == "__main__":
    main()
