"""NanSentinel in one process: plain modules, a world-1 DDP, bad input, GradScaler, skip, and
the report over real records (the 4-rank torchrun cases are in test_numerics_sentinel_ddp)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from envelope_check import check_envelope

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mldebug.errors import MldebugError  # noqa: E402
from mldebug.numerics import records  # noqa: E402
from mldebug.numerics.sentinel import NanSentinel, NonFiniteDetected  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "recipes"))
from nan_sentinel import Net  # noqa: E402


def batch(seed: int = 0, big: float | None = None, scale: float = 1.0) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 16, generator=g) * scale, torch.randn(8, 1, generator=g)
    if big is not None:
        x[0, 0] = big
    return x, y


def read(d: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for f in sorted(d.glob("*.jsonl")) for ln in f.read_text().splitlines()]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "mldebug", *args], capture_output=True,
                          text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)


def test_backward_nan_is_named_and_reproducible_and_the_report_says_so(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    s = NanSentinel(net, opt, dir=tmp_path / "rec", print_report=False)
    for step in range(2):
        with s.step(batch(step)):
            net(*batch(step)).backward()
        opt.step()
        opt.zero_grad()
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(NonFiniteDetected) as e:
        with s.step(batch(9, big=1000.0)):
            net(*batch(9, big=1000.0)).backward()
    rec = e.value.record
    assert rec["step"] == 2 and rec["origin"] is True and rec["loss_finite"] is True
    rp = rec["replay"]
    assert (rp["phase"], rp["module"], rp["cls"], rp["reproducible"]) == \
        ("backward", "layers.3.gate", "Gate", True)
    assert "layers.0.fc.weight" in rec["first_bucket"]["params"]
    # the replay touched no parameter
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    (f,) = (tmp_path / "rec").glob("*.jsonl")
    assert f.stat().st_mode & 0o777 == 0o600 and (tmp_path / "rec").stat().st_mode & 0o777 == 0o700
    r = cli("numerics", "report", str(tmp_path / "rec"), "--json")
    assert r.returncode == 0, r.stderr
    v = check_envelope(json.loads(r.stdout), "numerics.report")
    assert (v["kind"], v["culprits"], v["class"]) == ("culprits", [0], "non-finite")
    first = json.loads(r.stdout)["first"]
    assert {k: first[k] for k in ("rank", "step", "module", "phase", "reproducible")} == \
        {"rank": 0, "step": 2, "module": "layers.3.gate", "phase": "backward", "reproducible": True}
    r = cli("numerics", "report", str(tmp_path / "rec"))
    assert "backward of layers.3.gate (Gate)" in r.stdout and "reproducible on replay" in r.stdout


def test_forward_inf_with_a_dict_batch_and_watch_loss(tmp_path: Path) -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def forward(self, x: Any, y: Any) -> Any:
            return self.net.layers[1](self.net.layers[0](x)).sum(1, keepdim=True) - y

    torch.manual_seed(0)
    m = Model()
    s = NanSentinel(m, dir=tmp_path, print_report=False,
                    loss_fn=lambda mod, b: mod(**b).pow(2).mean())
    x, y = batch(1, scale=1e5)
    with pytest.raises(NonFiniteDetected) as e:
        with s.step({"x": x, "y": y}):
            loss = s.watch_loss(m(x=x, y=y).pow(2).mean())
            loss.backward()
    rec = e.value.record
    assert rec["loss_finite"] is False
    assert (rec["replay"]["phase"], rec["replay"]["module"], rec["replay"]["tensor"]) == \
        ("forward", "net.layers.1.act", "output")
    assert "+Inf!" in rec["replay"]["summary"]  # lovely-tensors' line of the output


def test_gradient_accumulation_names_the_micro_batch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    s = NanSentinel(net, dir=tmp_path, print_report=False)
    with s.step(batch(0), step=5):
        net(*batch(0)).backward()
    with pytest.raises(NonFiniteDetected) as e:
        with s.step(batch(1, big=1000.0), step=5):
            net(*batch(1, big=1000.0)).backward()
    assert (e.value.record["step"], e.value.record["micro_batch"]) == (5, 1)


def test_skip_skips_one_optimizer_step_and_restores_grads_and_rng(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    s = NanSentinel(net, opt, dir=tmp_path, action="skip", print_report=False)
    torch.manual_seed(123)
    with s.step(batch(0, big=1000.0)):
        net(*batch(0, big=1000.0)).backward()
    grads = [p.grad for p in net.parameters()]
    expected_rng = torch.get_rng_state()
    before = [p.detach().clone() for p in net.parameters()]
    assert s.skip_pending and s.last_record and s.last_record["replay"]["reproducible"] is True
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert [p.grad for p in net.parameters()] == grads  # the same objects: put back
    assert torch.equal(torch.get_rng_state(), expected_rng)
    opt.zero_grad()
    with s.step(batch(1)):
        net(*batch(1)).backward()
    opt.step()
    assert s.skipped_steps == 1 and not s.skip_pending
    assert not all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    s.detach()


def test_a_one_time_fault_is_not_reproducible(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    left = [1]

    def flip(mod: nn.Module, args: Any, out: Any) -> None:
        if left[0]:
            left[0] = 0
            with torch.no_grad():
                out.view(torch.int32)[0, 0] |= 0x7F800000

    net.layers[2].fc.register_forward_hook(flip)
    s = NanSentinel(net, dir=tmp_path, print_report=False)
    with pytest.raises(NonFiniteDetected) as e:
        with s.step(batch(0)):
            net(*batch(0)).backward()
    assert e.value.record["replay"]["reproducible"] is False
    assert "silent data corruption" in str(e.value)


def test_gradscaler_inf_skips_are_counted_not_faults(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    s = NanSentinel(net, opt, dir=tmp_path, scaler=scaler, print_report=False)
    x = torch.randn(2, 4)
    with s.step(x):
        out = net(x).sum()
        # finite loss, overflowing gradients: what a too-large loss scale does in fp16
        scaler.scale(out * 1e35).backward()
    scaler.step(opt)
    scaler.update()
    assert s.scaler_skips == 1 and s.trips == 1
    assert [r["kind"] for r in read(tmp_path)] == ["scaler_skip"]
    rep = records.analyze(records.load_records(tmp_path))
    assert rep.first is None and rep.scaler_skips == 1
    assert [f.code for f in rep.findings] == ["numerics-scaler-skips"]


def test_sparse_gradients_of_a_plain_module_are_checked(tmp_path: Path) -> None:
    emb = nn.Embedding(10, 4, sparse=True)
    s = NanSentinel(emb, dir=tmp_path, print_report=False, replay=False)
    idx = torch.tensor([1, 2])
    with s.step(idx):
        emb(idx).sum().backward()
    emb.zero_grad()
    with pytest.raises(NonFiniteDetected) as e:
        with s.step(idx):
            (emb(idx) * torch.tensor([[math.inf] * 4, [1.0] * 4])).sum().backward()
    assert e.value.record["first_bucket"]["params"] == ["weight"]
    assert e.value.record["replay"]["error"] == "replay=False"


def _bad(fn: Any, match: str) -> None:
    with pytest.raises(MldebugError, match=match) as e:
        fn()
    assert e.value.fix


def test_bad_input_is_one_clear_error(tmp_path: Path) -> None:
    _bad(lambda: NanSentinel(nn.ReLU(), dir=tmp_path), "no parameters")
    frozen = nn.Linear(2, 2).requires_grad_(False)
    _bad(lambda: NanSentinel(frozen, dir=tmp_path), "frozen")
    _bad(lambda: NanSentinel(nn.Linear(2, 2), dir=tmp_path, action="skip"), "needs the optimizer")
    _bad(lambda: NanSentinel(nn.Linear(2, 2), dir=tmp_path, action="explode"),  # type: ignore[arg-type]
         "not one of")
    _bad(lambda: NanSentinel(nn.Linear(2, 2), dir=tmp_path, replica_check_every=-1), ">= 0")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    _bad(lambda: NanSentinel(nn.Linear(2, 2), dir=shared), "other users")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "rec", target_is_directory=True)
    (tmp_path / "rec").mkdir(mode=0o700)
    _bad(lambda: NanSentinel(nn.Linear(2, 2), dir=link), "symlink")


def test_a_world_1_ddp_job_trips_through_the_comm_hook(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        _bad(lambda: NanSentinel(DDP(nn.Embedding(4, 2, sparse=True)), dir=tmp_path),
             "sparse gradients")
        torch.manual_seed(0)
        model = DDP(Net())
        s = NanSentinel(model, dir=tmp_path / "rec", print_report=False)
        with s.step(batch(0)):
            model(*batch(0)).backward()
        with pytest.raises(NonFiniteDetected) as e:
            with s.step(batch(1, big=1000.0)):
                model(*batch(1, big=1000.0)).backward()
        rec = e.value.record
        assert rec["origins"] == [0] and rec["first_bucket"]["index"] == 0
        assert "layers.3.fc.weight" in rec["first_bucket"]["nonfinite_params"]
        assert rec["replay"]["module"] == "layers.3.gate"  # the inner module's names
        assert s.check_replicas() == []
        # DDP accepts one comm hook: a second sentinel says so in one line
        _bad(lambda: NanSentinel(model, dir=tmp_path / "rec"), "communication hook")
    finally:
        dist.destroy_process_group()


def test_report_skips_bad_files_with_reasons(tmp_path: Path) -> None:
    d = tmp_path / "rec"
    d.mkdir(mode=0o700)
    node = d / "node2"
    node.mkdir()
    good = {"v": 1, "kind": "nonfinite", "rank": 5, "world_size": 8, "host": "node2",
            "step": 7, "micro_batch": 0, "origin": True, "origins": [5], "loss_finite": True,
            "replay": {"status": "not reproduced", "reproducible": False}, "action": "raise"}
    records.append_record(node / "numerics-node2-rank5.jsonl", good)
    (d / "numerics-node1-rank0.jsonl").write_text(
        'not json\n[1]\n{"kind": "nonfinite", "rank": -1, "step": 1}\n'
        + json.dumps({**good, "rank": 0, "host": "node1\x1b[31m", "origin": False}) + "\n")
    (d / "numerics-node1-rank1.jsonl").symlink_to("/etc/passwd")
    (d / "numerics-node1-rank2.jsonl").write_bytes(b"{" * (70 << 10) + b"\n")
    rep = records.analyze(records.load_records(d))
    reasons = dict(rep.skipped)
    assert reasons["numerics-node1-rank0.jsonl:1"].startswith("not JSON")
    assert reasons["numerics-node1-rank0.jsonl:2"] == "not a JSON object"
    assert reasons["numerics-node1-rank0.jsonl:3"] == "rank is not a non-negative integer"
    assert reasons["numerics-node1-rank1.jsonl"] == "a symlink (not followed)"
    assert "longer than" in reasons["numerics-node1-rank2.jsonl:1"]
    assert rep.first is not None and (rep.first.rank, rep.first.step) == (5, 7)
    assert rep.first.reproducible is False and "silent data corruption" in rep.verdict
    codes = {f.code for f in rep.findings}
    assert {"numerics-nonfinite-not-reproducible", "numerics-records-missing",
            "numerics-records-skipped"} <= codes
    r = cli("numerics", "report", str(d))
    assert r.returncode == 0 and "\x1b[31m" not in r.stdout
    r = cli("numerics", "report", str(tmp_path / "missing"))
    assert r.returncode == 1 and "is not a directory" in r.stderr and "Traceback" not in r.stderr


def test_import_and_report_need_no_torch(tmp_path: Path) -> None:
    (tmp_path / "numerics-node1-rank0.jsonl").touch()  # as a sentinel that never tripped leaves it
    code = ("import sys, mldebug, mldebug.cli; assert 'NanSentinel' in dir(mldebug); "
            f"rc = mldebug.cli.main(['numerics', 'report', {str(tmp_path)!r}]); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "no non-finite value recorded" in r.stdout


def test_nothing_tripped_is_told_from_a_directory_no_sentinel_wrote(tmp_path: Path) -> None:
    """Issue #40: an empty or wrong directory said 'no non-finite value recorded', exit 0.
    A sentinel creates its rank's file when it starts; a directory without one is an error."""
    torch.manual_seed(0)
    net = Net()
    s = NanSentinel(net, dir=tmp_path / "rec", print_report=False)
    with s.step(batch(0)):
        net(*batch(0)).backward()
    [f] = list((tmp_path / "rec").iterdir())
    assert records.FILE_RE.match(f.name) and f.stat().st_size == 0
    assert (f.stat().st_mode & 0o777) == 0o600
    r = cli("numerics", "report", str(tmp_path / "rec"))
    assert r.returncode == 0 and "no non-finite value recorded" in r.stdout
    assert "in 1 file(s)" in r.stdout
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "events.jsonl").write_text("{}\n")
    for d in ("empty", "other"):
        r = cli("numerics", "report", str(tmp_path / d))
        assert r.returncode == 1 and r.stdout == "", r.stdout
        assert r.stderr.startswith(f"mldebug: error: {tmp_path / d} holds no NanSentinel record "
                                   "file (numerics-HOST-rankN.jsonl)"), r.stderr
        assert "Pass the dir= of NanSentinel(...)" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_late_mode_adds_no_host_sync_on_cuda_and_raises_at_the_next_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net().cuda()
    s = NanSentinel(net, dir=tmp_path, sync="late", print_report=False)

    def run(seed: int, big: float | None = None, strict: bool = True) -> None:
        x, y = (t.cuda() for t in batch(seed, big=big))
        torch.cuda.synchronize()
        # any host sync in the step raises (the trip itself, the rare path, may sync)
        torch.cuda.set_sync_debug_mode("error" if strict else 0)
        try:
            with s.step((x, y)):
                net(x, y).backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        net.zero_grad()

    run(0)
    run(1, big=1000.0)  # the trip is read one step late
    with pytest.raises(NonFiniteDetected) as e:
        run(2, strict=False)
    assert e.value.record["step"] == 1 and e.value.record["replay"]["status"] == "skipped"


