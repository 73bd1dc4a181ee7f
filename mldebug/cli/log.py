"""mldebug log: post-mortem of a dead job from its logs - who failed first, who never arrived."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mldebug.cli._common import add_json_argument, check_seconds, finite_float, print_report

if TYPE_CHECKING:
    from mldebug.log.pods import PodLogOptions

DESCRIPTION = """\
Read what a dead job left - the launcher's log with every rank's lines interleaved, per-rank
files (torchrun --log-dir, srun --output=log-%t), or standard input - and name the culprit:

  - the rank whose real error came first (the others' timeouts are named as consequences),
  - a rank killed by SIGKILL (the kernel OOM killer) or crashed by a signal,
  - the ranks whose last enqueued NCCL work is behind the others' (PyTorch watchdog lines),
  - ranks that issued a different collective at the same sequence number,
  - ranks that said nothing while every other rank timed out (stuck outside the collective).

Reads [rankN]: / [defaultN]: / srun -l / mpirun --tag-output prefixes and the times on
PyTorch's log lines. NCCL WARN lines are grouped; `mldebug nccl-log` explains them.

  mldebug log train.log
  mldebug log logs/                      a directory of per-rank files
  kubectl logs job/train | mldebug log -
  mldebug log --k8s-job llama -n training  every pod's log (and a restarted pod's previous
                                         container's, where the crash is), via kubectl logs

Exit code 0 whenever the logs were read (whatever the verdict); 2 for a bad path or option."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from mldebug.k8s import LOG_LIMIT_BYTES, LOG_TIMEOUT

    p.add_argument("files", nargs="*", metavar="FILE",
                   help="log files, directories of per-rank logs, or - for standard input")
    p.add_argument("--world-size", type=int, metavar="N",
                   help="ranks the job had (finds ranks that printed nothing at all)")
    add_json_argument(p)
    g = p.add_argument_group("Kubernetes pods' logs, via kubectl logs (docs/k8s.md)")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--k8s", metavar="SELECTOR",
                       help="the logs of the pods matching this label selector, e.g. "
                            "training.kubeflow.org/job-name=llama")
    where.add_argument("--k8s-job", metavar="NAME",
                       help="the logs of the pods of this PyTorchJob, JobSet or Job")
    g.add_argument("--namespace", "-n", metavar="NS",
                   help="the pods' namespace (default: the kubectl context's)")
    g.add_argument("--context", metavar="NAME", help="the kubectl context")
    g.add_argument("--kubeconfig", metavar="FILE", help="the kubeconfig file kubectl reads")
    g.add_argument("--container", "-c", metavar="NAME",
                   help="the container whose log is read (default: the pod's default container)")
    g.add_argument("--previous", action=argparse.BooleanOptionalAction, default=True,
                   help="also read the previous container of a pod whose status shows a "
                        "restart (kubectl logs --previous: the run that crashed) (default: on)")
    g.add_argument("--limit-bytes", type=int, default=LOG_LIMIT_BYTES, metavar="N",
                   help=f"bytes of each container's log read (kubectl --limit-bytes; "
                        f"default: {LOG_LIMIT_BYTES >> 20} MiB)")
    g.add_argument("--tail", type=int, metavar="LINES",
                   help="the last LINES lines of each log (kubectl --tail; default: 200000 - "
                        "the end, where a crash is, within --limit-bytes; 0: only the bytes "
                        "cap, from the start)")
    g.add_argument("--timeout", type=finite_float, default=LOG_TIMEOUT, metavar="S",
                   help=f"seconds each kubectl logs may take (default: {LOG_TIMEOUT:g})")
    g.add_argument("--fanout", type=int, default=32, metavar="N",
                   help="pods' logs read at once (default: 32)")


def _pod_options(args: argparse.Namespace) -> PodLogOptions | None:
    from mldebug.errors import UsageError
    from mldebug.k8s import K8sTarget, check_target
    from mldebug.log.pods import PodLogOptions

    if args.k8s is None and args.k8s_job is None:
        for opt in ("namespace", "context", "kubeconfig", "container", "tail"):
            if getattr(args, opt) is not None:
                raise UsageError(f"--{opt} is for Kubernetes pods.",
                                 "Add --k8s SELECTOR or --k8s-job NAME (docs/k8s.md).")
        if not args.files:
            raise UsageError("no log to read.", "Pass log files, a directory, - for standard "
                             "input, or --k8s SELECTOR / --k8s-job NAME for pods' logs.")
        return None
    check_seconds("--timeout", args.timeout)
    if not 0 < args.limit_bytes <= 1 << 40:
        raise UsageError("--limit-bytes must be between 1 and 1 TiB.", "Pass e.g. --limit-bytes "
                         "33554432 (32 MiB).")
    if args.tail is not None and not 0 <= args.tail <= 1 << 30:
        raise UsageError("--tail must be between 0 and 2**30 lines.", "Pass e.g. --tail 100000.")
    if not 1 <= args.fanout <= 4096:
        raise UsageError("--fanout must be between 1 and 4096.", "Pass e.g. --fanout 32.")
    t = check_target(K8sTarget(selector=args.k8s, job=args.k8s_job, namespace=args.namespace,
                               context=args.context, kubeconfig=args.kubeconfig,
                               container=args.container))
    tail = DEFAULT_TAIL if args.tail is None else (None if args.tail == 0 else args.tail)
    return PodLogOptions(t, previous=args.previous, limit_bytes=args.limit_bytes,
                         tail=tail, timeout=args.timeout, fanout=args.fanout)


DEFAULT_TAIL = 200000  # kubectl --tail: a log's end is where the crash is (0: not passed)


def run(args: argparse.Namespace) -> int:
    from mldebug.errors import UsageError
    from mldebug.log.analyze import analyze
    from mldebug.log.collect import load
    from mldebug.log.report import render
    from mldebug.render import console

    if args.world_size is not None and not 0 < args.world_size <= 1 << 20:
        raise UsageError("--world-size must be between 1 and 1048576.", "Pass the job's number of ranks.")
    pods = _pod_options(args)
    if pods is None:
        report = analyze(load(args.files, args.world_size))
    else:
        from mldebug.log.pods import read_pods

        report = analyze(load(args.files, args.world_size,
                              pods=lambda parser: read_pods(pods, parser)))
    print_report(report, args.json, lambda r: render(r, console()))
    return 0
