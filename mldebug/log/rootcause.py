"""What a launcher's "Root Cause" entry says, and whether it is a cause or a consequence. Pure.

torchrun (torch.distributed.elastic's ``ChildFailedError``) prints a "Root Cause (first
observed failure)" entry: the rank that *exited* first, its exit code and its traceback
(``traceback : Signal 6 (SIGABRT) received by PID 123`` when a signal ended it). The first rank
to exit is often not the one at fault (pytorch#123070): a rank whose collective timed out is
aborted by its communicator's watchdog (SIGABRT, exit code -6); once one rank fails, the agent
SIGTERMs the others (-15) and SIGKILLs those that linger (-9); a rank that lost its peer
raises "Connection closed by peer" or a timeout and exits 1. ``meaning`` reads the entry's
exit code and message into what ended the rank and whether that alone marks it as a
consequence of a failure elsewhere.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from mldebug.log.model import LauncherFailure, ParsedLogs

_SIGNAL_IN_TEXT = re.compile(r"Signal (\d+) \((SIG[A-Z]+)\)")

# what ended the rank: (the sentence, whether it is by itself a consequence of another failure)
_BY_SIGNAL = {
    "SIGABRT": ("SIGABRT: the process group's watchdog aborts a rank whose collective timed out "
                "or failed, so this is usually how a waiting rank ends", True),
    "SIGTERM": ("SIGTERM: the launcher's agent stops every other rank once one has failed (or a "
                "scheduler stopped the job)", True),
    "SIGKILL": ("SIGKILL: the agent kills a rank that outlived its SIGTERM, or the kernel's OOM "
                "killer chose it (dmesg says which)", False),
    "SIGINT": ("SIGINT: interrupted (Ctrl-C, or the agent passing one on)", True),
    "SIGHUP": ("SIGHUP: its terminal or session went away", True),
}


@dataclass(frozen=True)
class RootCause:
    """A launcher's "first observed failure" entry, as printed."""

    launcher: str  # torchrun
    rank: int | None
    exitcode: int | None
    signal: str | None  # SIGABRT, ... when a signal ended the rank
    host: str | None
    time: str | None
    message: str  # its traceback field (first line)
    # the rank's own first line in these logs when every failure line of it is a reaction to a
    # peer (a timeout, a lost connection): the entry names a waiter
    reaction: str = ""

    def said(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        how = [f"exit code {self.exitcode}"] if self.exitcode is not None else []
        if self.signal:
            how.append(self.signal)
        return f"{self.launcher}'s Root Cause names {who}" + (f" ({', '.join(how)})" if how else "")

    def to_dict(self) -> dict[str, object]:
        return {"launcher": self.launcher, "rank": self.rank, "exitcode": self.exitcode,
                "signal": self.signal, "host": self.host, "time": self.time,
                "message": self.message}


def signal_of(exitcode: int | None, message: str = "") -> str | None:
    m = _SIGNAL_IN_TEXT.search(message or "")
    if m:
        return m.group(2)
    if exitcode is not None and exitcode < 0:  # torch's multiprocessing: -N for signal N
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return None


def root_cause(parsed: ParsedLogs) -> RootCause | None:
    """The launcher's "Root Cause" entry of these logs (the last one printed: a restarted
    job prints one per failure), None when the logs hold none."""
    roots = [f for f in parsed.launcher if f.root]
    if not roots:
        return None
    f: LauncherFailure = roots[-1]
    rank = f.rank if f.rank is not None and f.rank >= 0 else None
    msg = (f.message or "").strip().splitlines()[0][:300] if (f.message or "").strip() else ""
    if msg in ("<N/A>", "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"):
        msg = ""
    reaction = ""
    st = parsed.ranks.get(rank) if rank is not None else None
    if st is not None and st.first_primary is None and st.consequences and st.first_event:
        reaction = st.first_event.message[:160]
    return RootCause("torchrun", rank, f.exitcode, signal_of(f.exitcode, msg), f.host, f.time,
                     msg, reaction)


def meaning(rc: RootCause) -> tuple[str, bool]:
    """(what ended that rank, in one sentence; whether that by itself makes it a consequence
    of a failure elsewhere). An exit code 1 with a peer-loss or timeout message is a reaction;
    with another message, or unknown, it is the rank's own failure as far as the entry says."""
    from mldebug.log.parse import classify

    if rc.reaction and rc.signal not in ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"):
        return (f"its own lines show only a reaction to another rank ({rc.reaction})"
                + (f", then {rc.signal}" if rc.signal else ""), True)
    if rc.signal in _BY_SIGNAL:
        return _BY_SIGNAL[rc.signal]
    if rc.signal:
        return f"{rc.signal}: the rank crashed", False
    if rc.message:
        kind, primary = classify(rc.message)
        if not primary:
            return (f"it exited after {'a timeout' if kind == 'timeout' else 'losing a peer'} "
                    f"({rc.message[:120]}): a reaction to another rank", True)
        return f"it raised: {rc.message[:160]}", False
    return "it exited with an error and its traceback was not recorded (no @record)", False
