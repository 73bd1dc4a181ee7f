"""The recorder side without a job: merging recorders, native env, and NCCL where CUDA exists."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import fr_synth as synth
import pytest
from conftest import REPO

from mldebug.fr.recorder import merge_dumps, native_env


def test_merge_orders_entries_by_creation_time_and_unions_groups():
    a = synth.dump(0, [synth.entry(1, backend="nccl"), synth.entry(3, backend="nccl")], world=2)
    b = synth.dump(0, [synth.entry(2, backend="gloo", pg=("1", "cpu"), pg_id=1)],
                   groups={"1": ("cpu", [0, 1])})
    m = merge_dumps([a, b])
    assert [e["profiling_name"] for e in m["entries"]] == ["nccl:all_reduce", "gloo:all_reduce",
                                                          "nccl:all_reduce"]
    assert set(m["pg_config"]) == {"0", "1"} and set(m["pg_status"]) == {"0", "1"}


def test_native_env_uses_both_names_and_a_subdirectory(tmp_path):
    env = native_env(tmp_path, 123)
    stem = str(tmp_path / "nccl" / "fr_rank")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == stem
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == stem
    assert env["TORCH_FR_BUFFER_SIZE"] == "123"
    # the old buffer name only for torch before 2.9 (newer torch warns on every rank: #40)
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
    assert native_env(tmp_path, 123, legacy=True)["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "123"


def test_enable_keeps_user_settings_and_dump_works_without_a_job(tmp_path):
    pytest.importorskip("torch")
    code = textwrap.dedent(f"""
        import os, pickle
        os.environ["TORCH_FR_BUFFER_SIZE"] = "77"
        import mldebug.fr
        rec = mldebug.fr.enable({str(tmp_path)!r}, trigger=False, on_failure=False)
        assert os.environ["TORCH_FR_BUFFER_SIZE"] == "77"
        assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
        assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ  # torch 2.13 warns on it
        p = mldebug.fr.dump("test")
        d = pickle.load(open(p, "rb"))
        print(p.name, d["mldebug"]["reason"], d["rank"])
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["fr_rank0", "test", "0"]


@pytest.mark.cuda
def test_nccl_single_rank_dump_and_native_pipe(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    code = textwrap.dedent(f"""
        import os, pickle, torch, torch.distributed as dist
        import mldebug.fr
        mldebug.fr.enable({str(tmp_path)!r})  # before init: the NCCL env applies
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        p = mldebug.fr.dump("test")
        d = pickle.load(open(p, "rb"))
        names = [e["profiling_name"] for e in d["entries"]]
        assert any(n.startswith("nccl:all_reduce") for n in names), names
        assert os.path.exists({str(tmp_path / "nccl" / "fr_rank0.pipe")!r})
        dist.destroy_process_group()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
