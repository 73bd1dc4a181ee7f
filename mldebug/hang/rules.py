"""Verdict and hint rules of one job: small pure functions over a ``Situation``.

``VERDICT_RULES`` is tried in order and the first rule that returns a ``Verdict`` wins (add a
rule by writing one function and listing it). ``HINT_RULES`` all run; each returns findings,
every one with a fix. Nothing here reads processes or files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mldebug.findings import Finding, Severity
from mldebug.hang.frames import call_site, user_frames
from mldebug.hang.model import (
    Group,
    HangClass,
    Process,
    Suspect,
    VerdictKind,
    fold_ranks,
    join_labels,
    proc_label,
)
from mldebug.hosts import collapse


@dataclass
class Situation:
    """One job, grouped: what every rule looks at."""

    procs: list[Process]
    groups: list[Group]
    places: list[list[int]]  # indices into groups that stand at one place, biggest first
    world: int | None
    missing: list[int]
    expected: dict[int, str]  # missing rank -> host it should be on
    answered_hosts: frozenset[str] = frozenset()  # hosts that answered (node up)
    watch: float | None = None
    all_threads: bool = False
    suspects: list[Suspect] = field(default_factory=list)  # filled after the verdict
    # (host, pid) -> ("spinning" | "blocked", evidence), from the /proc samples
    activity: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    gpu: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # host -> two polls
    undumped: dict[int, str] = field(default_factory=dict)  # missing rank alive, unreadable: why
    stopped: list[int] = field(default_factory=list)  # missing ranks alive but stopped (state T)
    recheck: float | None = None  # seconds to the one-snapshot re-check's dumps, when it ran
    progress: bool = False  # the verdict: every rank moved (filled after the verdict)

    def wedged(self) -> dict[str, list[int]]:
        """Per host, the GPUs busy at ~100% with flat power in both polls."""
        from mldebug.hang.gpu import wedged_gpus

        return {h: w for h, polls in self.gpu.items() if (w := wedged_gpus(polls))}

    def ras(self) -> dict[str, Any]:
        """NCCL RAS's view over every host's polls (dead, unresponsive, behind, moved)."""
        from mldebug.hang.gpu import ras_findings

        dead: set[int] = set()
        unresp: set[int] = set()
        behind: dict[str, list[int]] = {}
        moved: bool | None = None
        for polls in self.gpu.values():
            r = ras_findings(polls)
            dead.update(r["dead"])
            unresp.update(r["unresponsive"])
            behind.update(r["behind"])
            if r["moved"] is not None:
                moved = bool(moved) or r["moved"]
        return {"dead": sorted(dead), "unresponsive": sorted(unresp - dead), "behind": behind,
                "moved": moved}

    def size(self, idx: list[int]) -> int:
        return sum(len(self.groups[i].pids) for i in idx)

    @property
    def in_startup(self) -> bool:
        """Every rank present waits in start-up (init_process_group: the store, rendezvous)."""
        return bool(self.groups) and all(g.collective == "init_process_group"
                                         for g in self.groups)

    @property
    def in_coll(self) -> list[list[int]]:
        return [idx for idx in self.places if self.groups[idx[0]].collective]

    @property
    def out_coll(self) -> list[list[int]]:
        return [idx for idx in self.places if not self.groups[idx[0]].collective]


@dataclass
class Verdict:
    kind: VerdictKind
    text: str = ""  # empty: the suspects' names and the first reason make the text
    reasons: dict[int, str] = field(default_factory=dict)  # group index -> why it is suspect


# -- wording -------------------------------------------------------------------------------
def ranks_text(groups: list[Group], idx: list[int], limit: int = 8) -> str:
    """'ranks 0-3,7' when every process has a rank, else the first host:pid labels."""
    ranks = [r for i in idx for r in groups[i].ranks]
    pids = [hp for i in idx for hp in groups[i].pids]
    if ranks and len(ranks) == len(pids):
        return ("rank " if len(ranks) == 1 else "ranks ") + fold_ranks(ranks)
    return join_labels((proc_label(h, pid) for h, pid in pids), limit)


def place(g: Group) -> str:
    if g.collective:
        return f"in {g.collective} at {g.where}"
    if g.ours:
        return f"at {g.where} (not in a collective; {g.ours})"
    waits = f"; waits in {g.wait_at}" if g.wait_at else ""
    return f"at {g.where} (not in a collective{waits})"


def _verb(s: Situation, idx: list[int]) -> str:
    return "wait" if s.size(idx) > 1 else "waits"


def loop_note(g: Group, ref: Group) -> str:
    gu, ru = user_frames(g.frames), user_frames(ref.frames)
    if gu and ru and gu[0].name == ru[0].name and gu[0].display_file == ru[0].display_file:
        if gu[0].line != ru[0].line:
            return (" - same function, different line: the ranks are at different points of a "
                    "loop or branch")
        if g.locals_key != ref.locals_key and (g.locals_key or ref.locals_key):
            mine = ", ".join(f"{k}={v}" for k, v in g.locals_key)
            theirs = ", ".join(f"{k}={v}" for k, v in ref.locals_key)
            return (f" - same call site, different state ({mine} vs {theirs}): the ranks are in "
                    "different iterations of the same loop")
    return ""


# -- verdict rules (first match wins) --------------------------------------------------------
def startup_behind(s: Situation) -> Verdict | None:
    """Every rank in init_process_group, a minority still reaching the job's store while the
    rest got there and wait in process-group creation for every rank: the minority cannot
    reach the store (another MASTER_ADDR/MASTER_PORT, a firewall) and the rest wait for it."""
    from mldebug.hang.frames import startup_stage

    if not s.in_startup or s.missing:  # a rank absent explains every wait: missing_hint
        return None
    stage = {i: startup_stage(g.frames) for i, g in enumerate(s.groups)}
    behind = [i for i, st in stage.items() if st is not None and st[0] == "store"]
    past = [i for i, st in stage.items() if st is not None and st[0] == "group"]
    lines = {stage[i][1].line for i in behind}  # type: ignore[index]
    if len(lines) > 1:  # rank 0 hosting the store (another line) waits for the others there
        behind = [i for i in behind if s.groups[i].ranks != [0]]
    if not behind or not past or s.size(behind) >= s.size(past):
        return None
    at = stage[past[0]][1].location  # type: ignore[index]
    reasons = {i: f"still reaching the job's store in init_process_group (at "
                  f"{stage[i][1].location}) while {ranks_text(s.groups, past)} "  # type: ignore[index]
                  f"{_verb(s, past)} past it, building the process group ({at}) for every "
                  "rank: its MASTER_ADDR/MASTER_PORT or rendezvous endpoint differs, or it "
                  "cannot reach it" for i in behind}
    return Verdict(VerdictKind.SUSPECTS, reasons=reasons)


def no_python_left(s: Situation) -> Verdict | None:
    """A rank whose every thread has no Python frame while the others have stacks: its
    interpreter runs no Python code any more - it is exiting (sys.exit, the end of main, an
    uncaught exception unwinding) - and the others will wait for it."""
    empty = [i for i, g in enumerate(s.groups) if _python_gone(s, g)]
    # ranks raising while another exits are most often raising because of it (their peer's
    # connection closed): the exiting ones are named first
    raising = [] if empty else [i for i, g in enumerate(s.groups) if _raising(g)]
    if not (empty or raising) or len(empty) + len(raising) == len(s.groups):
        return None
    others = [i for i in range(len(s.groups)) if i not in empty and i not in raising]
    desc = "; ".join(f"{ranks_text(s.groups, [i])} {_verb(s, [i])} {place(s.groups[i])}"
                     for i in others[:3])
    reasons = {i: "runs no Python code any more (no thread has a Python frame): it is exiting - "
                  "sys.exit, the end of its main, or an exception unwinding to the top - while "
                  + desc for i in empty}
    for i in raising:
        hook = s.groups[i].frames[-1]
        reasons[i] = (f"an uncaught exception reached the top of its main thread: it runs the "
                      f"exception hook ({hook.location}, at {s.groups[i].where}) and will exit, "
                      "while " + desc)
    return Verdict(VerdictKind.SUSPECTS, reasons=reasons)


def _raising(g: Group) -> bool:
    """The main thread's outermost Python frame is an exception hook: the interpreter called
    sys.excepthook for an exception nothing caught (torch's _distributed_excepthook, the
    user's); the rank is on its way out."""
    py = [f for f in g.frames if not f.native]
    return bool(py) and "excepthook" in py[-1].name.rsplit(".", 1)[-1].lower()


def _python_gone(s: Situation, g: Group) -> bool:
    if g.frames:
        return False
    procs = {(p.host, p.pid): p for p in s.procs}
    return all((p := procs.get(hp)) is not None and p.threads
               and not any(t.frames for t in p.threads) for hp in g.pids)


def one_place(s: Situation) -> Verdict | None:
    if len(s.places) != 1:
        return None
    g = s.groups[s.places[0][0]]
    if len(s.procs) == 1:
        return Verdict(VerdictKind.SAME_PLACE, f"The only rank process is {place(g)}.")
    return Verdict(VerdictKind.SAME_PLACE,
                   f"All {len(s.procs)} ranks are in the same place: {place(g)}. "
                   "No odd one out in the Python stacks.")


def outside_while_others_wait(s: Situation) -> Verdict | None:
    if not (s.in_coll and s.out_coll):
        return None
    wait_desc = "; ".join(f"{ranks_text(s.groups, idx)} {_verb(s, idx)} {place(s.groups[idx[0]])}"
                          for idx in s.in_coll[:3])
    # what the frames say first, then what only a live run's /proc adds (the kernel wait),
    # so a reason from saved dumps is the start of the live one
    reasons = {i: f"not in any collective (at {g.where}"
                  + (f"; {g.ours}" if g.ours else
                     f"; waits in {g.wait_at}" if g.wait_at and not g.kernel else "")
                  + f") while {wait_desc}"
                  + (f"; waits in {g.wait_at}" if g.wait_at and g.kernel and not g.ours else "")
               for idx in s.out_coll for i in idx for g in (s.groups[i],)}
    return Verdict(VerdictKind.SUSPECTS, reasons=reasons)


def missing_and_all_waiting(s: Situation) -> Verdict | None:
    if not s.missing or s.out_coll:
        return None
    return Verdict(VerdictKind.SAME_PLACE,
                   "The ranks present wait in collectives: "
                   + "; ".join(f"{ranks_text(s.groups, idx)} {place(s.groups[idx[0]])}"
                               for idx in s.places[:4]) + ".")


_SENDS = frozenset({"send", "isend", "send_object_list"})
_RECVS = frozenset({"recv", "irecv", "recv_object_list"})


def p2p_sender(s: Situation) -> Verdict | None:
    """Every rank in a torch.distributed call, some blocked in send while others wait in
    recv: a blocking send waits for its peer to post the matching recv, and the receivers
    each wait for someone - a send no receiver takes went to the wrong peer (or the peer
    expects another source). The senders are the suspects; ranks already in a later
    collective finished their part and wait for the rest."""
    if s.out_coll:
        return None
    sends = [i for idx in s.in_coll for i in idx if s.groups[i].collective in _SENDS]
    recvs = [i for idx in s.in_coll for i in idx if s.groups[i].collective in _RECVS]
    if not sends or not recvs or s.size(sends) >= s.size(recvs):
        return None
    desc = f"{ranks_text(s.groups, recvs)} {_verb(s, recvs)} in recv"
    rest = [i for idx in s.in_coll for i in idx if i not in sends and i not in recvs]
    if rest:
        desc += f" and {ranks_text(s.groups, rest)} {_verb(s, rest)} {place(s.groups[rest[0]])}"
    reasons = {i: f"{place(s.groups[i])} while {desc}: a blocking send waits for its peer to "
                  "receive from it and no rank does - it sends to the wrong peer, or its peer "
                  "expects another source" for i in sends}
    return Verdict(VerdictKind.SUSPECTS, reasons=reasons)


def no_majority(s: Situation) -> Verdict | None:
    if s.size(s.places[0]) != s.size(s.places[1]):
        return None
    return Verdict(VerdictKind.AMBIGUOUS,
                   "No majority: the ranks split into equal groups in different places - "
                   + "; ".join(f"{ranks_text(s.groups, idx)} {place(s.groups[idx[0]])}"
                               for idx in s.places[:4])
                   + ". One side issued a call the other did not.")


def minority(s: Situation) -> Verdict | None:
    ref_idx = s.places[0]
    ref = s.groups[ref_idx[0]]
    ref_txt = ranks_text(s.groups, ref_idx)
    reasons = {}
    for idx in s.places[1:]:
        for i in idx:
            g = s.groups[i]
            reasons[i] = (f"{place(g)} while the majority ({ref_txt}) "
                          f"{'wait' if ref.collective else 'are'} {place(ref)}"
                          + loop_note(g, ref))
    return Verdict(VerdictKind.SUSPECTS, reasons=reasons)


VERDICT_RULES: list[Callable[[Situation], Verdict | None]] = [
    no_python_left, startup_behind, one_place, outside_while_others_wait,
    missing_and_all_waiting, p2p_sender, no_majority, minority,
]


def verdict(s: Situation) -> Verdict:
    for rule in VERDICT_RULES:
        v = rule(s)
        if v is not None:
            return v
    raise AssertionError("minority() always answers")  # pragma: no cover


FIXES = {
    VerdictKind.SUSPECTS: "Look at the suspects' call sites first: the code path that skipped "
                          "or added a collective, or the work that never finished.",
    VerdictKind.SAME_PLACE: "The cause is below Python or in the data: see the hints.",
    VerdictKind.AMBIGUOUS: "Trigger the flight recorder: mldebug fr trigger, then mldebug fr "
                           "analyze, to see which collective each side issued last.",
    VerdictKind.NO_PROCESSES: "Check that the job runs on these hosts; select it with --pid or "
                              "--pattern if its processes carry no RANK variable.",
    VerdictKind.PROGRESS: "Nothing is stuck: if a timeout fires, raise it; find the slow step "
                          "with py-spy top --pid PID on the slowest rank.",
}


# -- the class of the hang (named first in the verdict) --------------------------------------
def hang_class(s: Situation, kind: VerdictKind, suspect_groups: list[Group]) -> HangClass:
    """The kind of hang from the verdict, the suspects' groups and the /proc samples."""
    if kind is VerdictKind.PROGRESS:
        return HangClass.SLOW
    if kind is VerdictKind.NO_PROCESSES:
        return HangClass.NONE
    gone = [r for r in s.missing if r not in s.undumped]
    if gone and s.in_startup:
        return HangClass.LAUNCH  # never joined: the others still wait in start-up
    if gone or (s.gpu and s.ras()["dead"]):
        return HangClass.DEAD_RANK  # a stopped or traced rank is alive: not this class
    if s.stopped:
        return HangClass.STOPPED
    if s.in_startup:  # every rank still in init_process_group: start-up never completed
        return HangClass.LAUNCH
    if kind is VerdictKind.AMBIGUOUS:
        return HangClass.DESYNC
    if kind is VerdictKind.SUSPECTS:
        if suspect_groups and all(_python_gone(s, g) for g in suspect_groups):
            return HangClass.DEAD_RANK  # exiting: as good as gone for the others
        if suspect_groups and all(_raising(g) for g in suspect_groups):
            return HangClass.EXCEPTION
        if not suspect_groups or any(g.collective for g in suspect_groups):
            return HangClass.DESYNC
        if any(g.wait == "debugger" for g in suspect_groups):
            return HangClass.DEBUGGER
        acts = [s.activity.get(hp, ("", ""))[0] for g in suspect_groups for hp in g.pids]
        if "spinning" in acts:
            return HangClass.SPINNING
        if acts and all(a == "blocked" for a in acts):
            return HangClass.BLOCKED
        return HangClass.OUTSIDE
    if s.groups and all(g.collective for g in s.groups) and len(s.places) == 1:
        if s.gpu and s.wedged():
            return HangClass.DEVICE_WEDGE
        acts = [s.activity.get((p.host, p.pid), ("", ""))[0] for p in s.procs]
        if acts and all(a == "blocked" for a in acts):
            return HangClass.COLLECTIVE_IDLE
        return HangClass.SAME_COLLECTIVE
    return HangClass.SAME_PLACE


def pdb_session(groups: list[Group]) -> tuple[str, str] | None:
    """Every rank inside mldebug.breakpoint, one (or some) of them in its pdb session: the
    others wait for that session by design - the verdict and fix say so, not a fault. None
    when a rank is elsewhere (it went on to a collective: reached by only some ranks)."""
    if not groups or any(g.wait != "debugger" for g in groups):
        return None
    session = [i for i, g in enumerate(groups) if "debugger session" in (g.wait_at or "")]
    others = [i for i in range(len(groups)) if i not in session]
    if not session:
        return None
    who = ranks_text(groups, session)
    at = call_site(groups[session[0]].frames)
    one = sum(len(groups[i].pids) for i in session) == 1
    text = (f"{_upper_first(who)} {'is' if one else 'are'} in a pdb session"
            + (f" at {at}" if at else "") + " (mldebug.breakpoint), waiting for its user"
            + (f"; {ranks_text(groups, others)} wait for it in mldebug.breakpoint"
               if others else "") + ". Not a fault: every rank reached the breakpoint.")
    ranks = [r for i in session for r in groups[i].ranks]
    target = str(ranks[0]) if ranks else "RANK"
    fix = (f"Connect to it: mldebug pdb connect {target} (mldebug pdb list shows the stopped "
           "ranks); 'c' there lets every rank go on.")
    return text, fix


CLASS_FIXES = {
    HangClass.SPINNING: "The suspect loops without blocking: py-spy top --pid PID shows where "
                        "its time goes; look for a loop whose exit condition never comes (a "
                        "flag, a file or a message another rank never sets).",
    HangClass.BLOCKED: "The suspect sleeps in a wait outside any collective: see the hint for "
                       "what it waits on (lock, queue, file, DataLoader worker) and who should "
                       "wake it.",
    HangClass.DEBUGGER: "mldebug.breakpoint was reached by only some ranks: call it on every "
                        "rank (it stops only the rank= ones), or continue the debugged rank.",
    HangClass.COLLECTIVE_IDLE: "Every rank waits, idle, in the same collective: the data is not "
                               "moving below Python (network, NCCL, a GPU). Run mldebug env and "
                               "mldebug fr trigger + fr analyze; on GPU nodes check nvidia-smi.",
    HangClass.DEVICE_WEDGE: "Every rank waits in the same collective while its GPU runs at "
                            "100% with flat power: a kernel that never finishes (a collective "
                            "waiting for a peer on the device, or a stuck kernel). Check "
                            "nvidia-smi -q and dmesg for Xid errors on that node; mldebug fr "
                            "trigger + analyze for the collective.",
    HangClass.DEAD_RANK: "Find why the rank's process ended: its log, dmesg for OOM kills, the "
                         "node's health; the others wait for it.",
    HangClass.EXCEPTION: "The rank raised an exception nothing caught and is exiting: its "
                         "traceback is in its log (stderr) once the hook ends; the others "
                         "will wait for it until their collective timeout.",
    HangClass.STOPPED: "Resume the stopped rank: kill -CONT PID (a SIGSTOP, a shell's Ctrl-Z, "
                       "a debugger or a scheduler's suspend stopped it); the others run on "
                       "once it does.",
    HangClass.LAUNCH: "Start-up never completed: compare the world size passed to "
                      "init_process_group (and WORLD_SIZE, RANK) with the ranks launched, and "
                      "check that every rank reaches MASTER_ADDR:MASTER_PORT (mldebug env "
                      "--check-port); --locals shows the arguments init_process_group got.",
}


# -- hint rules (every one runs) --------------------------------------------------------------
def _hosts(hosts: set[str] | list[str]) -> tuple[str, ...]:
    named = sorted(h for h in hosts if h)
    return (collapse(named),) if named else ()


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _f(code: str, title: str, detail: str, fix: str, hosts: set[str] | list[str] = (),  # type: ignore[assignment]
       severity: Severity = Severity.HINT) -> Finding:
    return Finding(severity, title, detail, fix, code, _hosts(hosts))


def below_python(s: Situation) -> list[Finding]:
    if len(s.places) != 1 or s.missing or not s.groups[0].collective:
        return []
    return [_f("below-python", "Every rank waits in the same collective.",
               "The Python stacks agree, so the cause is likely below Python (NCCL, the "
               "network, a GPU) or ranks in different iterations of a loop.",
               "Run again with --locals to compare loop counters, 'mldebug env' on the nodes, "
               "and 'mldebug fr trigger' + 'mldebug fr analyze' for the flight recorder.",
               {p.host for p in s.procs})]


def passed_collective_hint(s: Situation) -> list[Finding]:
    """Suspects waiting in a collective at an earlier line of the same function the majority
    stands in, further on: the majority passed that call, so it did not take all of them -
    a subgroup collective whose other member skipped it (the suspect is then its victim), or
    one matched out of order with another call (a collective issued by some ranks only). The
    stacks cannot tell which rank caused it; the flight recorder can."""
    if len(s.places) < 2 or not s.suspects or s.size(s.places[0]) == s.size(s.places[1]):
        return []
    ref = s.groups[s.places[0][0]]
    ru = user_frames(ref.frames)
    if not ref.collective or not ru:
        return []
    passed = []
    for idx in s.places[1:]:
        g = s.groups[idx[0]]
        gu = user_frames(g.frames)
        if (g.collective and gu and gu[0].name == ru[0].name
                and gu[0].display_file == ru[0].display_file and gu[0].line < ru[0].line
                and [f.location for f in gu[1:]] == [f.location for f in ru[1:]]):
            passed.extend(idx)
    if not passed:
        return []
    who = ranks_text(s.groups, passed)
    lines = ", ".join(str(n) for n in sorted({user_frames(s.groups[i].frames)[0].line
                                              for i in passed}))
    return [_f("passed-collective", f"{_upper_first(who)} {_verb(s, passed)} in a collective "
               f"the majority ({ranks_text(s.groups, s.places[0])}) already passed: who caused "
               "it cannot be told from the stacks.",
               f"The majority went on past {ru[0].name} line {lines} to line {ru[0].line}, so "
               f"that call completed without {who}: either it is a "
               "subgroup collective (group=...) whose other member skipped it - then "
               f"{who} {_verb(s, passed)} for that member and the culprit is among the "
               "majority - or ranks matched it out of order with another collective (an extra "
               "or a missing call on some rank).",
               "mldebug hang --fr: the flight recorder has each collective's group, its ranks "
               "and sequence number.",
               {h for i in passed for h in s.groups[i].hosts})]


def no_majority_hint(s: Situation) -> list[Finding]:
    if len(s.places) < 2 or s.size(s.places[0]) != s.size(s.places[1]):
        return []
    return [_f("flight-recorder", "The flight recorder shows which collective each rank issued "
               "last.", "", "mldebug fr trigger, then mldebug fr analyze")]


def missing_hint(s: Situation) -> list[Finding]:
    """A rank that exited (the others are past start-up) vs one that never started; a rank
    whose process is there but could not be read (stopped, traced) is neither."""
    out = []
    if s.undumped:
        alive = sorted(s.undumped)
        out.append(_f("rank-unreadable", f"Rank {fold_ranks(alive)} is alive but its stacks "
                      "could not be read.",
                      " ".join(s.undumped[r] for r in alive[:3]),
                      "Resume or detach the process as the reason says (kill -CONT PID for a "
                      "stopped rank, quit the debugger or strace holding it), then run "
                      "again; without ptrace: mldebug hang --signal with mldebug.watchdog().",
                      {s.expected[r] for r in alive if r in s.expected}, Severity.WARNING))
    gone = [r for r in s.missing if r not in s.undumped]
    return out + _gone_hint(s, gone)


def _gone_hint(s: Situation, gone: list[int]) -> list[Finding]:
    if not gone:
        return []
    miss = fold_ranks(gone)
    hosts = {s.expected[r] for r in gone if r in s.expected}
    up = sorted(h for h in hosts if h in s.answered_hosts)
    in_init = all(s.groups[i].collective == "init_process_group"
                  for idx in s.places for i in idx)
    node = f" Its node answered ({collapse(up)}), so the process is gone, not the node." if up else ""
    if in_init:
        return [_f("rank-not-started", f"Rank {miss} never joined: the others still wait in "
                   "init_process_group.",
                   "The rank's process is absent while its peers are in start-up: it has not "
                   "started, crashed before init, or cannot reach MASTER_ADDR." + node,
                   "Read the launcher's log for that rank; check MASTER_ADDR/MASTER_PORT from "
                   "its node (mldebug env --check-port).", hosts, Severity.WARNING)]
    return [_f("rank-exited", f"Rank {miss} exited while the others kept running.",
               "The others are past start-up, so the rank ran and then ended (crash, OOM "
               "kill, an early return or exit on one rank)." + node,
               "Check the rank's log and the kernel log (dmesg) on its node for OOM kills.",
               hosts, Severity.WARNING)]


def recheck_hint(s: Situation) -> list[Finding]:
    """What the one-snapshot re-check (a second dump ``recheck`` seconds later) says when it
    did not show progress: suspects that moved while the others stood still are busy - a
    long step or a loop - and whether they would ever reach the collective cannot be told
    from a second; suspects that did not move are stuck for that long at least."""
    if s.recheck is None or s.progress or not s.suspects:
        return []
    state = {hp: g.state for g in s.groups for hp in g.pids}
    moving = [x for x in s.suspects if x.pid is not None
              and (state.get((x.host, x.pid)) == "moving" or x.activity == "spinning")]
    keys = {(x.host, x.pid) for x in moving}
    stuck = [g for g in s.groups if g.state == "stuck" and not keys & set(g.pids)]
    if not moving or not stuck:
        return []
    who = join_labels(x.host + ":" + str(x.pid) if x.rank is None else f"rank {x.rank}"
                      for x in moving)
    pid = moving[0].pid
    return [_f("recheck-suspect-busy", f"{_upper_first(who)} kept running (its stack or CPU "
               f"time moved) over the {s.recheck:g}s re-check while "
               f"{ranks_text(s.groups, [s.groups.index(g) for g in stuck])} did not: busy, "
               "not asleep.",
               "A rank busy outside the collective the others wait in is either in a long "
               "step (an evaluation, a checkpoint, a slow batch) or in a loop that never ends; "
               f"{s.recheck:g}s cannot tell which.",
               f"Watch longer than a step: mldebug hang --watch 30; py-spy top --pid {pid} shows "
               "where its time goes.", {x.host for x in moving})]


def watch_hint(s: Situation) -> list[Finding]:
    if s.watch is None:
        return []
    state = {(h, pid): g.state for g in s.groups for h, pid in g.pids}
    out = []
    if s.suspects and all(x.pid is not None and state.get((x.host, x.pid)) == "moving"
                          for x in s.suspects):
        out.append(_f("suspects-moving", "The suspects' stacks changed between the two dumps: "
                      "they are slow, not stuck.", "",
                      "Profile them (py-spy top --pid PID) instead of looking for a deadlock.",
                      {x.host for x in s.suspects}))
    if s.groups and all(g.state == "moving" for g in s.groups):
        out.append(_f("all-moving", f"Every rank's stack changed within {s.watch:g}s: the job "
                      "is making progress (slow, not hung).", "",
                      "Raise the timeout or find the slow step with py-spy top."))
    return out


# label -> (title, what it means, fix)
WAIT_HINTS: dict[str, tuple[str, str, str]] = {
    "dataloader": (
        "{who}: waiting for a DataLoader batch ({at}).",
        "The main thread waits in the DataLoader for its worker processes: a worker died, is "
        "stuck, or deadlocked (fork after threads, a full /dev/shm).",
        "Try num_workers=0 to confirm; check free space in /dev/shm (docker: --shm-size); look "
        "at the workers' stacks below (mldebug dumps the DataLoader workers of each rank)."),
    "cuda-sync": (
        "{who}: waiting for the GPU in a CUDA synchronisation ({at}).",
        "A host-device sync (.item(), .cpu(), torch.cuda.synchronize()) waits for kernels "
        "queued behind a collective that another rank never joined, or for a stuck kernel.",
        "Find which collective the GPU stream waits on (mldebug fr trigger + analyze); move "
        "the .item()/.cpu() after the collective or drop it."),
    "subprocess": (
        "{who}: waiting for a child process ({at}).",
        "subprocess.wait()/communicate() blocks until the child ends.",
        "Find the child (ps --ppid PID) and why it does not end; pass timeout= to wait()."),
    "queue": (
        "{who}: waiting on a queue ({at}).",
        "queue.get() blocks until a producer thread or process puts an item; the producer "
        "died or waits itself.",
        "Dump every thread (--all-threads) to find the producer; use get(timeout=...)."),
    "thread-join": (
        "{who}: waiting for a thread to end ({at}).",
        "Thread.join() blocks until the thread returns.",
        "Dump every thread (--all-threads) to see what the joined thread does."),
    "event": (
        "{who}: waiting on a threading Event or Condition ({at}).",
        "Event.wait()/Condition.wait() blocks until another thread sets or notifies it.",
        "Dump every thread (--all-threads) to find who should set it; pass timeout=."),
    "lock": (
        "{who}: waiting to acquire a lock ({at}).",
        "Lock.acquire() blocks until the holder releases it; two threads taking two locks in "
        "opposite order deadlock.",
        "Dump every thread (--all-threads) to find the holder; take locks in one order."),
    "sleep": (
        "{who}: sleeping ({at}).",
        "time.sleep() in a rank: a polling loop waiting for a condition that never comes, a "
        "retry back-off, or a debugging pause left in.",
        "Look at the loop around the sleep at the call site: what condition is it waiting for?"),
    "file-lock": (
        "{who}: waiting for a file lock ({at}).",
        "flock()/fcntl() blocks until the process holding the lock on that file releases it "
        "(from /proc/locks: the holder of the lock on the same inode).",
        "See what the holder does (py-spy dump --pid HOLDER; cat /proc/HOLDER/cmdline): end it or "
        "make it release the lock; take the lock with a timeout (LOCK_NB in a retry loop)."),
    "socket-read": (
        "{who}: waiting on a socket ({at}).",
        "A recv/accept/connect on a socket outside torch.distributed: a peer (a server, a "
        "metrics or data service, another rank's side channel) that never answers.",
        "Find the peer (ss -tnp | grep PID); give the socket a timeout (settimeout)."),
    "stdin": (
        "{who}: waiting for input on stdin ({at}).",
        "input() or a read of sys.stdin in a rank: a prompt nobody answers (launchers give "
        "ranks no terminal).",
        "Remove the prompt from the job (a flag or config value instead of input())."),
    "pipe-read": (
        "{who}: waiting to read a pipe or FIFO ({at}).",
        "A read on a pipe blocks until a writer writes or every writer closes it.",
        "Find the writer (lsof on the pipe or FIFO) and why it does not write."),
    "fifo-open": (
        "{who}: waiting to open a FIFO ({at}).",
        "Opening a FIFO for reading blocks until some process opens it for writing.",
        "Start the writer, or open with O_NONBLOCK."),
    "poll": (
        "{who}: waiting in poll/select ({at}).",
        "The rank waits for file descriptors (sockets, pipes) that never become ready.",
        "Find which descriptors (ls -l /proc/PID/fd) and who should write them."),
    "fs-read": (
        "{who}: waiting in a file read or open ({at}).",
        "A read/open system call that does not return: usually a network file system (NFS, "
        "Lustre, GPFS) that is slow or hung on that node.",
        "Check the mount on that node (df, dmesg for NFS/Lustre errors); stage data on local "
        "disk."),
}


def wait_hints(s: Situation) -> list[Finding]:
    """A hint for each kind of wait that is not a collective (see WAIT_HINTS); none when
    every rank moved (nothing waits for long)."""
    if s.progress:
        return []
    by_label: dict[str, list[int]] = {}
    for i, g in enumerate(s.groups):
        if g.wait and not g.collective and g.wait in WAIT_HINTS:
            by_label.setdefault(g.wait, []).append(i)
    out = []
    for label, idx in by_label.items():
        title, detail, fix = WAIT_HINTS[label]
        who = _upper_first(ranks_text(s.groups, idx))
        at = s.groups[idx[0]].wait_at or ""
        out.append(_f(f"wait-{label}", title.format(who=who, at=at), detail, fix,
                      {h for i in idx for h in s.groups[i].hosts}))
    return out


def needs_native(s: Situation) -> list[Finding]:
    """A suspect idle in its own code with nothing below it: the wait is in C."""
    hits = [i for i, g in enumerate(s.groups) if not g.collective and not g.wait and g.frames
            and not any(f.native for f in g.frames) and user_frames(g.frames[:1])
            and not any(s.activity.get(hp, ("",))[0] == "spinning" for hp in g.pids)]
    if not hits or not s.suspects:
        return []
    suspect_keys = {(x.host, x.pid) for x in s.suspects}
    hits = [i for i in hits if any(hp in suspect_keys for hp in s.groups[i].pids)]
    if not hits:
        return []
    return [_f("run-native", f"{_upper_first(ranks_text(s.groups, hits))}: stopped in user "
               "code with no Python call below it.",
               "The call it waits in is written in C (time.sleep, Lock.acquire, a file read, "
               ".item()): Python-only stacks cannot show it.",
               "Run again with --native to see the C frames (sleep, lock, read, CUDA sync).",
               {h for i in hits for h in s.groups[i].hosts})]


def thread_deadlock(s: Situation) -> list[Finding]:
    """Two or more threads of one process each waiting on a lock (--all-threads)."""
    if not s.all_threads:
        return []
    from mldebug.hang.frames import is_background, wait_of

    stuck: list[Process] = []
    for p in s.procs:
        locked = [t for t in p.threads if not is_background(t)
                  and (w := wait_of(t.frames)) is not None and w[0] == "lock"]
        if len(locked) >= 2 and not any(t.active for t in p.threads):
            stuck.append(p)
    if not stuck:
        return []
    who = join_labels(x.label for x in stuck)
    return [_f("thread-deadlock", f"Possible deadlock between threads in {who}: two or more "
               "threads each wait on a lock and no thread runs.",
               "Two threads that take two locks in opposite order wait for each other forever.",
               "Read each thread's call site (--all-threads --native --locals shows the locks); "
               "take locks in one global order or use one lock.",
               {x.host for x in stuck}, Severity.WARNING)]


def gpu_hints(s: Situation) -> list[Finding]:
    """What nvidia-smi and NCCL RAS said (two polls each), for the job's nodes."""
    if not s.gpu:
        return []
    out = []
    wedged = s.wedged()
    if wedged:
        which = "; ".join(f"{h}: GPU {', '.join(map(str, g))}" for h, g in wedged.items())
        out.append(_f("gpu-busy-flat", f"GPU at 100% utilisation with flat power in both polls "
                      f"({which}).", "A kernel spins without finishing: a collective waiting "
                      "for a peer on the device, or a stuck kernel.",
                      "nvidia-smi -q -d PERFORMANCE and dmesg | grep -i xid on that node.",
                      set(wedged), Severity.WARNING))
    ras = s.ras()
    if ras["dead"] or ras["unresponsive"]:
        parts = []
        if ras["dead"]:
            parts.append(f"rank {fold_ranks(ras['dead'])} considered dead")
        if ras["unresponsive"]:
            parts.append(f"rank {fold_ranks(ras['unresponsive'])} unresponsive")
        out.append(_f("ras-missing-ranks", "NCCL RAS: " + ", ".join(parts) + ".",
                      "RAS could not reach those ranks' processes: the process or its node is "
                      "gone, or the network to it is down.",
                      "Check the rank's log and its node (ping, dmesg); ncclras -v for details.",
                      set(s.gpu), Severity.WARNING))
    if ras["behind"]:
        comm, ranks = next(iter(ras["behind"].items()))
        moved = ras["moved"]
        out.append(_f("ras-counts-behind", f"NCCL RAS: rank {fold_ranks(ranks)} launched fewer "
                      f"collectives than the others on communicator {comm}"
                      + ("; the counts did not move between the two polls." if moved is False
                         else "."),
                      "RAS counts launched operations, not completed ones (NVIDIA/nccl#1730): "
                      "read it with the stacks - those ranks never issued the collective the "
                      "others wait in.",
                      "Look at those ranks' stacks above; mldebug fr trigger + analyze.",
                      set(s.gpu)))
    return out


HINT_RULES: list[Callable[[Situation], list[Finding]]] = [
    gpu_hints,
    missing_hint, below_python, no_majority_hint, passed_collective_hint, wait_hints, needs_native, thread_deadlock,
    watch_hint, recheck_hint,
]


def hints(s: Situation) -> list[Finding]:
    out: list[Finding] = []
    for rule in HINT_RULES:
        out.extend(rule(s))
    return out
