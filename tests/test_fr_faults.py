"""fr analyze on real dumps from the fault matrix (benchmarks/faults/job.py, torch 2.13 gloo,
4 ranks; tests/fixtures/fr/faults/README.md names each case and its injected culprit)."""

from __future__ import annotations

from pathlib import Path

from mldebug.fr.analyze import analyze
from mldebug.fr.loader import load

FIX = Path(__file__).parent / "fixtures" / "fr" / "faults"


def run(case: str):
    return analyze(load([FIX / case]))


def verdict_class(a) -> str:
    """The class the matrix's fr route reads from --json (benchmarks/faults/runner.route_fr)."""
    kinds = {m.kind for m in a.mismatches}
    if a.never_enqueued and kinds <= {"missing"}:
        return "outside"
    if kinds:
        return "desync"
    return "outside" if a.lagging else "healthy"


def test_subgroup_skip_names_the_rank_that_skipped_its_pair_collective():
    # rank 3 skipped group 2's all_reduce #4 and waits in the world's #4; its partner rank 2
    # waits alone in group 2's #4 and so never reaches the world's #4
    a = run("subgroup_skip")
    assert a.culprits == [3]
    assert verdict_class(a) == "desync"
    world = next(m for m in a.mismatches if m.pg == "0")
    pair = next(m for m in a.mismatches if m.pg == "2")
    assert world.kind == "missing" and world.culprit_ranks == [] and world.blocked_elsewhere == [2]
    assert "wait in group 2 #4" in world.reasoning
    assert pair.kind == "skipped" and pair.culprit_ranks == [3]
    assert "skipped #4 of this group: their latest collective is group 0 #4" in pair.reasoning
    assert a.never_enqueued == []
    d = a.to_dict()
    assert d["mismatches"][0]["blocked_elsewhere"] == [2]
    assert any(f.code == "fr-skipped" for f in a.findings)


def test_a_rank_stuck_outside_any_collective_stays_missing():
    # thread_lock: rank 2 waits for a lock another of its threads holds; the others wait in #10
    a = run("thread_lock")
    assert a.culprits == [2] and a.never_enqueued == [2]
    assert verdict_class(a) == "outside"
    (m,) = a.mismatches
    assert m.kind == "missing" and m.blocked_elsewhere == []


def test_p2p_wrong_peer_names_the_sender_from_where_each_rank_waits():
    # stage 0 sends to stage 2 instead of 1; gloo records no send/recv, but each dump says
    # where its main thread waited: 0 in send to 2, 1 in recv from 0, 2 from 1, 3 from 2
    a = run("p2p_wrong_peer")
    assert [(r, a_.op, a_.peer) for r, a_ in
            ((r, load([FIX / "p2p_wrong_peer"]).dumps[r].blocked_in) for r in range(4))] == [
        (0, "send", 2), (1, "recv", 0), (2, "recv", 1), (3, "recv", 2)]
    (m,) = a.mismatches
    assert m.kind == "p2p" and m.p2p and m.culprit_ranks == [0]
    assert "rank 0 is blocked sending to rank 2" in m.reasoning
    assert "rank(s) 1 wait to receive from rank 0" in m.reasoning
    assert a.culprits == [0] and verdict_class(a) == "desync"
    # gloo's pg_status counts its sends and receives: stages 1-2 (which do both) are not
    # "ahead" of stages 0 and 3 in the collectives
    assert a.lagging == []


def test_wrong_broadcast_src_is_a_root_disagreement_and_a_tie_says_so():
    # rank 2 broadcasts from itself where the others pass 0: ranks 0 and 2 each act as the
    # root and stay in the broadcast; 1 and 3 completed it. Nothing in the dumps says which
    # root ranks 1 and 3 passed, so it is a tie between 0 and 2, and the report says so
    a = run("wrong_broadcast_src")
    (m,) = a.mismatches
    assert m.kind == "root" and m.culprit_ranks == [0, 2]
    assert [(g.ranks, g.description) for g in m.groups] == [
        ([0], "broadcast with root 0"), ([2], "broadcast with root 2")]
    assert "cannot be told from these dumps" in m.reasoning
    assert "What would tell" in m.reasoning
    assert verdict_class(a) == "desync"


def test_root_majority_names_the_rank_with_the_odd_root(tmp_path):
    # the same dumps with a third rank blocked in the broadcast passing root 0: 2 against 1
    import pickle

    for r in range(4):
        doc = pickle.loads((FIX / "wrong_broadcast_src" / f"fr_rank{r}").read_bytes())
        if r == 3:
            doc["entries"] = doc["entries"][:-1]  # never enqueued #12 either
            doc["mldebug"]["blocked_in"] = dict(doc["mldebug"]["blocked_in"], op="broadcast",
                                                peer=0)
            doc["pg_status"]["0"]["last_enqueued_collective"] = 11
        (tmp_path / f"fr_rank{r}").write_bytes(pickle.dumps(doc))
    a = analyze(load([tmp_path]))
    (m,) = a.mismatches
    assert m.kind == "root" and m.culprit_ranks == [2], m.reasoning
    assert "Majority vote on the root: 0" in m.reasoning


