"""Forked pdb driven through a real pty: fork children, multiprocessing, and torchrun ranks."""

from __future__ import annotations

import os
import sys

import pexpect
import pytest
from conftest import REPO

FORKED = r"""
import os, sys
import mldebug
pid = os.fork()
if pid == 0:
    x = 6 * 7
    mldebug.breakpoint()
    print("child done", x, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent done", flush=True)
"""

MULTIPROC = r"""
import multiprocessing as mp
import mldebug

def work(n):
    secret = n * 1000 + 1
    mldebug.breakpoint()
    print("worker done", secret, flush=True)

if __name__ == "__main__":
    p = mp.get_context("fork").Process(target=work, args=(7,))
    p.start(); p.join()
    print("exit code", p.exitcode, flush=True)
"""

TORCHRUN = r"""
import datetime, os
import torch.distributed as dist
import mldebug
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
value = 100 + rank
mldebug.breakpoint(rank=0)
dist.barrier()
print(f"rank {rank} finished", flush=True)
dist.destroy_process_group()
"""


def spawn(args: list[str], tmp_path) -> pexpect.spawn:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    return pexpect.spawn(args[0], args[1:], env=env, cwd=str(tmp_path), encoding="utf-8",
                         timeout=60, dimensions=(50, 200))


def test_breakpoint_in_a_forked_child(tmp_path):
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    child = spawn([sys.executable, str(script)], tmp_path)
    child.expect(r"\(Pdb\)")
    child.sendline("p x")
    child.expect("42")
    child.expect(r"\(Pdb\)")
    child.sendline("c")
    child.expect("child done 42")
    child.expect("parent done")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_breakpoint_in_a_multiprocessing_worker_whose_stdin_is_devnull(tmp_path):
    script = tmp_path / "mp.py"
    script.write_text(MULTIPROC)
    child = spawn([sys.executable, str(script)], tmp_path)
    child.expect(r"\(Pdb\)")
    child.sendline("p secret")
    child.expect("7001")
    child.sendline("c")
    child.expect("worker done 7001")
    child.expect("exit code 0")
    child.expect(pexpect.EOF)


@pytest.mark.slow
def test_breakpoint_on_rank0_under_torchrun_others_wait(tmp_path):
    script = tmp_path / "tr.py"
    script.write_text(TORCHRUN)
    child = spawn([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node=2", str(script)], tmp_path)
    child.expect(r"\(Pdb\)", timeout=120)
    child.sendline("p value")
    child.expect("100")
    child.expect(r"\(Pdb\)")
    child.sendline("c")
    child.expect(r"rank \d finished")
    child.expect(r"rank \d finished")
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus == 0


def test_breakpoint_skips_other_ranks(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="1", WORLD_SIZE="2")
    import subprocess

    r = subprocess.run([sys.executable, "-c", "import mldebug; mldebug.breakpoint(rank=0); "
                        "print('not stopped')"], capture_output=True, text=True, env=env,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.stdout.strip() == "not stopped"
