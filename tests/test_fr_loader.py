"""Loading dumps safely: restricted unpickler, bad files named and skipped, ranks and dedupe."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import fr_synth as synth
import pytest

from mldebug.fr.analyze import analyze
from mldebug.fr.loader import load
from mldebug.safeload import UnsafePickle, safe_loads


class _RunsCode:
    def __reduce__(self):
        return (Path.touch, (Path(self.target),))  # type: ignore[attr-defined]


def test_pickle_that_would_run_code_is_refused_and_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    evil = _RunsCode()
    evil.target = str(marker)  # type: ignore[attr-defined]
    data = pickle.dumps({"version": "2.10", "entries": [], "x": evil})
    with pytest.raises(UnsafePickle, match="touch"):
        safe_loads(data)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "fr_rank0").write_bytes(data)
    synth.write(tmp_path / "d", {1: synth.dump(1, [synth.entry(1)], world=2)})
    ds = load([tmp_path / "d"])
    assert not marker.exists()
    assert list(ds.dumps) == [1]
    (problem,) = ds.problems
    assert problem.file.endswith("fr_rank0") and "refused" in problem.error
    assert "may run code" in problem.error


def test_os_system_global_is_refused():
    data = b"cos\nsystem\n(S'echo hacked'\ntR."
    with pytest.raises(UnsafePickle, match="os.system"):
        safe_loads(data)


def test_sets_and_plain_containers_load():
    doc = {"version": "2.10", "entries": [], "s": {1, 2}, "t": (1, "a"), "f": 1.5, "n": None}
    for proto in (2, 4, 5):
        assert safe_loads(pickle.dumps(doc, protocol=proto)) == doc


def test_truncated_empty_and_foreign_files_are_named_and_skipped(tmp_path):
    good = synth.spmd_job(4, 10, fault="size", culprit=1, at=5)
    synth.write(tmp_path, good)
    data = (tmp_path / "rank_2").read_bytes()
    (tmp_path / "rank_2").write_bytes(data[: len(data) // 2])
    (tmp_path / "rank_7").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "rank_9.json").write_text(json.dumps({"no": "entries"}))
    ds = load([tmp_path])
    errors = {Path(p.file).name: p.error for p in ds.problems}
    assert "truncated or corrupt" in errors["rank_2"]
    assert "empty file" in errors["rank_7"]
    assert "notes.txt" in errors and "rank_9.json" in errors
    a = analyze(ds)
    assert a.missing_ranks == [2]
    assert a.mismatches[0].culprit_ranks == [1]  # the rest still analysed


def test_rank_from_content_beats_file_name_and_duplicates_are_reported(tmp_path):
    d0 = synth.dump(0, [synth.entry(1)], world=2)
    d1 = synth.dump(1, [synth.entry(1)], world=2)
    (tmp_path / "whatever_5").write_bytes(pickle.dumps(d0))
    (tmp_path / "copy_of_rank_0").write_bytes(pickle.dumps(d0))
    (tmp_path / "x").write_bytes(pickle.dumps(d1))
    ds = load([tmp_path])
    assert sorted(ds.dumps) == [0, 1]
    assert [Path(f).name for f in ds.duplicates[0]] == ["copy_of_rank_0", "whatever_5"]


def test_no_rank_anywhere_is_a_named_problem(tmp_path):
    d = synth.dump(0, [synth.entry(1)], world=1, with_rank=False)
    (tmp_path / "dump").write_bytes(pickle.dumps(d))
    ds = load([tmp_path / "dump"])
    assert not ds.dumps and "ends in no number" in ds.problems[0].error


def test_json_dumps_load(tmp_path):
    d = synth.dump(0, [synth.entry(1)], world=1)
    (tmp_path / "fr_0.json").write_text(json.dumps(d))
    ds = load([tmp_path])
    assert list(ds.dumps) == [0] and ds.entries_of(0)[0].op == "all_reduce"


def test_identical_timelines_are_stored_once(tmp_path):
    synth.write(tmp_path, synth.spmd_job(16, 50, fault="size", culprit=5, at=20))
    ds = load([tmp_path])
    assert len(ds.timelines) == 2
    assert sorted(len(t.ranks) for t in ds.timelines) == [1, 15]


def test_worker_processes_give_the_same_result(tmp_path):
    from mldebug.fr.loader import expand_inputs, load_files

    synth.write(tmp_path, synth.spmd_job(12, 40, fault="extra", culprit=4, at=30))
    (tmp_path / "rank_99").write_bytes(b"")
    files = expand_inputs([tmp_path])
    serial, parallel = load_files(files, workers=1), load_files(files, workers=2)
    assert sorted(serial.dumps) == sorted(parallel.dumps) == list(range(12))
    assert [sorted(t.ranks) for t in serial.timelines] == [sorted(t.ranks) for t in parallel.timelines]
    assert [p.file for p in serial.problems] == [p.file for p in parallel.problems]
    assert analyze(parallel).to_dict() == analyze(serial).to_dict()


@pytest.mark.parametrize("column,values", [
    ("time_discovered_started_ns", [5, None, 7]),          # not started yet: "not recorded"
    ("time_discovered_started_ns", [None, None, None]),    # timing off
    ("timeout_ms", [None, True, 600000]),                  # a bool is not a number
    ("time_created_ns", [None, 0, 12]),                    # a stamp of 0 is unknown (-1)
    ("time_created_ns", [None, -5, 12]),
    ("p2p_seq_id", [None, 0, 3]),
    ("record_id", [None, 1 << 62, 3]),                     # out of range: refused
    ("collective_seq_id", [None, "7", 3]),                 # a string: refused
    ("timeout_ms", [None, 2.0, 3]),
    ("record_id", [1, 2, 3]),
    ("time_created_ns", [10, 11, 12]),
    ("time_created_ns", [0, 11, 12]),
    ("timeout_ms", [True, 1, 2]),
    ("record_id", [-2, 1, 2]),
    ("record_id", [None, 1 << 63, 3]),                     # past int64: refused
    ("time_created_ns", [1 << 64, 11, 12]),                # past int64: unknown (-1)
    ("timeout_ms", [-(1 << 63), 1, 2]),                    # int64's least, out of range
    ("time_discovered_completed_ns", [None, None, 9]),
    ("p2p_seq_id", [False, 0, 3]),
])
def test_number_columns_read_at_c_speed_equal_the_entry_by_entry_reading(column, values):
    """The loader reads a whole column at once where it can; on every value mix it must give
    what converting each entry on its own gives (or refuse the file the same way)."""
    from mldebug.fr import loader

    doc = synth.spmd_rank(4, 3, 1, fault="size", culprit=2, at=1)
    raw = doc["entries"]
    for e, v in zip(raw, values, strict=True):
        e[column] = v
    key, conv = next((k, c) for k, c in loader._NUMBERS if k == column)

    def one_by_one():
        return list(loader.array("q", [conv(e) for e in raw]))

    try:
        expected = one_by_one()
    except loader.BadDump as e:
        with pytest.raises(loader.BadDump, match=str(e)[:20]):
            loader._column(raw, key, conv)
        return
    fields = loader._number_fields(raw)
    k = [k for k, _ in loader._NUMBERS].index(column)
    assert list(loader._number_column(fields, raw, k)) == expected
    assert list(loader._column(raw, key, conv)) == expected


def test_ordered_dicts_load_as_dicts_and_cannot_hide_deep_tuples():
    """OrderedDict (an allowed global) is built as a plain dict, so the nesting check after a
    large-stack decode sees only built-in types; a deep tuple under one is still refused."""
    from collections import OrderedDict

    from mldebug.safeload import DeepNesting

    doc = safe_loads(pickle.dumps(OrderedDict(b=1, a=(2, (3,))), protocol=2))
    assert type(doc) is dict and list(doc.items()) == [("b", 1), ("a", (2, (3,)))]
    deep = b"\x80\x02ccollections\nOrderedDict\n)R)" + b"\x85" * 30_000 + b"K\x01s."
    with pytest.raises(DeepNesting, match="nested over 2,000 deep"):
        safe_loads(deep)
    assert safe_loads(b"  \n " + json.dumps({"entries": []}).encode()) == {"entries": []}


RAW_GLOO = Path(__file__).parent / "fixtures" / "fr" / "raw_gloo" / "fr_rank0"


def test_torchs_own_protocol_2_bytes_decode_like_pickle_loads_and_load():
    """torch's C++ pickler writes protocol 2 without frames; the restricted decoder reads
    it through a buffer and builds exactly what pickle.loads builds (this file is ours)."""
    from mldebug.safeload import decode

    data = RAW_GLOO.read_bytes()
    assert data[:2] == b"\x80\x02" and b"\x95" not in data[:3]  # no FRAME opcode
    assert decode(data) == pickle.loads(data)
    ds = load([RAW_GLOO])
    assert not ds.problems and list(ds.dumps) == [0]
    tl = ds.timelines[0]
    assert len(tl) == 300 and {tl.statics[s].op for s in tl.sid} == {"all_reduce"}
    assert list(tl.seq) == list(range(1, 301))


def test_a_protocol_2_pickle_that_names_a_global_is_still_refused(tmp_path):
    p = tmp_path / "fr_rank0"
    p.write_bytes(pickle.dumps({"entries": [{"x": Path("/")}]}, protocol=2))
    with pytest.raises(UnsafePickle):
        safe_loads(p.read_bytes())
    ds = load([p])
    assert not ds.dumps and "refused" in ds.problems[0].error


def test_getters_spelled_with_the_dumps_own_keys_read_what_the_constants_read():
    """The per-dump getters (the first entry's own key objects) are lookups by equality: on
    entries whose first dict lacks fields, has keys of other types, or differs from the
    rest, they read the same tuples as the module's getters, or fail the same way."""
    from mldebug.fr import loader

    doc = synth.spmd_rank(4, 6, 1, fault="size", culprit=2, at=3)
    raw = pickle.loads(pickle.dumps(doc["entries"], protocol=2))
    cases = [raw, [{7: "x", ("t",): 1, **raw[0]}, *raw[1:]],
             [{k: v for k, v in raw[0].items() if k != "frames"}, *raw[1:]], []]
    for entries in cases:
        static_key, row = loader._getters(entries)
        for got, want in ((static_key, loader._static_key), (row, loader._NUMBER_ROW)):
            for e in entries:
                try:
                    expected = want(e)
                except KeyError:
                    with pytest.raises(KeyError):
                        got(e)
                    continue
                assert got(e) == expected


@pytest.mark.parametrize("idx", [[], [2], [0, 2, 2, 1]])
def test_pick_reads_a_column_at_any_number_of_indices(idx):
    from array import array

    from mldebug.fr.model import pick

    col = array("i", [10, 11, 12])
    assert pick(col, array("i", idx)) == tuple(col[i] for i in idx)
    assert pick({0: "a", 1: "b", 2: "c"}, idx) == tuple("abc"[i] for i in idx)


@pytest.mark.parametrize("claim", [20 << 30, 1 << 40, 1 << 62])
def test_a_string_length_claim_past_the_files_end_is_a_named_problem(tmp_path, claim):
    """A 14-byte pickle that claims a string of 20 GiB or more: read through the buffered
    reader, it fails at once as truncated or corrupt, and nothing that size is touched."""
    import resource
    import struct

    p = tmp_path / "fr_rank0"
    p.write_bytes(b"\x80\x04\x8d" + struct.pack("<Q", claim) + b"abc")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ds = load([p])
    assert not ds.dumps and "truncated or corrupt" in ds.problems[0].error
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB


@pytest.mark.parametrize("values", [[], [0], [5, -1, 2], [(1 << 31) - 1, -(1 << 31)]])
def test_packed_builds_what_array_builds(values):
    from array import array

    from mldebug.fr.model import packed

    for code in "iq":
        assert packed(code, values) == array(code, values)
        assert packed(code, tuple(values)).typecode == code


@pytest.mark.parametrize("code,value", [("i", 1 << 31), ("i", -(1 << 31) - 1), ("q", 1 << 63),
                                        ("q", None), ("q", 1.0)])
def test_packed_refuses_what_does_not_fit(code, value):
    import struct

    from mldebug.fr.model import packed

    with pytest.raises(struct.error):
        packed(code, [1, value])


@pytest.mark.parametrize("seqs", [
    [3, 1, 2, 7, 5],          # one entry per sequence number, posted out of order
    [1, 1, 2, 4, 4, 4, 6],    # coalesced: several entries share a number
    [9],
    [],
])
def test_group_index_sorts_collectives_and_groups_coalesced_entries(seqs):
    """Each group's collectives by sequence number (coalesced ones together, in the order
    posted) and its sends and receives by peer, against a plain reading of the entries."""
    from array import array

    from mldebug.fr import loader

    raw = [synth.entry(s, "all_reduce", pg=("0", "default_pg")) for s in seqs]
    raw += [synth.p2p("send", 0, 1, 1), synth.p2p("recv", 0, 2, 1, pg=("1", "pp")),
            synth.p2p("send", 0, 1, 2)]
    doc = synth.dump(0, raw, world=3)
    ds = loader.from_docs([("fr_rank0", doc)])
    tl = ds.timelines[0]
    got = loader._group_index([ds.statics[i] for i in range(len(ds.statics))], tl.sid, tl.seq)
    coll = sorted((s, i) for i, s in enumerate(seqs))  # stable in the order posted
    gi = got["0"]
    assert list(gi.order) == [i for _, i in coll]
    distinct = sorted(set(seqs))
    assert list(gi.seqs) == distinct
    assert [list(gi.order[gi.starts[k]:gi.starts[k + 1]]) for k in range(len(distinct))] == [
        [i for s, i in coll if s == want] for want in distinct]
    assert gi.p2p == {(True, 1): array("i", [len(seqs), len(seqs) + 2])}
    assert got["1"].p2p == {(False, 0): array("i", [len(seqs) + 1])} and not got["1"].seqs


def test_a_recorders_directory_gives_its_newest_triggers_dumps(tmp_path, capsys):
    """`fr analyze $MLDEBUG_FR_DIR`: nothing failed, so no dump at the top; the dumps of the
    newest trigger (triggered/<token>/) are read and said so - not "no files"; a link
    among the trigger folders is never followed; dumps at the top (a failure) come first."""
    import os

    from mldebug.fr.loader import expand_inputs

    d = tmp_path / "fr"
    old, new = d / "triggered" / "1-a", d / "triggered" / "2-b"
    for folder, ranks in ((old, [0]), (new, [0, 1])):
        folder.mkdir(parents=True)
        for r in ranks:
            (folder / f"fr_rank{r}").write_bytes(b"x")
    os.utime(old, (1, 1))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "fr_rank9").write_bytes(b"x")
    (d / "triggered" / "3-c").symlink_to(elsewhere)
    os.utime(d / "triggered" / "3-c", (2**31, 2**31), follow_symlinks=False)
    (d / ".mldebug-fr-h-1.json").write_text("{}")
    notes: list[str] = []
    assert [p.name for p in expand_inputs([d], notes)] == ["fr_rank0", "fr_rank1"]
    assert expand_inputs([d])[0].parent == new and "its newest trigger" in notes[0]
    (d / "fr_rank3").write_bytes(b"x")  # a failure dump at the top: that is what is read
    assert [p.name for p in expand_inputs([d])] == ["fr_rank3"]