def test_the_recorder_reads_the_blocking_call_and_its_peer_from_the_stack(tmp_path):
    # a stand-in for torch's distributed_c10d.py: send() calls isend(), which waits; the
    # recorder names the outermost public call, its global peer and the user's frames
    import importlib.util
    import sys

    from mldebug.fr.recorder import _stack, call_in

    (tmp_path / "distributed_c10d.py").write_text(
        "import sys\n"
        "def isend(tensor, dst=None, group=None, tag=0, group_dst=None):\n"
        "    return sys._getframe()\n"
        "def send(tensor, dst=None, group=None, tag=0, group_dst=None):\n"
        "    return isend(tensor, dst=dst)\n"
        "def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):\n"
        "    return sys._getframe()\n")
    spec = importlib.util.spec_from_file_location("fake_c10d", tmp_path / "distributed_c10d.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules.pop("fake_c10d", None)

    def pipeline_step():
        return mod.send(None, dst=2)

    got = call_in(_stack(pipeline_step()))
    assert got is not None and got["op"] == "send" and got["peer"] == 2
    assert got["frames"][0][0] == "pipeline_step"
    assert call_in(_stack(mod.broadcast(None, src=0)))["peer"] == 0
    assert call_in(_stack(sys._getframe())) is None  # not in any torch.distributed call


def test_shape_mismatch_ranks_that_died_in_cpp_are_named_as_dead_and_undecided():
    # rank 1's all_reduce has 5 more elements: gloo aborts ranks 0 and 1 from C++ (no dump);
    # 2 and 3 end at once (a connection reset, torchrun's SIGTERM), not at the timeout
    a = run("shape_mismatch")
    (m,) = a.mismatches
    assert m.kind == "missing" and m.culprit_ranks == [0, 1] and a.missing_ranks == [0, 1]
    assert "They did not hang" in m.reasoning
    assert "cannot be told from these dumps" in m.reasoning


def test_a_rank_without_a_dump_while_the_others_timed_out_is_the_prime_suspect(tmp_path):
    # thread_lock's dumps without the culprit's: the others waited their whole timeout, so
    # nothing says the missing rank died; it is the one they wait for
    for r in (0, 1, 3):
        (tmp_path / f"fr_rank{r}").write_bytes((FIX / "thread_lock" / f"fr_rank{r}").read_bytes())
    a = analyze(load([tmp_path]))
    (m,) = a.mismatches
    assert m.kind == "missing" and m.culprit_ranks == [2] and a.missing_ranks == [2]
    assert "only candidates for holding it up" in m.reasoning
    assert "did not hang" not in m.reasoning
    assert verdict_class(a) == "outside"


def test_subgroup_skip_is_seen_in_the_skipper_s_own_order_when_its_partner_left_no_dump():
    # 8 ranks: rank 0 skipped pair group 1's all_reduce #4; its partner rank 1 left no dump.
    # Rank 0's own record (pair #3, world #3, world #4) against the others' (pair #4 before
    # world #4) says it skipped; rank 1, missing from the world's #4, must wait in the pair's
    a = run("subgroup_skip_r8")
    assert a.missing_ranks == [1]
    assert a.culprits == [0] and verdict_class(a) == "desync"
    pair = next(m for m in a.mismatches if m.pg == "1")
    world = next(m for m in a.mismatches if m.pg == "0")
    assert pair.kind == "skipped" and pair.culprit_ranks == [0] and pair.blocked_elsewhere == [1]
    assert world.culprit_ranks == [] and world.blocked_elsewhere == [1]
    assert "must wait in group 1 #4" in world.reasoning and "rank(s) 0 skipped" in world.reasoning


def test_exit0_the_rank_without_a_dump_closed_its_connections():
    # 8 ranks: rank 5 leaves the loop with sys.exit(0) (no dump: SystemExit is no failure);
    # its ring neighbours 4 and 6 fail with "Connection closed by peer", the rest time out
    a = run("exit0_r8")
    (m,) = a.mismatches
    assert m.kind == "missing" and m.culprit_ranks == [5] and a.missing_ranks == [5]
    assert "Rank(s) 4,6 lost a connection to a peer" in m.reasoning
    assert "exited or died rather than hang" in m.reasoning


def _waiting(tmp_path, where: dict[int, tuple[str, int]]):
    """Four gloo ranks that all completed #1-#3, each blocked where ``where`` says."""
    import fr_synth as synth

    dumps = {}
    for r in range(4):
        d = synth.dump(r, [synth.entry(s, backend="gloo", state="scheduled") for s in (1, 2, 3)],
                       world=4)
        op, peer = where[r]
        d["mldebug"] = {"rank": r, "world_size": 4, "reason": "uncaught RuntimeError: timed out",
                        "blocked_in": {"op": op, "peer": peer,
                                       "frames": [["pipeline_step", "/job/pp.py", 20 + r]]}}
        dumps[r] = d
    synth.write(tmp_path, dumps, prefix="fr_rank")
    return analyze(load([tmp_path]))


def test_p2p_a_receiver_that_names_the_wrong_source_is_the_culprit(tmp_path):
    # stage 1 receives from 3 instead of 0: 0 is blocked sending to 1, nobody waits for 0
    a = _waiting(tmp_path, {0: ("send", 1), 1: ("recv", 3), 2: ("recv", 1), 3: ("recv", 2)})
    (m,) = a.mismatches
    assert m.kind == "p2p" and m.culprit_ranks == [1], m.reasoning
    assert "rank 1 named the wrong source" in m.reasoning


def test_p2p_a_chain_of_receivers_behind_a_matched_send_names_nobody(tmp_path):
    # every send has its receiver waiting for it: nothing here says who is wrong
    a = _waiting(tmp_path, {0: ("send", 1), 1: ("recv", 0), 2: ("recv", 1), 3: ("recv", 2)})
    assert a.mismatches == []


def test_p2p_a_busy_destination_decides_nothing(tmp_path):
    # 0 blocked sending to 2 while 1 waits for 0 - but 2 is in a collective, not in a recv:
    # a live snapshot of a pipeline with a skip connection looks like this; nobody is named
    a = _waiting(tmp_path, {0: ("send", 2), 1: ("recv", 0), 2: ("all_reduce", None),
                            3: ("recv", 2)})
    assert a.mismatches == []


def _subgroup_job(world: int, steps: int, culprit: int) -> dict:
    """``world`` gloo ranks in pairs {0,1}, {2,3}...: each step a pair all_reduce, then a world
    all_reduce; ``culprit`` skips its pair's collective at the last step, its partner waits
    there alone."""
    import fr_synth as synth

    out = {}
    for r in range(world):
        pair = str(1 + r // 2)
        ents, rec = [], 0
        for k in range(1, steps + 1):
            if not (r == culprit and k == steps):
                ents.append(synth.entry(k, pg=(pair, "undefined"), pg_id=1, record_id=rec,
                                        backend="gloo", state="scheduled", sizes=((2632,),)))
                rec += 1
            if r == (culprit ^ 1) and k == steps:
                break
            ents.append(synth.entry(k, pg=("0", "default_pg"), pg_id=0, record_id=rec,
                                    backend="gloo", state="scheduled", sizes=((),),
                                    frames=synth.user_frames(line=11)))
            rec += 1
        groups = {"0": ("default_pg", range(world)),
                  pair: ("undefined", [2 * (r // 2), 2 * (r // 2) + 1])}
        out[r] = synth.dump(r, ents, world=world, groups=groups)
    return out


def test_subgroup_skip_among_many_pairs(tmp_path):
    import fr_synth as synth

    synth.write(tmp_path, _subgroup_job(64, 6, culprit=21), prefix="fr_rank")
    a = analyze(load([tmp_path]))
    assert a.culprits == [21] and verdict_class(a) == "desync"
    skipped = next(m for m in a.mismatches if m.kind == "skipped")
    assert skipped.pg == "11" and skipped.seq == 6
    world = next(m for m in a.mismatches if m.pg == "0")
    assert world.culprit_ranks == [] and world.blocked_elsewhere == [20]


def test_a_rank_stuck_outside_after_its_completed_pair_collective_is_still_the_culprit(tmp_path):
    # rank 20 joined its pair's #6 with rank 21 (both recorded it: it completed), then got
    # stuck outside any collective before the world's #6: it is no victim of its pair
    import fr_synth as synth

    job = _subgroup_job(64, 6, culprit=-2)  # nobody skips (-2 ^ 1 == -1: no partner)
    job[20]["entries"] = job[20]["entries"][:-1]
    job[20].pop("pg_status", None)
    synth.write(tmp_path, job, prefix="fr_rank")
    a = analyze(load([tmp_path]))
    (m,) = a.mismatches
    assert m.kind == "missing" and m.culprit_ranks == [20] and m.blocked_elsewhere == []
    assert verdict_class(a) == "outside"


def test_wrong_broadcast_src_at_8_ranks_is_decided_by_gloo_s_broadcast_tree():
    # rank 3 broadcasts from itself; rank 1 (root 0) and rank 3 (root 3) stay in it, the rest
    # completed. With root 0 right, gloo's tree leaves exactly 1 and 3 stuck; with root 3
    # right (rank 1 wrong) it would leave 1 and 5: rank 3 is the culprit
    a = run("wrong_broadcast_src_r8")
    (m,) = a.mismatches
    assert m.kind == "root" and m.culprit_ranks == [3], m.reasoning
    assert "only 0 predicts exactly which ranks completed it" in m.reasoning
    assert "root 3 would leave rank(s) 1,5 in it instead" in m.reasoning


def test_gloo_broadcast_tree():
    from mldebug.fr.waits import gloo_broadcast_blocked as stuck

    assert stuck(list(range(8)), {}, 0) == set() == stuck(list(range(5)), {}, 3)
    assert stuck(list(range(4)), {0: 0, 2: 2}, 0) == {0, 2} == stuck(list(range(4)), {0: 0, 2: 2}, 2)
    assert stuck(list(range(8)), {1: 0, 3: 3}, 0) == {1, 3}
    assert stuck(list(range(8)), {1: 0, 3: 3}, 3) == {1, 5}
