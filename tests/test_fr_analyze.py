"""Pure analysis on synthetic dump sets in torch's documented format (no torch needed)."""

from __future__ import annotations

from pathlib import Path

import fr_synth as synth
import pytest

from mldebug.fr.analyze import analyze, call_site, is_torch_frame
from mldebug.fr.loader import load
from mldebug.fr.model import CallFrame


def run(tmp_path: Path, dumps: dict, frames: int = 2):
    synth.write(tmp_path, dumps)
    return analyze(load([tmp_path]), frames=frames)


def only(a, kind=None):
    assert len(a.mismatches) == 1, [m.to_dict() for m in a.mismatches]
    m = a.mismatches[0]
    if kind:
        assert m.kind == kind, m.to_dict()
    return m


def test_clean_job_has_no_mismatch(tmp_path):
    a = run(tmp_path, synth.spmd_job(8, 30))
    assert a.mismatches == [] and a.lagging == [] and a.missing_ranks == []
    assert a.timelines == 1 and a.ranks == list(range(8))


def test_extra_collective_is_a_type_mismatch_naming_the_minority(tmp_path):
    a = run(tmp_path, synth.spmd_job(4, 20, fault="extra", culprit=0, at=7))
    m = only(a, "type")
    # the extra all_reduce looks like the others' until the op types differ two steps later;
    # the call sites tell where it began
    assert (m.seq, m.culprit_ranks, m.pg, m.began_at) == (9, [0], "0", 7)
    assert "began there" in m.reasoning
    assert "minority" in m.reasoning
    assert a.to_dict()["mismatches"][0]["culprit_ranks"] == [0]


def test_extra_collective_of_another_type_points_at_its_call_site(tmp_path):
    dumps = synth.spmd_job(4, 6)
    ents = dumps[0]["entries"]
    ents.insert(3, synth.entry(4, "broadcast", frames=synth.user_frames("maybe_sync", 73)))
    for i, e in enumerate(ents[4:], start=5):
        e["collective_seq_id"] = i
    m = only(run(tmp_path, dumps), "type")
    assert (m.seq, m.culprit_ranks, m.began_at) == (4, [0], None)
    culprit_group = next(g for g in m.groups if g.ranks == [0])
    assert culprit_group.call_site == ["maybe_sync at /job/train.py:73", "main at /job/train.py:99"]


def test_two_rank_tie_is_broken_by_lookahead(tmp_path):
    a = run(tmp_path, synth.spmd_job(2, 10, fault="extra", culprit=1, at=4))
    m = only(a, "type")
    assert m.culprit_ranks == [1] and "extra call" in m.reasoning


def test_size_mismatch(tmp_path):
    a = run(tmp_path, synth.spmd_job(5, 20, fault="size", culprit=3, at=5))
    m = only(a, "size")
    assert (m.seq, m.culprit_ranks) == (5, [3])
    assert any("in=[[8]]" in g.description for g in m.groups)


def test_skipped_collective_names_the_rank_that_never_enqueued(tmp_path):
    a = run(tmp_path, synth.spmd_job(4, 12, fault="skip", culprit=2, at=9))
    m = only(a, "missing")
    assert (m.seq, m.culprit_ranks) == (9, [2]) and a.never_enqueued == [2]
    assert [lag.rank for lag in a.lagging] == [2] and a.lagging[0].behind_by == 4


def test_missing_dump_is_reported_and_blamed(tmp_path):
    dumps = synth.spmd_job(4, 6)
    del dumps[1]
    a = run(tmp_path, dumps)
    assert a.missing_ranks == [1]
    m = only(a, "missing")
    assert m.culprit_ranks == [1] and "no dump" in m.reasoning


def test_dtype_mismatch(tmp_path):
    dumps = {r: synth.dump(r, [synth.entry(1), synth.entry(2, dtype="Half" if r == 2 else "Float")],
                           world=3) for r in range(3)}
    m = only(run(tmp_path, dumps), "dtype")
    assert (m.seq, m.culprit_ranks) == (2, [2])


def test_all_gather_shape_rule(tmp_path):
    # every rank agrees, but the output is not group-size x the input: torch's syntax check
    dumps = {r: synth.dump(r, [synth.entry(1, "all_gather", sizes=((4,),), out_sizes=((8,),))],
                           world=4) for r in range(4)}
    m = only(run(tmp_path, dumps), "syntax")
    assert "group size 4" in m.reasoning and m.culprit_ranks == [0, 1, 2, 3]


