"""mldebug.logprefix.split_prefix on the prefixes real launchers and loggers add."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mldebug.logprefix import split_prefix

NCCL = "node1:11:12 [0] NCCL INFO Using network IB"


@pytest.mark.parametrize(("line", "label"), [
    (NCCL, None),
    ("\x1b[0m " + NCCL, None),  # Ray's colour reset
    ("[rank3]:" + NCCL, "3"),  # torchrun
    ("[default5]:" + NCCL, "5"),  # torchrun --tee / elastic
    ("[RANK 7]: " + NCCL, "7"),
    ("[trainer3]:" + NCCL, "3"),
    ("[trainer0|0]:" + NCCL, "0"),
    ("[1,4]<stdout>:" + NCCL, "4"),  # Open MPI --tag-output
    ("(pid=34272) " + NCCL, "34272"),  # Ray
    ("(pid=21780, ip=10.221.0.5) " + NCCL, "10.221.0.5"),
    ("(EngineCore_DP0 pid=1088) (RayWorkerWrapper pid=285, ip=192.168.177.12) " + NCCL,
     "192.168.177.12"),
    ("3: " + NCCL, "3"),  # srun -l
    ("MLVM2: " + NCCL, "MLVM2"),  # pdsh
    ("> " + NCCL, None),  # quoted in an issue
    ("[2025-06-06 09:52:01] " + NCCL, None),
    ("2024-11-28T07:42:11.525123456Z stdout F " + NCCL, None),  # CRI log file
    ("2024-11-28T07:42:11.525Z " + NCCL, None),  # kubectl logs --timestamps
    ("  | 2024-11-28T07:42:11.525Z | " + NCCL, None),  # CloudWatch columns
    ("bug_1  | " + NCCL, "bug_1"),  # docker compose
    ("stdout: " + NCCL, None),  # accelerate test
    ("[0] " + NCCL, "0"),  # mpirun-style tag before host:pid:tid
    ("pytorch " + NCCL, None),  # Kubeflow job label before host:pid:tid (NVIDIA/nccl#879)
    ("node3: [rank2]: [2025-01-01 10:00:00] " + NCCL, "2"),  # stacked
])
def test_prefixes_are_removed_and_the_label_kept(line: str, label: str | None) -> None:
    assert split_prefix(line) == (label, NCCL)


def test_lines_without_a_prefix_are_left_alone() -> None:
    for line in ("[3] include/shm.h:28 NCCL WARN Call to posix_fallocate failed",
                 "include/socket.h:344 WARN Socket creation failed",
                 "NCCL version 2.7.8+cuda11.1",
                 "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error",
                 "ncclInternalError: Internal check failed.",
                 "Failed to execute operation Connect from rank 0, retcode 2 [0] x"):
        assert split_prefix(line) == (None, line)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_splits_into_a_suffix_of_itself(text: str) -> None:
    label, rest = split_prefix(text)
    assert rest in text.replace("\x1b", "") or "\x1b" in text
    assert label is None or isinstance(label, str)


def test_long_hostile_lines_take_linear_time() -> None:
    """A bound, not a benchmark: 200 KB of prefix-like text splits in well under a second."""
    for unit in ("[1", "(pid=1 ", "a: ", "[2025-01-01 00:00:00", "x" * 50 + ":"):
        line = unit * (200_000 // len(unit))
        start = time.process_time()
        split_prefix(line)
        assert time.process_time() - start < 1.0, unit


def test_dotted_exception_names_stay_messages() -> None:
    for line in ("torch.OutOfMemoryError: CUDA out of memory.",
                 "torch.distributed.DistBackendError: NCCL error in: x",
                 "[rank1]: torch.OutOfMemoryError: CUDA out of memory."):
        label, rest = split_prefix(line)
        assert rest.endswith(line.split("]: ")[-1]), (line, label, rest)
    assert split_prefix("node1.cluster: hello") == ("node1.cluster", "hello")
