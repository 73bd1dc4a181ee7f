"""``NanSentinel``: an always-on inf/nan check of every training step that names the first rank,
step and module, and says whether the value reproduces.

Hot path (every step):

- DDP: a communication hook wraps the default all-reduce. Each bucket is checked locally
  *before* it is reduced (one ``sum`` into a 0-d fp32 tensor: any inf/nan makes it non-finite)
  and the verdict is folded into the bucket itself: its first element becomes NaN when the
  bucket is not finite (``+ 0`` or ``+ nan``, on the device). The all-reduce that runs anyway
  carries it: the reduced first element is NaN on every rank, so every rank learns of it in
  the same step by reading one element, without a collective of its own; the local check says
  which rank it was born on.
- A plain module (and micro-batches under ``no_sync``): one fused check of the local
  gradients after the block (``torch._foreach_norm(grads, inf)``).
- The loss (a 0-d model output, ``output.loss``, or ``watch_loss(loss)``) is checked on the
  device the same way.
- At the end of the block the flags are read once. On the CPU that costs nothing. On CUDA,
  ``sync="step"`` reads one byte that the block's work has already queued (the wait a loop's
  ``loss.item()`` makes anyway); ``sync="late"`` copies it without blocking and reads it at the
  start of the next step (no host sync of its own, but raise only: the optimizer has stepped).

On a trip (rare path): one small all-reduce tells every rank which ranks saw it before the
reduce; those ranks replay the step (:mod:`mldebug.numerics.replay`); one more small all-reduce
shares the replay results; every rank appends its record and takes the same action: raise
:class:`NonFiniteDetected` everywhere, or skip the optimizer step everywhere.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from mldebug.errors import MldebugError
from mldebug.numerics import collectives, records
from mldebug.numerics import fingerprint as _fingerprint
from mldebug.numerics.replay import (
    LossFn,
    _inner,
    call_target,
    find_ddp,
    loss_of,
    replay,
    rng_state,
    strip_compiled,
)

logger = logging.getLogger("mldebug.numerics")

Action = Literal["raise", "skip"]


class NonFiniteDetected(RuntimeError):
    """Raised on every rank when any rank's loss or gradients are not finite (action="raise").
    ``.record`` is this rank's record (rank, step, origins, replay result)."""

    def __init__(self, message: str, record: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.record = record or {}


class ReplicasDiverged(NonFiniteDetected):
    """Raised on every rank when the replica check finds data-parallel replicas whose
    parameters differ (a subclass: ``except NonFiniteDetected`` catches every sentinel trip)."""


class CollectivesDiffer(NonFiniteDetected):
    """Raised on every rank when the step's collective fingerprints differ across ranks: some
    rank made a different collective (op, reduce op, group, shape or dtype) than the others,
    which gloo may complete silently with wrong values. ``.record["differing"]`` names them."""


@dataclass
class _Micro:
    """What one ``step()`` block left behind: enough to tell and to replay."""

    index: int
    batch: Any
    rng: dict[str, Any]
    loss: torch.Tensor | None = None  # the loss (0-d, detached) when seen
    local: torch.Tensor | None = None  # max |grad| after this block (no_sync / plain module)
    pre: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (bucket, sum) pre-reduce
    buffers: list[torch.Tensor] = field(default_factory=list)  # buckets' first elements
    bad_params: dict[int, list[str]] = field(default_factory=dict)
    bad_names: list[str] | None = None  # local gradients not finite after this block (CPU)
    # the model's first call in the block as it was made, (args, kwargs) by reference: the
    # replay calls it the same way (a batch (x, y) of which the step passed only x)
    call: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    n_post: int = 0


def _comm_hook(state: NanSentinel, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: check the bucket locally (one pass), fold the verdict into
    the bucket's first element (NaN when the bucket is not finite), then the default all-reduce.

    The reduced first element is then NaN on every rank as soon as one rank's bucket was not
    finite: every rank learns it in the same step from the collective that runs anyway, by
    reading one element at the end of the block. (A finite bucket cannot overflow in the
    reduction: the default hook divides by the world size first, so partial sums stay within
    the largest local value.)"""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buf = bucket.buffer()
    micro = state._micro
    if micro is not None and buf.numel():
        s = buf.sum(dtype=torch.float32)
        idx = bucket.index()
        micro.pre.append((idx, s))
        if state._names_needed(idx):
            state._bucket_params[idx] = [state._name_of(p) for p in bucket.parameters()]
        if buf.device.type == "cpu":  # reading the flag is free on the CPU
            if not math.isfinite(float(s)):
                micro.bad_params[idx] = [state._name_of(p) for p, g in
                                         zip(bucket.parameters(), bucket.gradients(),
                                             strict=False)
                                         if not bool(torch.isfinite(g).all())][:32]
                buf[0] = math.nan
        else:  # on the device, no sync: + 0 when finite, + nan when not
            buf[:1].add_(s.mul(0))
        micro.buffers.append(buf[:1])  # a view: reduced in place with the bucket
        if state._fp is not None and state._ride is None and \
                buf.dtype in (torch.float32, torch.float64):
            return _ride(state, buf)
    return default_hooks.allreduce_hook(state._group, bucket)


def _ride(state: NanSentinel, buf: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """The step's first bucket carries the collective fingerprint: the bucket (divided by the
    world size, as the default hook does) and the hash's chunks [c..., c*c...] are all-reduced
    in one SUM; the future returns the bucket's part, which DDP copies into the gradients as
    it does the default hook's result (no extra pass). The hash covers the collectives
    made since the previous comparison: the step's forward, and the previous step's bucket
    all-reduces after its first (the ones that follow this one belong to the next)."""
    import torch.distributed as dist

    fp = state._fp
    assert fp is not None
    snap = (fp.value(), fp.count, fp.entries)
    fp.reset()
    n = buf.numel()
    world = state.world
    tail = torch.tensor(collectives.ride_encode(snap[0], world), dtype=buf.dtype)
    ext = torch.empty(n + tail.numel(), dtype=buf.dtype, device=buf.device)
    torch.div(buf, world, out=ext[:n])
    ext[n:].copy_(tail, non_blocking=True)
    state._ride = (ext[n:], snap)
    micro = state._micro
    if micro is not None and micro.buffers:
        micro.buffers[-1] = ext[:1]  # the reduced first element is read from here
    all_reduce = getattr(dist.all_reduce, "__mldebug_fingerprint__", dist.all_reduce)  # not ours
    fut = all_reduce(ext, group=state._group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0][:n])


# DDP compares the hook's annotations with the real classes; postponed ones are strings
_comm_hook.__annotations__ = {}


class NanSentinel:
    """Check the loss and the gradients of every step; on a trip name the first rank, step,
    module and phase, replay to tell data/model from hardware, and act the same on every rank.

    ::

        sentinel = NanSentinel(model, optimizer, dir="nan-records", action="raise")
        for batch in loader:
            with sentinel.step(batch):
                loss = model(batch)
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    - ``model``: a plain module or a ``DistributedDataParallel`` (construct the sentinel before
      the first backward: the DDP communication hook is registered here).
    - ``action``: "raise" (:class:`NonFiniteDetected` on every rank) or "skip" (the next
      ``optimizer.step()`` does nothing on every rank; needs ``optimizer``).
    - ``loss_fn(module, batch) -> loss`` is what the replay runs; default: ``module(batch)``
      (``**batch`` for a dict, ``*batch`` for a tuple) and its loss (0-d output or ``.loss``).
    - ``replica_check_every=N``: every N steps, at the start of a step, compare a hash of the
      parameters across the replicas (one small all-reduce); 0 turns it off.
    - ``scaler``: the ``GradScaler`` of an AMP loop: inf gradients with a finite loss are its
      business (counted in ``scaler_skips``, recorded as such, no action).
    - ``sync``: "step" (read the flags at the end of the block; needed for skip and replay) or
      "late" (CUDA: read them at the next step, no host sync of its own; raise only).
    - ``fingerprint``: hash each step's collectives (op, reduce op, group, shape, dtype) on
      every rank and compare the hashes (one 16-byte all-reduce per step); a difference names
      the first differing collective and its ranks (:class:`CollectivesDiffer`, or a skipped
      step). On when distributed with more than one rank and ``sync="step"``.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 dir: str | Path | None = None, action: Action = "raise", *,
                 loss_fn: LossFn | None = None, replay: bool = True,
                 replica_check_every: int = 0, scaler: Any = None,
                 sync: Literal["step", "late"] = "step", replay_on_peer: bool = False,
                 process_group: Any = None, print_report: bool = True,
                 fingerprint: bool = True) -> None:
        if action not in ("raise", "skip"):
            raise MldebugError(f"NanSentinel: action={action!r} is not one of 'raise', 'skip'.",
                               "Pass action='raise' (stop every rank) or action='skip' (skip "
                               "the optimizer step on every rank).")
        if action == "skip" and optimizer is None:
            raise MldebugError("NanSentinel: action='skip' needs the optimizer.",
                               "Pass NanSentinel(model, optimizer, action='skip').")
        if sync not in ("step", "late"):
            raise MldebugError(f"NanSentinel: sync={sync!r} is not one of 'step', 'late'.",
                               "Pass sync='step' (default) or sync='late' (CUDA, raise only).")
        if sync == "late" and action == "skip":
            raise MldebugError("NanSentinel: sync='late' reads the flag after the optimizer "
                               "has stepped, so it cannot skip that step.",
                               "Use sync='step' with action='skip', or action='raise'.")
        if replay_on_peer:
            raise MldebugError("NanSentinel: replay_on_peer=True is not implemented yet.",
                               "Leave it False: the replay runs on the rank where the value "
                               "was born.")
        if not isinstance(replica_check_every, int) or replica_check_every < 0:
            raise MldebugError("NanSentinel: replica_check_every must be an integer >= 0.",
                               "Pass e.g. replica_check_every=100, or 0 to turn it off.")
        self.model = model
        self.optimizer = optimizer
        self.action: Action = action
        self.loss_fn = loss_fn
        self.do_replay = replay
        self.replica_check_every = replica_check_every
        self.scaler = scaler
        self.sync = sync
        self.print_report = print_report
        # DDP(m), DDP(torch.compile(m)) or torch.compile(DDP(m)): the DDP holds the reducer;
        # the names, hashes and the replay are the original eager module's
        ddp = find_ddp(model)
        self.is_ddp = ddp is not None
        inner, _ = _inner(model)
        self.inner = inner
        named = [(strip_compiled(n), p) for n, p in inner.named_parameters()]
        if not named:
            raise MldebugError("NanSentinel: the model has no parameters, so there are no "
                               "gradients to check.",
                               "Wrap the module that holds the trainable weights.")
        self._params = [p for _, p in named if p.requires_grad]
        if not self._params:
            raise MldebugError("NanSentinel: every parameter of the model is frozen "
                               "(requires_grad=False): no gradient will ever be checked.",
                               "Unfreeze the weights you train, or wrap the trainable part.")
        self._names = {id(p): n for n, p in named}
        self._sparse = [strip_compiled(n) for n, m in inner.named_modules()
                        if getattr(m, "sparse", False) is True]
        if self._sparse and self.is_ddp:
            raise MldebugError(
                f"NanSentinel: {', '.join(self._sparse[:3])} makes sparse gradients, which DDP "
                "communication hooks do not see.",
                "Use dense gradients (sparse=False) under DDP, or wrap the plain module: the "
                "sentinel then checks the sparse gradients' values after backward.")
        self.dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        self._group = process_group
        self.rank = torch.distributed.get_rank() if self.dist else 0
        self.world = torch.distributed.get_world_size(process_group) if self.dist else 1
        self.host = socket.gethostname().split(".")[0]
        self.dir = self._private_dir(dir)
        self.path = records.record_path(self.dir, self.host, self.rank)
        try:
            records.create_record_file(self.path)
        except OSError as e:
            raise MldebugError(f"NanSentinel: cannot create its record file {self.path} "
                               f"({e.strerror}).", "Pass dir= a directory you can write "
                               "(a symlink there is refused).") from None
        self.step_number = 0
        self.micro_batch = 0
        self.trips = 0
        self.scaler_skips = 0
        self.skipped_steps = 0
        self.last_record: dict[str, Any] | None = None
        self._micro: _Micro | None = None
        self._micros: list[_Micro] = []  # the micro-batches of the current optimizer step
        self._bucket_params: dict[int, list[str]] = {}
        self._named_steps = 0
        self._skip_next = False
        self._late: tuple[torch.Tensor, Any, int, list[int], list[_Micro]] | None = None
        # the step's collective fingerprint: exchanged at the end of each deciding block
        self._fp: _fingerprint.StepCollectives | None = None
        # DDP: the reduced chunks and the (hash, count, entries) the first bucket carried
        self._ride: tuple[torch.Tensor, tuple[int, int, list[Any]]] | None = None
        if fingerprint and self.dist and self.world > 1 and sync == "step":
            _fingerprint.install()
            self._fp = _fingerprint.StepCollectives()
        self._handles: list[Any] = [model.register_forward_hook(self._output_hook)]
        if self.is_ddp:
            try:
                ddp.register_comm_hook(self, _comm_hook)  # type: ignore[union-attr,operator]
            except (RuntimeError, ValueError) as e:
                raise MldebugError(
                    f"NanSentinel: cannot register its DDP communication hook ({str(e)[:120]}).",
                    "Construct the sentinel right after DDP(...), before the first backward, "
                    "and without another comm hook (it wraps the default all-reduce).") from None
        if action == "skip" and optimizer is not None:
            self._orig_step = optimizer.step
            optimizer.step = self._guarded_step  # type: ignore[method-assign]

    # ---- set-up helpers ---------------------------------------------------------------------
    @staticmethod
    def _private_dir(d: str | Path | None) -> Path:
        from mldebug.privdir import private_dir

        if d is None:
            d = Path(os.environ.get("MLDEBUG_DIR") or ".") / "mldebug-numerics"
        try:
            return Path(private_dir(d))
        except OSError as e:
            raise MldebugError(f"NanSentinel: cannot create the record directory {d} "
                               f"({e.strerror}).", "Pass dir= a directory you can write.") \
                from None

    def _name_of(self, p: torch.Tensor) -> str:
        return self._names.get(id(p), "?")

    def _names_needed(self, idx: int) -> bool:
        # DDP rebuilds its buckets after the first step: learn the names during the first few
        return self._named_steps < 3 or idx not in self._bucket_params

    # ---- the step ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, batch: Any = None, *, step: int | None = None) -> Iterator[NanSentinel]:
        """Around forward + backward of one (micro-)batch; the optimizer step follows outside.

        ``step`` is your loop's step number (default: counted here; under DDP ``no_sync``
        micro-batches belong to the step of the block that reduces)."""
        if self._micro is not None:
            raise MldebugError("NanSentinel.step() blocks cannot be nested.",
                               "Use one `with sentinel.step(batch):` per forward + backward.")
        self._read_late()
        if step is not None:
            if step != self.step_number:
                self._micros.clear()
                self.micro_batch = 0
            self.step_number = step
        explicit = step is not None
        if self.replica_check_every and self.micro_batch == 0 and self.step_number > 0 \
                and self.step_number % self.replica_check_every == 0:
            self.check_replicas(self.step_number - 1)
        if self.micro_batch == 0:
            self._micros.clear()
        micro = _Micro(self.micro_batch, batch, rng_state())
        self._micro = micro
        hook = self._record_call(micro)
        self._ride = None
        if self._fp is not None:
            _fingerprint.activate(self._fp)
        try:
            yield self
        except BaseException:
            self._micro = None
            raise
        finally:
            if self._fp is not None:
                _fingerprint.activate(None)
            if hook is not None:
                hook.remove()
        self._micro = None
        self._micros.append(micro)
        reduced = bool(micro.pre)
        if not self.is_ddp or not reduced:
            micro.local = self._local_grad_max()
            if micro.local is not None and micro.local.device.type == "cpu" \
                    and not math.isfinite(float(micro.local)):  # free on the CPU
                micro.bad_names = self._bad_param_names()
        if self.is_ddp and not reduced:  # a no_sync micro-batch: its reducing block decides
            self.micro_batch += 1
            return
        try:
            self._check_collectives()
            self._decide()
        finally:
            self._named_steps += 1
            self._micros = []  # decided: a late read keeps its own reference
            if explicit and not self.is_ddp:  # your step number: blocks are its micro-batches
                self.micro_batch += 1
            else:
                self.step_number += 1
                self.micro_batch = 0

    def _record_call(self, micro: _Micro) -> Any:
        """A forward pre-hook that keeps the model's first call of the block (references only;
        a hook on one module costs microseconds a step): on DDP's ``.module``, or on a
        ``torch.compile`` wrapper itself, whose hooks run eagerly with the user's args (the
        replay calls the original module with them)."""
        if not self.do_replay:
            return None

        def keep(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if micro.call is None:
                micro.call = (args, dict(kwargs))

        try:
            return call_target(self.model).register_forward_pre_hook(keep, with_kwargs=True)
        except (AttributeError, RuntimeError, TypeError):  # a module kind without hooks
            return None

    def watch_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Have ``loss`` checked with this step (when the model does not return it)."""
        if self._micro is not None and isinstance(loss, torch.Tensor):
            self._micro.loss = loss.detach().float().reshape(-1)[:1].sum()
        return loss

    def _output_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        micro = self._micro
        if micro is None or micro.loss is not None:
            return
        loss = loss_of(output)
        if loss is not None:
            micro.loss = loss.detach().float()

    def _local_grad_max(self) -> torch.Tensor | None:
        """max |grad| over every local gradient (inf/nan propagate), one fused call per dtype."""
        dense: list[torch.Tensor] = []
        extra: list[torch.Tensor] = []
        for p in self._params:
            g = p.grad
            if g is None:
                continue
            if g.is_sparse:
                v = g.coalesce().values()
                if v.numel():
                    extra.append(v.abs().max().float())
            elif g.numel():
                dense.append(g)
        if dense:
            extra.extend(torch._foreach_norm(dense, float("inf")))
        if not extra:
            return None
        device = extra[0].device
        return torch.stack([t.float().to(device) for t in extra]).max()

    # ---- deciding ---------------------------------------------------------------------------
    def _flags(self) -> tuple[list[torch.Tensor], list[int]]:
        """One vector to bring to the host: per micro-batch [local, loss], then the reduced
        buckets, then the local buckets of the reducing block (fp32 sums/maxima)."""
        vals: list[torch.Tensor] = []
        layout: list[int] = []
        last = self._micros[-1]
        post = [b.reshape(()).float() for b in last.buffers]  # reduced first elements
        last.buffers = []
        last.n_post = len(post)
        known = [t for m in self._micros for t in (m.local, m.loss) if t is not None]
        known += post + [s for _, s in last.pre]
        device = known[0].device if known else torch.device("cpu")
        zero = None  # made on the flags' device: a CPU constant copied there could synchronise
        for m in self._micros:
            for t in (m.local, m.loss):
                if t is None:
                    if zero is None:
                        zero = torch.zeros((), dtype=torch.float32, device=device)
                    vals.append(zero)
                    layout.append(0)
                else:
                    vals.append(t.reshape(()).float())
                    layout.append(1)
        vals.extend(post)
        vals.extend(s for _, s in last.pre)
        for i, v in enumerate(vals):
            if v.device != device:
                vals[i] = v.to(device)
        return vals, layout

    def _decide(self) -> None:
        vals, layout = self._flags()
        if not vals or vals[0].device.type == "cpu":  # a few 0-d values: no kernels needed
            self._evaluate([math.isfinite(float(v)) for v in vals], layout)
            return
        finite = torch.isfinite(torch.stack(vals))
        if self.sync == "late" and finite.device.type == "cuda":
            host = torch.empty(finite.shape, dtype=torch.bool, pin_memory=True)
            host.copy_(finite, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._late = (host, event, self.step_number, layout, self._micros)
            return
        self._evaluate(finite.tolist(), layout)

    def flush(self) -> None:
        """``sync="late"``: read the last step's flags now (after the training loop, so a trip
        at the last step is not lost); every rank must call it. A no-op otherwise."""
        self._read_late()

    def _read_late(self) -> None:
        if self._late is None:
            return
        host, event, step, layout, micros = self._late
        self._late = None
        event.synchronize()  # recorded a whole step ago: long done
        flags = host.tolist()
        saved = self.step_number, self._micros
        self.step_number, self._micros = step, micros
        try:
            self._evaluate(flags, layout, late=True)
        finally:
            self.step_number, self._micros = saved

    def _evaluate(self, finite: list[bool], layout: list[int], late: bool = False) -> None:
        n_micro = len(self._micros)
        local_bad = [False] * n_micro
        loss_bad = [False] * n_micro
        for i in range(n_micro):
            local_bad[i] = layout[2 * i] == 1 and not finite[2 * i]
            loss_bad[i] = layout[2 * i + 1] == 1 and not finite[2 * i + 1]
        rest = finite[2 * n_micro:]
        last = self._micros[-1] if self._micros else None
        n_post = last.n_post if last else 0
        post_bad = not all(rest[:n_post])
        pre = rest[n_post:]
        pre_bad_buckets = [last.pre[i][0] for i, ok in enumerate(pre) if not ok] if last else []
        if pre_bad_buckets and n_micro:
            local_bad[-1] = True
        mine = any(local_bad) or any(loss_bad)
        tripped = post_bad if self.is_ddp else mine
        if not tripped:
            if mine:  # a loss that is not finite while the gradients are: recorded, no action
                self._write(self._record(local_bad, loss_bad, pre_bad_buckets, [self.rank],
                                         {"status": "skipped", "reproducible": None,
                                          "error": "loss not finite, gradients finite"},
                                         {}, "none"))
            return
        self._trip(local_bad, loss_bad, pre_bad_buckets, late)

    def _all_reduce(self, t: torch.Tensor, op: Any = None) -> torch.Tensor:
        """A small all-reduce on the device the backend needs (CUDA for NCCL)."""
        dist = torch.distributed
        if dist.get_backend(self._group) == "nccl":
            t = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=self._group)
        return t.cpu()

    # ---- the collective fingerprint -----------------------------------------------------------
    def _check_collectives(self) -> None:
        """Compare the step's collective hash across the ranks: one all-reduce (MIN) of
        [h, -h] gives the smallest and the largest; when they differ, every rank's sequence
        is gathered once and the first differing collective and the ranks that made it are
        recorded; every rank then takes the same action."""
        fp = self._fp
        if fp is None:
            return
        if self._ride is not None:  # DDP: it rode the first bucket's all-reduce
            sums, (h, count, entries) = self._ride
            self._ride = None
            if collectives.ride_equal(sums.double().cpu().tolist(), self.world):
                return
        else:  # no bucket carried it (a plain module, FSDP; a bf16/fp16 bucket)
            h, count, entries = fp.value(), fp.count, fp.entries
            fp.reset()
            v = self._all_reduce(torch.tensor([h, -h], dtype=torch.int64),
                                 torch.distributed.ReduceOp.MIN)
            if int(v[0]) == -int(v[1]):
                return
        gathered: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(gathered, (h, count, entries), group=self._group)
        seqs = {r: list(g[2]) for r, g in enumerate(gathered)}
        res = collectives.compare(seqs)
        if not res["differing"]:  # the kept entries agree: the difference lies further on
            hashes = [g[0] for g in gathered]
            best = max(hashes.count(x) for x in hashes)
            ref = next(x for x in hashes if hashes.count(x) == best)
            res["differing"] = [r for r, x in enumerate(hashes) if x != ref]
        rec = {"v": records.VERSION, "kind": "collectives", "rank": self.rank,
               "world_size": self.world, "host": self.host, "pid": os.getpid(),
               "time": time.time(), "step": self.step_number, "micro_batch": 0,
               "index": res["index"], "expected": res["expected"],
               "expected_ranks": res["expected_ranks"], "differing": res["differing"][:64],
               "entries": dict(list(res["entries"].items())[:64]),
               "counts": {str(r): int(g[1]) for r, g in enumerate(gathered)} if self.world <= 64
               else {}, "mine": entries[:collectives.MAX_ENTRIES], "action": self.action}
        self._write(rec)
        msg = self._collectives_message(rec)
        logger.error("%s", msg)
        if self.print_report:
            from mldebug.printing import printflock

            printflock(f"[{self.host}:{self.rank}] {msg}", file=sys.stderr)
        if self.action == "skip":
            self._skip_next = True
            return
        raise CollectivesDiffer(msg, rec)

    def _collectives_message(self, rec: dict[str, Any]) -> str:
        ranks = ", ".join(map(str, rec["differing"]))
        text = f"NanSentinel: the ranks' collectives differ at step {rec['step']}"
        if rec["index"] is not None:
            first = next(iter(rec["entries"].values()), None)
            text += (f": collective #{rec['index'] + 1} since the previous check is "
                     f"{collectives.describe(rec['expected'])} on {rec['expected_ranks']} "
                     f"rank(s) but {collectives.describe(first)} on rank(s) {ranks}")
        else:
            text += f" (beyond the first {collectives.MAX_ENTRIES}): rank(s) {ranks}"
        return text + f". Records: {self.dir} (mldebug numerics report {self.dir})"

    def _trip(self, local_bad: list[bool], loss_bad: list[bool], pre_bad: list[int],
              late: bool) -> None:
        self.trips += 1
        mine = any(local_bad) or any(loss_bad)
        if self.is_ddp and self.dist:
            vec = torch.zeros(2 * self.world)
            vec[self.rank] = float(mine)
            vec[self.world + self.rank] = float(any(loss_bad))
            vec = self._all_reduce(vec)
            origins = [r for r in range(self.world) if vec[r] > 0]
            any_loss_bad = bool((vec[self.world:] > 0).any())
        else:
            origins = [self.rank] if mine else []
            any_loss_bad = any(loss_bad)
        if self.scaler is not None and not any_loss_bad:
            # GradScaler's business: it skips this step itself and lowers the scale
            self.scaler_skips += 1
            rec = {"v": records.VERSION, "kind": "scaler_skip", "rank": self.rank,
                   "host": self.host, "step": self.step_number, "micro_batch": 0,
                   "time": time.time()}
            self._write(rec)
            return
        result: dict[str, Any] = {"status": "skipped", "reproducible": None}
        if self.rank in origins:
            first = next((i for i in range(len(local_bad)) if local_bad[i] or loss_bad[i]),
                         len(local_bad) - 1)
            if late:
                result = {"status": "skipped", "reproducible": None,
                          "error": "sync='late': the optimizer had stepped"}
            elif not self.do_replay:
                result = {"status": "skipped", "reproducible": None, "error": "replay=False"}
            elif self._micros[first].batch is None and (
                    self.loss_fn is not None or self._micros[first].call is None):
                result = {"status": "skipped", "reproducible": None,
                          "error": "no batch given to sentinel.step()" + (
                              " (loss_fn= needs it)" if self.loss_fn is not None
                              else " and the model was not called in the block")}
            else:
                m = self._micros[first]
                result = replay(self.model, m.batch, m.rng, self.loss_fn, call=m.call)
        codes = {"reproduced": 1.0, "not reproduced": 2.0, "error": 3.0, "skipped": 4.0}
        replays: dict[str, str] = {}
        if self.is_ddp and self.dist:
            res = torch.zeros(self.world)
            res[self.rank] = codes.get(result.get("status", ""), 0.0)
            res = self._all_reduce(res)
            names = {v: k for k, v in codes.items()}
            replays = {str(r): names.get(float(res[r]), "?") for r in origins}
        else:
            replays = {str(self.rank): result.get("status", "?")} if mine else {}
        rec = self._record(local_bad, loss_bad, pre_bad, origins, result, replays, self.action)
        self._write(rec)
        self._announce(rec)
        if self.action == "skip":
            self._skip_next = True
            return
        raise NonFiniteDetected(self._message(rec), rec)

    def _record(self, local_bad: list[bool], loss_bad: list[bool], pre_bad: list[int],
                origins: list[int], result: dict[str, Any], replays: dict[str, str],
                action: str) -> dict[str, Any]:
        mine = any(local_bad) or any(loss_bad)
        first = next((i for i in range(len(local_bad)) if local_bad[i] or loss_bad[i]),
                     len(local_bad) - 1 if local_bad else 0)
        micro = self._micros[first] if self._micros and mine else None
        last = self._micros[-1] if self._micros else None
        bucket: dict[str, Any] | None = None
        if pre_bad:
            idx = pre_bad[0]
            bucket = {"index": idx, "params": self._bucket_params.get(idx, [])[:32]}
            if last is not None and idx in last.bad_params:
                bucket["nonfinite_params"] = last.bad_params[idx]
        elif micro is not None:
            names = micro.bad_names if micro.bad_names is not None else self._bad_param_names()
            bucket = {"index": None, "params": names}
        return {
            "v": records.VERSION, "kind": "nonfinite", "rank": self.rank,
            "world_size": self.world, "host": self.host, "pid": os.getpid(),
            "time": time.time(), "step": self.step_number,
            "micro_batch": micro.index if micro is not None else 0,
            "origin": mine, "origins": origins,
            "loss_finite": (not loss_bad[first]) if micro is not None and micro.loss is not None
            else None,
            "first_bucket": bucket,
            "reduce_overflow": self.is_ddp and not origins,
            "replay": result if mine else None, "replays": replays, "action": action,
        }

    def _bad_param_names(self) -> list[str]:
        """Names of the local gradients that are not finite now (rare path, CPU read)."""
        out = []
        for p in self._params:
            g = p.grad
            if g is None:
                continue
            v = g.coalesce().values() if g.is_sparse else g
            if v.numel() and not bool(torch.isfinite(v).all()):
                out.append(self._name_of(p))
                if len(out) >= 32:
                    break
        return out

    def _write(self, rec: dict[str, Any]) -> None:
        self.last_record = rec
        try:
            records.append_record(self.path, rec)
        except OSError as e:  # a full disk must not change what the ranks do
            logger.error("NanSentinel: cannot write %s: %s", self.path, e.strerror)

    def _message(self, rec: dict[str, Any]) -> str:
        rp = rec.get("replay") or {}
        where = f"step {rec['step']}"
        if rec["origins"]:
            where += f", born on rank(s) {', '.join(map(str, rec['origins']))}"
        else:
            where += ", born in the all-reduce itself (every rank finite before it)"
        text = f"NanSentinel: non-finite loss or gradients at {where}"
        if rec["origin"]:
            if rp.get("status") == "reproduced":
                text += f"; replay: {rp.get('culprit')}"
            elif rp.get("status") == "not reproduced":
                text += f"; {rp.get('culprit')}"
            elif rp.get("error"):
                text += f"; no replay ({rp['error']})"
        text += f". Records: {self.dir} (mldebug numerics report {self.dir})"
        return text

    def _announce(self, rec: dict[str, Any]) -> None:
        msg = self._message(rec)
        logger.error("%s", msg)
        if self.print_report:
            from mldebug.printing import printflock

            prefix = f"[{self.host}:{self.rank}] " if self.dist else ""
            printflock(prefix + msg + ("" if self.action == "raise" else
                                       " - the optimizer step is skipped on every rank"),
                       file=sys.stderr)

    def _guarded_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._skip_next:
            self._skip_next = False
            self.skipped_steps += 1
            return None
        return self._orig_step(*args, **kwargs)

    @property
    def skip_pending(self) -> bool:
        """True between a tripped step and the optimizer step it skips."""
        return self._skip_next

    # ---- replica check ----------------------------------------------------------------------
    def param_hash(self) -> torch.Tensor:
        """A cheap hash of every parameter: the sum of its bits read as integers, weighted by
        its position (1-d int64 on the parameters' device, one entry per parameter)."""
        sums = []
        for p in self.inner.parameters():
            flat = p.detach().reshape(-1)
            size = flat.element_size()
            as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
            sums.append(flat.view(as_int).sum(dtype=torch.int64))
        return torch.stack(sums)

    def check_replicas(self, step: int | None = None) -> list[int]:
        """Compare the parameter hash across the replicas (every rank must call it at the same
        point, after the optimizer step). Returns the ranks that differ from the majority
        (empty when all agree or not distributed); records and acts on a difference."""
        if not (self.dist and self.world > 1):
            return []
        step = self.step_number if step is None else step
        h = self.param_hash().cpu()
        weights = torch.arange(1, h.numel() + 1, dtype=torch.int64)
        mine = int((h * weights).sum())
        vec = torch.zeros(self.world, dtype=torch.int64)
        vec[self.rank] = mine
        vec = self._all_reduce(vec)
        values = vec.tolist()
        counts: dict[int, int] = {}
        for v in values:
            counts[v] = counts.get(v, 0) + 1
        best = max(counts.values())
        reference = next(v for v in values if counts[v] == best)  # ties: the lowest rank's
        differing = [r for r, v in enumerate(values) if v != reference]
        if not differing:
            return []
        table = torch.zeros(self.world, h.numel(), dtype=torch.int64)
        table[self.rank] = h
        table = self._all_reduce(table)
        ref_rank = values.index(reference)
        names = [strip_compiled(n) for n, _ in self.inner.named_parameters()]
        diff = (table[differing[0]] != table[ref_rank]).nonzero()
        param = names[int(diff[0])] if diff.numel() and int(diff[0]) < len(names) else None
        rec = {"v": records.VERSION, "kind": "replica", "rank": self.rank,
               "world_size": self.world, "host": self.host, "pid": os.getpid(),
               "time": time.time(), "step": step, "micro_batch": 0,
               "differing": differing, "param": param, "action": self.action}
        self._write(rec)
        msg = (f"NanSentinel: replica check after step {step}: rank(s) "
               f"{', '.join(map(str, differing))} hold different weights"
               + (f" (first: {param})" if param else "") + f". Records: {self.dir}")
        logger.error("%s", msg)
        if self.print_report:
            from mldebug.printing import printflock

            printflock(f"[{self.host}:{self.rank}] {msg}", file=sys.stderr)
        if self.action == "raise":
            raise ReplicasDiverged(msg, rec)
        return differing

    # ---- lifecycle --------------------------------------------------------------------------
    def detach(self) -> None:
        """Remove the forward hook and restore optimizer.step (the DDP comm hook stays: DDP
        cannot unregister one; with no step() block open it only forwards to the all-reduce)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.optimizer is not None and getattr(self, "_orig_step", None) is not None:
            self.optimizer.step = self._orig_step  # type: ignore[method-assign]


def replica_hash_fn(sentinel: NanSentinel) -> Callable[[], torch.Tensor]:
    """For benchmarks: the hash alone, without the collective."""
    return sentinel.param_hash
