"""Who am I: rank, local rank, world size and host, from any launcher's environment.

Works on the current process (``identity()``) and on another process through
``/proc/PID/environ`` (``identity_of_pid()``), which is how hang collection labels ranks.
Stdlib only: the fan-out bundles it with the hang node script for nodes without mldebug.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from mldebug.nodekit import short_hostname

# (launcher, rank var, local rank var, world size var, local world size var, node rank var)
# Order matters: the first launcher whose rank variable is set wins. torchrun, DeepSpeed and
# accelerate all export the torch.distributed variables, so they are recognised as "torchrun".
LAUNCHERS: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_COMM_WORLD_NODE_RANK",
    ),
    ("mpich", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS", ""),
)

RANK_VARS: tuple[str, ...] = tuple(launcher[1] for launcher in LAUNCHERS)


class Identity:
    """A process's place in a distributed job. Fields are None when unknown. Immutable and
    compared by value. A plain class, not a dataclass: node scripts and the fast local
    ``mldebug hang`` import this module before their first py-spy starts, and ``dataclasses``
    (with ``inspect``) costs more to import than all of this module."""

    FIELDS = ("rank", "local_rank", "world_size", "local_world_size", "node_rank", "launcher",
              "run_id", "host")
    __slots__ = FIELDS

    rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    node_rank: int | None
    launcher: str | None
    run_id: str | None  # torchrun's TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ...
    host: str

    def __init__(self, rank: int | None = None, local_rank: int | None = None,
                 world_size: int | None = None, local_world_size: int | None = None,
                 node_rank: int | None = None, launcher: str | None = None,
                 run_id: str | None = None, host: str = "") -> None:
        for name, value in zip(self.FIELDS, (rank, local_rank, world_size, local_world_size,
                                             node_rank, launcher, run_id, host), strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Identity is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Identity is immutable: cannot delete {name!r}")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle, through __init__
        return (Identity, self._values())

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"Identity({inner})"

    @property
    def is_distributed(self) -> bool:
        return self.rank is not None

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.FIELDS}


def _int(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value.split("(")[0].split(",")[0])  # SLURM_NTASKS_PER_NODE can be "4(x2)"
    except ValueError:
        return None




def identity_from_env(env: Mapping[str, str], host: str | None = None) -> Identity:
    """Read the identity from an environment mapping (pure: no I/O beside the host name)."""
    hostname = short_hostname(host)
    for name, rank_v, local_v, world_v, local_world_v, node_v in LAUNCHERS:
        rank = _int(env.get(rank_v))
        if rank is None:
            continue
        run_id = (
            env.get("TORCHELASTIC_RUN_ID")
            or env.get("SLURM_JOB_ID")
            or env.get("OMPI_MCA_orte_jobfam_session_dir")
            or env.get("PMI_JOBID")
        )
        return Identity(
            rank=rank,
            local_rank=_int(env.get(local_v)),
            world_size=_int(env.get(world_v)),
            local_world_size=_int(env.get(local_world_v)),
            node_rank=_int(env.get(node_v)) if node_v else None,
            launcher=name,
            run_id=run_id,
            host=hostname,
        )
    return Identity(host=hostname)


def identity(host: str | None = None) -> Identity:
    """The identity of the current process."""
    return identity_from_env(os.environ, host)


def read_environ(pid: int) -> dict[str, str]:
    """Another process's environment from /proc; raises OSError when it cannot be read."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read()
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            key, _, value = item.partition(b"=")
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def identity_of_pid(pid: int, host: str | None = None) -> Identity:
    """The identity of another process, from its environment at exec time."""
    return identity_from_env(read_environ(pid), host)
