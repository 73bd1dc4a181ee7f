"""Property tests for the parsers of outside data that had none yet: host lists and hostfiles,
pasted py-spy text, hang node documents, memory snapshots. Each input either parses or is
refused with mldebug's own error, within a time bound - never a traceback, never a hang.
(NCCL logs: test_nccl_log_input.py; flight-recorder dumps: test_fr_hostile.py; job logs:
test_log.py; env node documents: test_env_report.py.)"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mldebug.errors import MldebugError

FIX = Path(__file__).parent / "fixtures"
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

_HOST_PIECES = ["node", "gpu", "[", "]", "-", ",", "1", "07", "0-3", "99999999", "a.b", "_",
                " ", ":", "slots=8", "#", "\n", "x" * 300, "[0-99999999]", "[1-3,5]", "\udcff",
                "9" * 5000, "-rf", "$(id)", ";", "'"]
_hosty = st.lists(st.sampled_from(_HOST_PIECES) | st.text(max_size=8), max_size=12).map("".join)


@SETTINGS
@given(_hosty)
def test_host_lists_parse_or_are_refused(text: str) -> None:
    from mldebug.hosts import expand

    t = time.monotonic()
    try:
        hosts = expand(text)
    except MldebugError:
        return
    finally:
        assert time.monotonic() - t < 2.0
    assert hosts and all(h and not h.startswith("-") and " " not in h for h in hosts)
    assert len(hosts) <= 1_000_000


@SETTINGS
@given(st.lists(_hosty, max_size=20).map("\n".join))
def test_hostfiles_parse_or_are_refused(text: str) -> None:
    from mldebug.hosts import parse_hostfile

    t = time.monotonic()
    try:
        parse_hostfile(text)
    except MldebugError:
        pass
    assert time.monotonic() - t < 2.0


_PYSPY_PIECES = [
    "Process 4123: python train.py --x 1", "Python v3.11.7 (/usr/bin/python3.11)",
    'Thread 4123 (idle): "MainThread"', 'Thread 0x7F00AB (active+gil): "MainThread"',
    'Thread 0x1 (active): "pt_autograd_0"', "    all_reduce (torch/distributed/distributed_c10d.py:2050)",
    "    main (train.py:88)", "        Arguments:", "            step: 3", "        Locals:",
    "node3: ", "node3: Thread 12 (idle): \"MainThread\"", "Process " + "9" * 5000 + ": x",
    "Thread " + "9" * 5000 + " (idle): \"MainThread\"", "    f (" + "a" * 3000 + ":1)",
    "    g (x.py:" + "1" * 5000 + ")", "", "\t", "(", ")", ":",
]


@SETTINGS
@given(st.lists(st.sampled_from(_PYSPY_PIECES) | st.text(max_size=30), max_size=40))
def test_pasted_pyspy_text_parses_or_is_refused(lines: list[str]) -> None:
    from mldebug.hang.analyze import analyze
    from mldebug.hang.model import Collection
    from mldebug.hang.pyspy import parse_text_dump

    t = time.monotonic()
    try:
        procs = parse_text_dump("\n".join(lines))
    except MldebugError:
        return
    analyze(Collection(processes=procs)).to_dict()
    assert time.monotonic() - t < 3.0


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["host", "processes", "pid", "dump", "identity", "rank", "errors",
                         "error", "cmdline", "job", "workers", "frames", "thread_id", "name",
                         "filename", "line", "x"]), children, max_size=5),
    max_leaves=30)


@SETTINGS
@given(_json)
def test_hang_node_documents_never_cost_the_report(doc: object) -> None:
    """A node that answers anything at all becomes that node's error, or its processes."""
    from mldebug.fanout import NodeResult
    from mldebug.hang.analyze import analyze
    from mldebug.hang.collect import collection_from_results

    good = NodeResult("good", data={"host": "good", "processes": []})
    coll = collection_from_results([NodeResult("bad", data=doc), good])  # type: ignore[arg-type]
    analyze(coll).to_dict()


@SETTINGS
@given(st.binary(max_size=2000) | _json.map(lambda d: pickle.dumps(d, protocol=4))
       | _json.map(lambda d: json.dumps(d).encode()))
def test_memory_snapshots_load_or_are_refused(tmp_path: Path, data: bytes) -> None:
    from mldebug.memory.snapshot import load

    p = tmp_path / "snap.pickle"
    p.write_bytes(data)
    t = time.monotonic()
    try:
        load(p)
    except MldebugError:
        pass
    assert time.monotonic() - t < 2.0


def test_a_code_running_snapshot_pickle_is_refused(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (print, ("pwned",))

    p = tmp_path / "evil.pickle"
    p.write_bytes(pickle.dumps({"segments": [Evil()]}))
    from mldebug.memory.snapshot import load

    with pytest.raises(MldebugError, match="refused"):
        load(p)
