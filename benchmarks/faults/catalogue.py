"""The fault classes of the matrix: what each injects, who the culprit is, what a right
verdict's class is, and which routes can see it (docs/faults.md is written from this table
and a test keeps the two in step).

Classes (the common vocabulary every route's verdict is mapped onto, runner.CLASS_MAPS):
``desync`` (ranks in different or mismatched collectives), ``blocked`` (a rank asleep outside
any collective: lock, I/O, queue, worker), ``spinning`` (a rank burning CPU outside any
collective), ``stopped`` (SIGSTOP), ``dead`` (a rank's process ended: signal, exit),
``exception`` (a rank raised), ``launch`` (init, rendezvous, store), ``network`` (every rank
idle in the same collective), ``healthy`` (nothing wrong: training, or slow).

Routes: ``hang`` (one live `mldebug hang`), ``watch`` (`mldebug hang --watch`), ``log``
(`mldebug log` on what the job printed, after it ended), ``fr`` (`mldebug fr analyze` on the
dumps the ranks wrote when they failed). Each has a peer a user would use instead
(runner.PEERS): ``pyspy`` (every rank's `py-spy dump`, folded by identical stacks) for the
live routes, ``rootcause`` (torchrun's "Root Cause (first observed failure)") for ``log``,
``torchfr`` (torch's own `torchfrtrace`) for ``fr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LIVE = ("hang", "watch")
DEAD = ("log",)
ALL_ROUTES = ("hang", "watch", "log", "fr")


@dataclass(frozen=True)
class Fault:
    name: str
    family: str  # desync, outside, process, launch, no-culprit (docs/faults.md sections)
    what: str  # what the job does, in a sentence
    right: str  # what a right verdict says
    classes: tuple[str, ...]  # accepted verdict classes (the first is the one it is)
    routes: tuple[str, ...]  # the routes that can see it
    mode: str = "manual"
    culprits: int = 1  # how many ranks inject it (0: no culprit)
    min_ranks: int = 2
    launcher: str = "torchrun"  # torchrun | independent (srun-like) | rdzv (a node missing)
    outcome: str = "hang"  # hang (collective timeout ends it) | dies | ends (exits 0)
    # the culprit's rank is not the rank that injected it (for a rank never started, the
    # missing rank) or the culprit set is "none" whatever ranks inject
    culprit_is: str = "injector"  # injector | none
    notes: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    # whether its ranks survive it (the quick subset runs such cases one after another in
    # shared jobs): gloo aborts a rank on some mismatches (SIGABRT), which ends the job
    survivable: bool = True


def F(*args: object, **kw: object) -> Fault:
    return Fault(*args, **kw)  # type: ignore[arg-type]


DESYNC_LIVE = ("hang", "watch", "log", "fr")

FAULTS: tuple[Fault, ...] = (
    # --- desyncs -------------------------------------------------------------------------
    F("skip_collective", "desync", "the culprit skips the step's gradient all_reduce",
      "the culprit is in a different collective (or one behind) from the rest; the others are "
      "victims", ("desync",), DESYNC_LIVE),
    F("extra_collective", "desync", "the culprit issues an extra all_reduce",
      "the culprit is one collective ahead / in an all_reduce the others never issue",
      ("desync",), DESYNC_LIVE),
    F("reordered_collectives", "desync",
      "the culprit issues the control broadcast before the gradient all_reduce",
      "the culprit's collectives are in another order: it waits in a different op",
      ("desync",), DESYNC_LIVE),
    F("other_op", "desync", "the culprit calls all_gather where the others all_reduce",
      "the culprit is in another op at the same sequence number", ("desync",), DESYNC_LIVE),
    F("dtype_mismatch", "desync", "the culprit all_reduces float64 where the others use float32",
      "the culprit's collective differs in dtype", ("desync",), DESYNC_LIVE, survivable=False),
    F("shape_mismatch", "desync", "the culprit's gradient all_reduce has 5 more elements",
      "the culprit's collective differs in size; gloo may return wrong sums before it hangs, "
      "and no NCCL advice applies", ("desync",), DESYNC_LIVE, survivable=False),
    F("wrong_broadcast_src", "desync", "the culprit broadcasts from itself where the rest use "
      "rank 0", "the culprit's broadcast names another source", ("desync",), DESYNC_LIVE),
    F("p2p_wrong_peer", "desync", "a pipeline stage sends its activation to the wrong stage",
      "the sender is the culprit, not the stage left waiting for it", ("desync",),
      DESYNC_LIVE, mode="pipeline", min_ranks=4),
    F("pg_creation_order", "desync", "the culprit creates the pair groups in another order",
      "the culprit's group creation order differs; the others wait in new_group",
      ("desync", "launch"), ("hang", "watch", "log"), mode="subgroup", min_ranks=4, survivable=False),
    F("new_group_not_all", "desync", "the culprit does not call new_group for the last pair",
      "the culprit never joined the group creation the others wait in", ("desync", "launch"),
      ("hang", "watch", "log"), mode="subgroup", min_ranks=4, survivable=False),
    F("subgroup_skip", "desync", "the culprit skips its pair group's all_reduce",
      "the culprit, not its pair partner left waiting alone in the subgroup", ("desync",),
      DESYNC_LIVE, mode="subgroup", min_ranks=4, survivable=False),
    F("ddp_skip_backward", "desync", "DDP: the culprit's step calls the unwrapped module, so "
      "its backward runs no gradient bucket all_reduce", "the culprit is in another collective "
      "than DDP's gradient all_reduce the others wait in", ("desync",), DESYNC_LIVE,
      mode="ddp", extra={"fault": "skip_backward_sync"}),
    F("fsdp2_skip_backward", "desync", "FSDP2 (fully_shard): the culprit's step skips the "
      "sharded model, so it never joins the all_gather/reduce_scatter", "the culprit is "
      "outside the FSDP collectives the others wait in", ("desync",), DESYNC_LIVE,
      mode="fsdp2", extra={"fault": "skip_backward_sync"}),
    F("nan_branch", "desync", "the culprit's loss turns NaN and its loop skips the batch "
      "(backward and all_reduce)", "the culprit is a step behind / in another collective; its "
      "NaN skip is the cause", ("desync",), DESYNC_LIVE),
    F("uneven_last_batch", "desync", "the culprit's data shard has fewer batches: it leaves the "
      "loop for the final barrier", "the culprit is in barrier while the rest wait in the "
      "step's all_reduce", ("desync",), DESYNC_LIVE),
    # --- outside any collective ----------------------------------------------------------
    F("thread_lock", "outside", "the culprit waits for a lock another of its threads holds",
      "the culprit is blocked on a lock outside any collective", ("blocked",),
      ("hang", "watch", "log", "fr")),
    F("flock", "outside", "the culprit waits for a file lock its child process holds",
      "the culprit is blocked in flock; the holder is named", ("blocked",),
      ("hang", "watch", "log", "fr")),
    F("fifo_read", "outside", "the culprit opens a FIFO nobody writes",
      "the culprit is blocked in I/O outside any collective", ("blocked",),
      ("hang", "watch", "log", "fr")),
    F("socket_read", "outside", "the culprit reads a socket whose peer never writes",
      "the culprit is blocked in recv outside any collective", ("blocked",),
      ("hang", "watch", "log", "fr")),
    F("input_prompt", "outside", "the culprit asks input() a question without a newline",
      "the culprit waits for input; the prompt does not hide the other ranks' tracebacks",
      ("blocked",), ("hang", "watch", "log", "fr")),
    F("queue_dead_producer", "outside", "the culprit's prefetch thread dies; the main thread "
      "waits in queue.get", "the culprit is blocked in queue.get; its dead producer's "
      "exception is the cause", ("blocked", "exception"), ("hang", "watch", "log", "fr")),
    F("thread_exception_hook", "outside", "as queue_dead_producer, with "
      "mldebug.install_excepthook printing the thread's exception", "the culprit, from the "
      "thread exception mldebug's hook printed", ("blocked", "exception"),
      ("hang", "watch", "log", "fr")),
    F("dataloader_stuck", "outside", "the culprit's DataLoader worker never returns a batch",
      "the culprit waits for its DataLoader; the worker's stuck frame is shown", ("blocked",),
      ("hang", "watch", "log", "fr")),
    F("dataloader_crash", "process", "the culprit's DataLoader worker raises", "the culprit, "
      "with the worker's Original Traceback frame", ("exception",), ("log",), outcome="dies"),
    F("gil_hold", "outside", "the culprit is in a C call that holds the GIL",
      "the culprit is frozen outside any collective (no Python thread runs)",
      ("blocked", "spinning"), ("hang", "watch", "log")),
    F("busy_python", "outside", "the culprit spins in a Python loop",
      "the culprit is spinning outside any collective", ("spinning",),
      ("hang", "watch", "log", "fr")),
    F("busy_forward", "outside", "the culprit loops in the model's forward",
      "the culprit is spinning in the forward, outside any collective", ("spinning",),
      ("hang", "watch", "log", "fr")),
    F("long_eval", "outside", "the culprit runs an evaluation longer than the timeout",
      "the culprit is busy in evaluate() while the rest wait", ("spinning",),
      ("hang", "watch", "log", "fr")),
    F("long_checkpoint", "outside", "the culprit writes a checkpoint slower than the timeout",
      "the culprit is in save_checkpoint while the rest wait", ("blocked", "spinning"),
      ("hang", "watch", "log", "fr")),
    # --- process faults ------------------------------------------------------------------
    F("sigkill", "process", "the culprit is SIGKILLed (the OOM killer)",
      "the culprit died of SIGKILL; the others were stopped by the launcher", ("dead",),
      ("log",), outcome="dies"),
    F("sigsegv", "process", "the culprit segfaults", "the culprit died of SIGSEGV",
      ("dead",), ("log",), outcome="dies"),
    F("sigstop", "process", "the culprit is SIGSTOPped", "the culprit is stopped (state T); "
      "the others wait for it", ("stopped",), ("hang", "watch", "log")),
    F("exit0", "process", "the culprit leaves the loop with exit(0)", "the culprit exited "
      "early; the others time out waiting for it", ("dead",), ("hang", "watch", "log", "fr")),
    F("exception", "process", "the culprit raises RuntimeError mid-step", "the culprit's "
      "exception is the first failure", ("exception",), ("log",), outcome="dies"),
    # --- launch faults -------------------------------------------------------------------
    F("world_size_hardcoded", "launch", "every rank passes world_size twice what was launched",
      "no rank is the culprit: the world size in the code does not match the launch",
      ("launch",), ("hang", "watch", "log"), culprits=0),
    F("master_port_mismatch", "launch", "the culprit connects to another MASTER_PORT",
      "the culprit never reached the store; the others wait in init for it", ("launch",),
      ("hang", "watch", "log")),
    F("rank_never_started", "launch", "srun-style launch where the culprit's process never "
      "starts", "the missing rank is the culprit", ("launch", "dead"),
      ("hang", "watch", "log"), launcher="independent"),
    F("rendezvous_timeout", "launch", "torchrun --nnodes 2 where the second node never comes",
      "no rank is the culprit: the rendezvous timed out waiting for a node", ("launch",),
      ("log",), culprits=0, launcher="rdzv", outcome="dies"),
    F("dist_store_error", "launch", "the culprit never publishes the store key the others "
      "wait for", "the culprit did not set the key; the others' DistStoreError is a "
      "consequence", ("launch", "desync"), ("hang", "watch", "log")),
    # --- no culprit ----------------------------------------------------------------------
    F("healthy", "no-culprit", "every rank trains normally", "no suspect, no hang",
      ("healthy",), ("hang", "watch", "log"), culprits=0, outcome="ends"),
    F("healthy_dataloader", "no-culprit", "every rank trains normally from a DataLoader "
      "with a worker", "no suspect, no hang", ("healthy",), ("hang", "watch", "log"),
      culprits=0, outcome="ends"),
    F("slow_straggler", "no-culprit", "one rank is 1.5 step-times slower every step but "
      "never stuck", "no hang: slow, not stuck (no suspect)", ("healthy",),
      ("hang", "watch", "log"), culprit_is="none", outcome="ends"),
    F("healthy_ddp", "no-culprit", "DDP trains normally", "no suspect, no hang", ("healthy",),
      ("hang", "watch", "log"), culprits=0, mode="ddp", outcome="ends",
      extra={"fault": "healthy"}),
    F("network_stall", "no-culprit", "the network below the collective stalls mid-step (the "
      "job's loopback taken down in its own network namespace)", "no rank is the culprit: "
      "every rank idle in the same collective; look below it (network, device)", ("network",),
      ("hang", "watch", "log", "fr"), culprits=0, launcher="netns", survivable=False),
    F("two_jobs_one_hung", "desync", "two jobs on one node: one trains normally, the other's "
      "culprit skips a collective; `mldebug hang` looks at both", "the hung job's culprit "
      "alone; no suspect in the healthy job", ("desync",), ("hang", "watch"),
      launcher="two-jobs", survivable=False,
      extra={"fault": "skip_collective", "min_timeout": "20"}),
    F("scheduler_sigterm", "no-culprit", "the scheduler SIGTERMs the whole job mid-training",
      "no rank is the culprit: the job was terminated from outside", ("healthy", "launch"),
      ("log",), culprits=0, outcome="dies"),
)

BY_NAME = {f.name: f for f in FAULTS}
CLASSES = ("desync", "blocked", "spinning", "stopped", "dead", "exception", "launch",
           "network", "healthy")


def job_fault(f: Fault) -> str:
    """The name the job knows the fault by (several classes share one injection)."""
    return f.extra.get("fault", f.name)
