"""Synthetic NCCL_DEBUG=INFO logs for N ranks (8 per host) in NCCL 2.2x's real line shapes.

Used by benchmarks/bench_nccl_log.py and the scale test. Problems planted: every 64th host
uses a docker0 bootstrap, every 128th host logs an IB completion error 12 and rank 5 never
completes init; the rest are healthy.
"""

from __future__ import annotations

from pathlib import Path


def rank_lines(rank: int, world: int, per_host: int = 8) -> list[str]:
    host = f"node{rank // per_host + 1}"
    hno = rank // per_host
    pid, dev = 10000 + rank, rank % per_host
    p = f"{host}:{pid}:{pid + 40} [{dev}] NCCL INFO "
    boot = "docker0:172.17.0.1<0>" if hno % 64 == 63 else f"ibp25s0:10.0.{hno // 250}.{hno % 250}<0>"
    lines = [
        f"{host}:{pid}:{pid} [{dev}] NCCL INFO cudaDriverVersion 12040",
        f"{host}:{pid}:{pid} [{dev}] NCCL INFO Bootstrap : Using {boot}",
        f"{host}:{pid}:{pid} [{dev}] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.",
        f"{host}:{pid}:{pid} [{dev}] NCCL INFO NCCL version 2.21.5+cuda12.4",
        p + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [RO]; "
            f"OOB ibp25s0:10.0.{hno // 250}.{hno % 250}<0>",
        p + "Using network IB",
        p + f"ncclCommInitRank comm 0x55aa{rank:06x} rank {rank} nranks {world} cudaDev {dev} "
            f"nvmlDev {dev} busId {dev}8000 commId 0x1d4e2f6a8b9c0d11 - Init START",
        p + "NCCL_IB_GID_INDEX set by environment to 3.",
    ]
    lines += [p + f"Channel {c:02d}/0 : {rank}[{dev}] -> {(rank + 1) % world}[{(dev + 1) % 8}] "
              "via P2P/CUMEM/read" for c in range(8)]
    if not (hno % 128 == 127 and dev == 5):
        lines.append(p + f"ncclCommInitRank comm 0x55aa{rank:06x} rank {rank} nranks {world} "
                     f"cudaDev {dev} nvmlDev {dev} busId {dev}8000 commId 0x1d4e2f6a8b9c0d11 "
                     "localSize 296 used 1024 bytes on core 3 - Init COMPLETE")
    lines += [p + f"AllReduce: opCount {i:x} sendbuff 0x7f00 recvbuff 0x7f00 count 1024 "
              "datatype 7 op 0 root 0 comm 0x55aa stream 0x1" for i in range(4)]
    if hno % 128 == 127:
        lines.append(f"{host}:{pid}:{pid + 41} [{dev}] transport/net_ib.cc:2244 NCCL WARN NET/IB: "
                     f"Got completion from peer 10.0.0.{hno % 250}<5{dev}908> with status=12 "
                     "opcode=129 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 "
                     "remoteGids::ffff:10.0.0.2 hca mlx5_0")
    return lines


def write_job(out: Path, world: int, per_host: int = 8) -> list[Path]:
    """One file per rank, like NCCL_DEBUG_FILE=nccl.%h.%p."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(world):
        path = out / f"nccl.node{r // per_host + 1}.{10000 + r}.log"
        path.write_text("\n".join(rank_lines(r, world, per_host)) + "\n")
        paths.append(path)
    return paths