def test_reduce_scatter_shape_rule_names_the_one_rank(tmp_path):
    def ent(r):
        out = (2,) if r == 1 else (4,)
        return synth.entry(1, "reduce_scatter", sizes=((16,),), out_sizes=(out,))
    dumps = {r: synth.dump(r, [ent(r)], world=4) for r in range(4)}
    m = only(run(tmp_path, dumps), "syntax")
    assert m.culprit_ranks == [1]


def test_all_to_all_total_numel(tmp_path):
    def ent(r):
        return synth.entry(1, "all_to_all", sizes=((4 + r,),), out_sizes=((4,),))
    dumps = {r: synth.dump(r, [ent(r)], world=3) for r in range(3)}
    m = only(run(tmp_path, dumps), "size")
    assert "total input numel 15 != total output numel 12" in m.reasoning
    ok = {r: synth.dump(r, [synth.entry(1, "all_to_all", sizes=((4 + r,),), out_sizes=((5,),))],
                        world=3) for r in range(3)}
    assert run(tmp_path / "ok", ok).mismatches == []


def test_subgroup_mismatch_is_reported_in_its_group_only(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("tp", [0, 1]), "2": ("tp", [2, 3])}
    dumps = {}
    for r in range(4):
        sub = ("1", "tp") if r < 2 else ("2", "tp")
        ents = [synth.entry(1, record_id=0),
                synth.entry(1, pg=sub, pg_id=int(sub[0]), record_id=1,
                            sizes=((6,),) if r == 3 else ((4,),)),
                synth.entry(2, record_id=2)]
        dumps[r] = synth.dump(r, ents, groups=groups)
    a = run(tmp_path, dumps)
    assert [(m.pg, m.kind, m.seq) for m in a.mismatches] == [("2", "size", 1)]
    m = a.mismatches[0]
    assert "no majority" in m.reasoning and m.culprit_ranks == [2, 3]
    assert {g.pg: g.ranks for g in a.groups} == {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3]}


def test_p2p_recv_without_send_names_the_rank_that_skipped_the_send(tmp_path):
    send = synth.p2p("send", 0, 1, 1)
    recv = synth.p2p("recv", 0, 1, 1)
    extra = synth.p2p("recv", 0, 1, 2, state="started")
    dumps = {0: synth.dump(0, [synth.entry(1), send], world=2),
             1: synth.dump(1, [synth.entry(1), recv, extra], world=2)}
    m = only(run(tmp_path, dumps), "p2p")
    assert m.culprit_ranks == [0]
    assert m.reasoning == ("rank 1 posted recv #2 from rank 0, which never posted the matching "
                           "send (it posted 1): rank 0 skipped a send, or rank 1 has an extra recv.")
    assert [g.ranks for g in m.groups][1:] == [[0]] and "(no matching send to 1)" in str(m.groups[1])


def test_coalesced_entries_compare_as_one_position(tmp_path):
    def ents(r):
        big = ((9,),) if r == 0 else ((4,),)
        return [synth.entry(1, record_id=0),
                synth.entry(2, record_id=1), synth.entry(2, record_id=2, sizes=big),
                synth.entry(2, "coalesced", record_id=3, sizes=(), out_sizes=())]
    a = run(tmp_path, {r: synth.dump(r, ents(r), world=3) for r in range(3)})
    m = only(a, "size")
    assert (m.seq, m.culprit_ranks) == (2, [0])


def test_p2p_missing_recv_and_size_mismatch(tmp_path):
    send = synth.p2p("send", 0, 1, 1)
    recv = synth.p2p("recv", 0, 1, 1)
    extra = synth.p2p("send", 0, 1, 2, state="started")
    dumps = {0: synth.dump(0, [synth.entry(1), send, extra], world=2),
             1: synth.dump(1, [synth.entry(1), recv], world=2)}
    m = only(run(tmp_path, dumps), "p2p")
    assert m.p2p and m.culprit_ranks == [1] and "never posted the matching recv" in m.reasoning
    bad = {0: synth.dump(0, [synth.p2p("send", 0, 1, 1, sizes=((8,),))], world=2),
           1: synth.dump(1, [synth.p2p("recv", 0, 1, 1)], world=2)}
    m = only(run(tmp_path / "b", bad), "p2p")
    assert m.culprit_ranks == [0, 1] and "disagree on size" in m.reasoning


def test_nccl_states_and_pg_status_give_lag_and_waiting(tmp_path):
    def ents(r):
        last = 5 if r != 1 else 3
        return [synth.entry(s, state="completed" if s < 3 else "started") for s in range(1, last + 1)]
    a = run(tmp_path, {r: synth.dump(r, ents(r), world=3) for r in range(3)})
    m = only(a, "missing")
    assert (m.seq, m.culprit_ranks) == (4, [1])
    assert [(lag.rank, lag.behind_by) for lag in a.lagging] == [(1, 2)]
    assert a.groups[0].waiting_in == {0: 3, 1: 3, 2: 3}