class _XOnly(nn.Module):
    """The recipe's blocks behind a forward that takes x alone: the step computes the loss
    itself from the batch's y, as most training loops do."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.net.layers:
            x = layer(x)
        return self.net.head(x)


@pytest.mark.parametrize("give_batch", [True, False])
def test_replay_calls_the_model_as_the_step_did_not_as_the_batch_looks(tmp_path: Path,
                                                                        give_batch: bool) -> None:
    """Issue #43: a tuple batch (x, y) of which the step passed only x to the model was replayed
    as model(x, y): the replay crashed and the report said 'not localised'. The replay calls
    the model with the args its first call in the block had, so the module is named, and
    without a batch given to step() too."""
    torch.manual_seed(0)
    model = _XOnly()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    s = NanSentinel(model, opt, dir=tmp_path / "rec", print_report=False)
    x, y = batch(9, big=1000.0)
    with pytest.raises(NonFiniteDetected) as e:
        with s.step((x, y) if give_batch else None):
            nn.functional.mse_loss(model(x), y).backward()
    rp = e.value.record["replay"]
    assert rp["status"] == "reproduced", rp
    assert (rp["phase"], rp["module"], rp["cls"]) == ("backward", "net.layers.3.gate", "Gate")
    assert not model._forward_pre_hooks  # the hook lives for the block only


def _can_compile() -> bool:
    try:
        import torch._dynamo  # noqa: F401
    except Exception:
        return False
    return hasattr(torch, "compile") and not sys.platform.startswith("win")


needs_compile = pytest.mark.skipif(not _can_compile(), reason="torch.compile is unavailable")


def _compiled_trip(s: NanSentinel, model: nn.Module, give_batch: bool = True) -> dict[str, Any]:
    with s.step(batch(0)):
        model(*batch(0)).backward()
    model.zero_grad()
    with pytest.raises(NonFiniteDetected) as e:
        with s.step(batch(1, big=1000.0) if give_batch else None):
            model(*batch(1, big=1000.0)).backward()
    rec = e.value.record
    rp = rec["replay"]
    assert (rp["status"], rp["phase"], rp["module"], rp["cls"], rp["reproducible"]) == \
        ("reproduced", "backward", "layers.3.gate", "Gate", True), rp
    params = rec["first_bucket"].get("nonfinite_params") or rec["first_bucket"]["params"]
    assert "layers.3.fc.weight" in params and not any("_orig_mod" in p for p in params)
    return rec


@needs_compile
@pytest.mark.parametrize("give_batch", [True, False])
def test_a_compiled_model_is_replayed_eagerly_on_the_original_module(tmp_path: Path,
                                                                     give_batch: bool) -> None:
    """Issue #43: torch.compile(model) (aot_eager: autograd runs through the compiled graph,
    no C compiler needed). The trip is seen as for the eager model; the replay runs the
    original module eagerly, so the detector's hooks name layers.3.gate, not a graph."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Net()
    model = torch.compile(net, backend="aot_eager")
    s = NanSentinel(model, dir=tmp_path / "rec", print_report=False)
    rec = _compiled_trip(s, model, give_batch)
    assert rec["origins"] == [0] and rec["loss_finite"] is True
    assert not net._forward_pre_hooks and not model._forward_pre_hooks
    assert all(not m._forward_hooks for m in net.modules())  # the replay's hooks are gone
    model.zero_grad()
    with s.step(batch(2)):  # training goes on, compiled
        model(*batch(2)).backward()
    assert s.trips == 1


@needs_compile
@pytest.mark.parametrize("form", ["ddp_of_compiled", "compiled_ddp"])
def test_a_compiled_model_under_world_1_ddp_is_replayed_eagerly(tmp_path: Path,
                                                                form: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        net = Net()
        model = DDP(torch.compile(net, backend="aot_eager")) if form == "ddp_of_compiled" \
            else torch.compile(DDP(net), backend="aot_eager")
        s = NanSentinel(model, dir=tmp_path / "rec", print_report=False)
        assert s.is_ddp
        rec = _compiled_trip(s, model, give_batch=False)  # the call hook saw the args
        assert rec["origins"] == [0] and rec["first_bucket"]["index"] is not None
        assert all(not p.startswith("_orig_mod") for p in rec["first_bucket"]["params"])
        assert s.check_replicas() == []
    finally:
        dist.destroy_process_group()
