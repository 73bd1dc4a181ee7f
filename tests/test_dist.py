"""Rank identity from every launcher's environment, and from /proc/PID/environ."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mldebug.dist import identity_from_env, identity_of_pid, short_hostname


@pytest.mark.parametrize("env,expected", [
    ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "4",
      "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "abc"},
     (5, 1, 16, 4, 1, "torchrun", "abc")),
    ({"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NTASKS": "32",
      "SLURM_NTASKS_PER_NODE": "8(x4)", "SLURM_NODEID": "1", "SLURM_JOB_ID": "777"},
     (9, 1, 32, 8, 1, "slurm", "777")),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
      "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
     (3, 3, 4, 4, None, "openmpi", None)),
    ({"PMI_RANK": "2", "PMI_SIZE": "8", "MPI_LOCALRANKID": "0"},
     (2, 0, 8, None, None, "mpich", None)),
    # torchrun under srun: the torch.distributed variables win
    ({"RANK": "12", "SLURM_PROCID": "1", "WORLD_SIZE": "16"},
     (12, None, 16, None, None, "torchrun", None)),
])
def test_launchers(env, expected):
    i = identity_from_env(env, host="gpu7.cluster.example")
    assert (i.rank, i.local_rank, i.world_size, i.local_world_size, i.node_rank, i.launcher,
            i.run_id) == expected
    assert i.host == "gpu7"


def test_no_launcher():
    i = identity_from_env({"PATH": "/bin"}, host="h")
    assert not i.is_distributed and i.rank is None


def test_identity_of_another_process_from_proc():
    env = dict(os.environ, RANK="3", WORLD_SIZE="4", LOCAL_RANK="3")
    p = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); import time; time.sleep(30)"],
                         env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "up\n"  # exec has happened
        i = identity_of_pid(p.pid)
        assert (i.rank, i.world_size, i.local_rank) == (3, 4, 3)
        assert i.host == short_hostname()
    finally:
        p.kill()
        p.wait()