def test_old_format_2_3_without_dtypes_status_or_p2p_fields(tmp_path):
    dumps = {r: synth.dump(r, [synth.entry(s, version="2.3", sizes=((5,),) if (r, s) == (1, 2) else ((4,),))
                               for s in (1, 2)], world=3, version="2.3") for r in range(3)}
    assert "pg_status" not in dumps[0] and "input_dtypes" not in dumps[0]["entries"][0]
    m = only(run(tmp_path, dumps), "size")
    assert m.culprit_ranks == [1]


def test_gloo_dump_without_pg_config_uses_default_group(tmp_path):
    dumps = synth.spmd_job(3, 4, fault="skip", culprit=1, at=3, backend="gloo")
    for d in dumps.values():
        d["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}  # what gloo writes
        del d["rank"]
    a = run(tmp_path, dumps)
    assert a.groups[0].membership == "default group"
    assert only(a, "missing").culprit_ranks == [1]
    assert any("file name" in n for n in a.notes)


def test_ring_buffer_windows_are_aligned(tmp_path):
    dumps = synth.spmd_job(3, 20, fault="size", culprit=2, at=14)
    dumps[0]["entries"] = dumps[0]["entries"][5:]  # rank 0 kept fewer entries
    dumps[1]["entries"] = dumps[1]["entries"][2:]
    a = run(tmp_path, dumps)
    m = only(a, "size")
    assert (m.seq, m.culprit_ranks) == (14, [2])
    assert a.groups[0].compared_from == 6


def test_rank_without_entries_is_left_out_of_votes(tmp_path):
    dumps = synth.spmd_job(4, 5)
    dumps[3]["entries"] = []
    a = run(tmp_path, dumps)
    assert a.mismatches == [] and any("recorded no entries" in n for n in a.notes)


def test_call_site_strips_torch_frames_and_honours_n():
    e = load_one_entry()
    assert call_site(e, 1) == ["train_step at /job/train.py:10"]
    assert call_site(e, 0) == []
    assert is_torch_frame(CallFrame("x", "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", 1))
    assert not is_torch_frame(CallFrame("x", "/home/me/torchtitan/train.py", 1))


def load_one_entry():
    from mldebug.fr.loader import _entry

    return _entry(synth.entry(1))


def test_empty_collective_coalesced_group_on_one_rank_is_a_mismatch(tmp_path):
    """Rule (docs/fr.md, coalesced groups): a collective coalesced group must hold the same ops
    on every rank. A gloo run of that case (rank 0 coalesces two all_reduces, rank 1 none)
    aborts rank 1 with 'Received data size doesn't match expected size': it is a mismatch,
    although torchfrtrace only logs 'Rank 1 has an empty op list' and goes on."""
    dumps = synth.spmd_job(3, 4)
    for r, d in dumps.items():
        inner = [] if r == 1 else [synth.entry(3, record_id=10 + k) for k in range(2)]
        d["entries"].insert(2, synth.entry(3, "coalesced", sizes=(), record_id=12))
        d["entries"][2:2] = inner
        for e in d["entries"][3 + len(inner):]:
            e["collective_seq_id"] += 1
    m = only(run(tmp_path, dumps), "type")
    assert (m.seq, m.culprit_ranks) == (3, [1])


def test_empty_p2p_batch_on_a_rank_without_peers_is_not_a_mismatch(tmp_path):
    """batch_isend_irecv: a rank with no send or recv in a round records nothing for it."""
    p2p0 = [synth.p2p("send", 0, 2, 1, state="completed")]
    p2p2 = [synth.p2p("recv", 0, 2, 1, state="completed")]
    dumps = {r: synth.dump(r, [synth.entry(1)] + extra, world=3)
             for r, extra in ((0, p2p0), (1, []), (2, p2p2))}
    a = run(tmp_path, dumps)
    assert a.mismatches == []


@pytest.mark.parametrize(("fault", "culprits", "kind"), [
    ("size", [25, 26], "p2p"), ("skip", [25], "p2p"), ("collective", [25], "size")])
def test_pipeline_stages_each_with_its_own_timeline(tmp_path, fault, culprits, kind):
    """Every rank records a different timeline (a pipeline job): loaded by the worker pool
    and in one process alike, each timeline kept once as columns, and the fault named."""
    from mldebug.fr.analyze import _per_timeline, _Pg
    from mldebug.fr.loader import load_files

    ranks = 72  # 64 files or more: the worker pool's path
    files = synth.write(tmp_path, {r: synth.pipeline_rank(ranks, 120, r, culprit=25, fault=fault)
                                   for r in range(ranks)})
    serial, pooled = load_files(files, workers=1), load_files(files, workers=2)
    a, b = analyze(serial), analyze(pooled)
    assert a.to_dict() == b.to_dict()
    assert a.timelines == ranks and a.culprits == culprits, a.mismatches
    assert a.mismatches[0].kind == kind
    # the stages agree on the all_reduces of the default group: compared once per call site
    # variant (7), not once per rank
    merged = _per_timeline(serial, _Pg("0", "default_pg", 0, list(range(ranks)), "pg_config"),
                           set())
    assert len(merged) == (8 if fault == "collective" else 7)
    assert sum(len(rs) for rs, _ in merged) == ranks
    # entries are built on demand, equal to what the dump says
    from mldebug.fr.loader import _entry

    raw = synth.pipeline_rank(ranks, 120, 3, culprit=25, fault=fault)["entries"]
    got = serial.entries_of(3)
    assert len(got) == 120 and list(got) == [_entry(x) for x in raw]
    assert got[-1].frames[2].line == 30 + 3 % 7 and got[-2:] == [_entry(x) for x in raw[-2:]]


def _late_job(missing: range = range(0), shift_ns: int | None = 0) -> dict:
    """6 ranks x 30 all_reduces; rank 3 enqueues each 20 ms after the others (who differ by
    up to 50 us); ranks 3-5 are on host b, whose clock is ``shift_ns`` ahead (None: all on
    one host); rank 5 did not record the collectives in ``missing``."""
    dumps = {}
    for r in range(6):
        entries = []
        for seq in range(1, 31):
            if r == 5 and seq in missing:
                continue
            e = synth.entry(seq)
            e["time_created_ns"] = (1_700_000_000_000_000_000 + seq * 100_000_000
                                    + (20_000_000 if r == 3 else (r * 7919 * seq) % 50_000)
                                    + (shift_ns or 0 if r >= 3 else 0))
            entries.append(e)
        d = synth.dump(r, entries, world=6)
        d["mldebug"] = {"host": "b" if r >= 3 and shift_ns is not None else "a"}
        dumps[r] = d
    return dumps


@pytest.mark.parametrize("missing,shift_ns", [(range(0), 0), (range(10, 13), 0),
                                              (range(0), 5_000_000_000),
                                              (range(28, 31), 5_000_000_000),
                                              (range(0), None), (range(1, 4), None)])
def test_the_late_rank_is_named_whatever_the_others_recorded(tmp_path, missing, shift_ns):
    """The straggler statistics compare the collectives every member recorded: all of them,
    or (one rank missing some) only the common ones; a host's shifted clock is aligned."""
    from mldebug.fr.stragglers import arrival_times

    ds = load(synth.write(tmp_path, _late_job(missing, shift_ns)))
    m = arrival_times(ds)["0"]
    assert m.seqs == [s for s in range(1, 31) if s not in missing]
    for r, times in zip(m.ranks, m.times, strict=True):
        created = dict(zip(ds.timelines[ds.dumps[r].timeline].seq, ds.dumps[r].created,
                           strict=True))
        assert list(times) == [created[s] for s in m.seqs]
    a = analyze(ds)
    assert [s.rank for s in a.stragglers] == [3]
    assert a.stragglers[0].times_last == len(m.seqs)
    assert 19.9 < a.stragglers[0].late_ms_median < 20.1
    assert a.straggler_window == len(m.seqs)


def test_watch_a_running_jobs_slowest_rank_one_collective_short_is_not_a_skip(tmp_path):
    """Issue #44: `fr watch` on a healthy job with one slow rank headlined 'ERROR not every
    rank enqueued the collective ... they skipped it or are stuck': the second dumps caught
    rank 1 one collective short of the others. When that rank issued collectives past the
    first dumps' last one (``since``) it is the dump's cut through a running job: no mismatch,
    no culprit, a note. A rank that stood still between the dumps keeps its mismatch."""
    from mldebug.fr.loader import load_files

    files = synth.write(tmp_path, synth.spmd_job(4, 60, fault="skip", culprit=1, at=60))
    running = analyze(load_files(files), since={"0": 40})
    assert running.mismatches == [] and running.lagging == [] and running.culprits == []
    assert any("had not yet reached collective #60" in n and "rank(s) 1" in n
               for n in running.notes), running.notes
    assert not [f for f in running.findings if f.severity.name == "ERROR"]
    stuck = analyze(load_files(files), since={"0": 60})  # rank 1 was at #59 in the first too
    assert stuck.culprits == [1] and stuck.mismatches[0].kind == "missing"
    far = synth.write(tmp_path / "far", synth.spmd_job(4, 60, fault="skip", culprit=1, at=30))
    assert analyze(load_files(far), since={"0": 20}).culprits == [1]  # 30 behind: not a cut
    assert analyze(load_files(files)).culprits == [1]  # fr analyze (no since): as before


def _phase_job(kind: str, world: int = 4, late: int = 2, n: int = 30,
               per_step: int = 1) -> dict:
    """Issue #44: ranks whose start/complete times say why one is late. Every step: host work
    (10 ms), then ``per_step`` all_reduces (2 ms communication each). ``kind``: "compute" -
    rank ``late`` works 30 ms longer before the step's first all_reduce (the others wait in
    it); "comm" - its all_reduces take 30 ms longer (its next enqueue is late by that);
    "missing" - compute, with no start/complete times (older torch); "even" - nobody is
    late; "first" - compute, with three all_reduces of different sizes per step."""
    base = 1_700_000_000_000_000_000
    ms = 1_000_000
    dumps = {}
    for r in range(world):
        entries = []
        t = base + r * 7919  # each rank's own small jitter
        for seq in range(1, n + 1):
            first = (seq - 1) % per_step == 0
            slow = r == late and kind in ("compute", "missing", "first")
            t += (10 * ms if first else ms // 2) + (30 * ms if slow and first else 0)
            e = synth.entry(seq, sizes=((4 + (seq - 1) % per_step,),))
            created = t
            # everyone's collective completes once the late rank arrived (the others wait)
            start = created
            if kind in ("compute", "missing", "first") and r != late and first:
                done = created + 30 * ms + 2 * ms
            elif kind == "comm" and r == late:
                done = created + 32 * ms
            elif kind == "comm":
                done = created + 2 * ms + (30 * ms if seq > 1 else 0)  # waiting for it
            else:
                done = created + 2 * ms
            e["time_created_ns"] = created
            e["time_discovered_started_ns"] = None if kind == "missing" else start
            e["time_discovered_completed_ns"] = None if kind == "missing" else done
            entries.append(e)
            t = done
        dumps[r] = synth.dump(r, entries, world=world)
    return dumps


def test_straggler_phase_compute_host_gap(tmp_path):
    a = run(tmp_path, _phase_job("compute"))
    assert [s.rank for s in a.stragglers] == [2]
    st = a.stragglers[0]
    assert st.phase.startswith("compute or data"), st
    assert st.host_gap_ms > st.host_gap_ms_others + 20
    f = next(f for f in a.findings if f.code == "fr-straggler")
    assert f.severity.name == "WARNING"  # a healthy but slow rank is never an error
    assert "compute or data" in f.title
    assert "the step would be about" in f.detail and "wait about" in f.detail
    d = st.to_dict()
    assert d["phase"] == st.phase and d["host_gap_ms"] is not None and d["position"] is None


def test_straggler_phase_communication(tmp_path):
    a = run(tmp_path, _phase_job("comm"))
    assert [s.rank for s in a.stragglers] == [2]
    st = a.stragglers[0]
    assert st.phase.startswith("communication"), st
    # the others' communication includes waiting for it; its own is as long without waiting
    assert st.comm_ms >= st.comm_ms_others - 1 and abs(st.host_gap_ms - st.host_gap_ms_others) < 5


def test_straggler_phase_times_missing(tmp_path):
    a = run(tmp_path, _phase_job("missing"))
    assert [s.rank for s in a.stragglers] == [2]
    st = a.stragglers[0]
    assert "cannot tell" in st.phase and st.host_gap_ms is None and st.comm_ms is None
    assert not [f for f in a.findings if f.severity.name == "ERROR"]


def test_even_job_names_no_straggler(tmp_path):
    a = run(tmp_path, _phase_job("even"))
    assert a.stragglers == [] and a.straggler_window == 30


def test_late_at_one_of_three_collectives_per_step_is_named(tmp_path):
    """Late only at the step's first all_reduce of three: last at a third of the collectives,
    under the share of all; the per-position rule (op, sizes, call site) names it there."""
    a = run(tmp_path, _phase_job("first", n=60, per_step=3))
    assert [s.rank for s in a.stragglers] == [2]
    st = a.stragglers[0]
    assert st.position == "all_reduce[4] in group 0" and st.collectives == 20
    assert st.late_ms_median > 25 and st.phase.startswith("compute or data"), st
    f = next(f for f in a.findings if f.code == "fr-straggler")
    assert "all_reduce[4] in group 0" in f.title and f.severity.name == "WARNING"
