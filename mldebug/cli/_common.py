"""Argument groups shared by commands: where to run (--nodes/--hostfile/--slurm-job/--k8s),
output."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mldebug.errors import UsageError

if TYPE_CHECKING:  # the fan-out (subprocess, json, dataclasses) loads when a command runs
    from mldebug.fanout import FanoutOptions

TIMEOUT_HELP = ("seconds each node may take to answer once ssh has connected (locally: this "
                "host); a node still busy then is reported as timed out")


def add_target_arguments(p: argparse.ArgumentParser, *, default_timeout: float = 30.0,
                         timeout_help: str = TIMEOUT_HELP) -> None:
    """--nodes / --hostfile / --slurm-job / --k8s / --k8s-job, --exclude and the fan-out knobs
    (with kubectl's --namespace, --context, --kubeconfig, --container)."""
    g = p.add_argument_group("where to run (default: this host only; $WCOLL names a hostfile "
                             "as for pdsh)")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--nodes", "-w", metavar="HOSTLIST",
                       help="hosts to reach over pdsh/ssh, e.g. node[1-4,7]; the nodes need "
                            "only python3 and py-spy, not mldebug")
    where.add_argument("--hostfile", metavar="FILE",
                       help="hosts from a file: one per line, 'host slots=N' or 'host:N'")
    where.add_argument("--slurm-job", metavar="ID",
                       help="every node of this SLURM job, via srun --overlap")
    where.add_argument("--k8s", metavar="SELECTOR",
                       help="Kubernetes pods matching this label selector, over kubectl exec, "
                            "e.g. training.kubeflow.org/job-name=llama (docs/k8s.md)")
    where.add_argument("--k8s-job", metavar="NAME",
                       help="the pods of this PyTorchJob, JobSet or Job (by their operators' "
                            "job-name labels), over kubectl exec")
    g.add_argument("--namespace", "-n", metavar="NS",
                   help="with --k8s/--k8s-job: the pods' namespace (default: the kubectl "
                        "context's)")
    g.add_argument("--context", metavar="NAME", help="with --k8s/--k8s-job: the kubectl context")
    g.add_argument("--kubeconfig", metavar="FILE",
                   help="with --k8s/--k8s-job: the kubeconfig file kubectl reads")
    g.add_argument("--container", "-c", metavar="NAME",
                   help="with --k8s/--k8s-job: the container to exec into (default: the "
                        "pod's default container)")
    g.add_argument("--exclude", "-x", metavar="HOSTLIST",
                   help="leave these hosts out, e.g. node[3,9] (as pdsh -x)")
    g.add_argument("--timeout", type=float, default=default_timeout, metavar="S",
                   help=f"{timeout_help} (default: {default_timeout:g})")
    g.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                   help="seconds each ssh connection may take (default: 10)")
    g.add_argument("--fanout", type=int, default=64, metavar="N",
                   help="nodes contacted at once (default: 64)")
    g.add_argument("--remote-python", metavar="PATH",
                   help="Python on the nodes (default: this interpreter's path, else python3)")
    g.add_argument("--ssh-args", metavar="ARGS",
                   help="extra ssh options, e.g. '-F ~/.ssh/cluster_config' "
                        "(appended to PDSH_SSH_ARGS_APPEND)")


MAX_NUMBER = 1e9  # seconds: 31 years; MB: a petabyte - anything larger is a typo


def finite_float(text: str) -> float:
    """argparse ``type`` for every float option: ``inf``, ``nan``, ``1e400`` and magnitudes
    over 1e9 are refused with one line (argparse's usage error), never a traceback later."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if abs(value) > MAX_NUMBER:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range (at most {MAX_NUMBER:g})")
    return value


def check_seconds(option: str, value: float) -> float:
    """A duration option's value, refused when zero, negative, nan or infinite."""
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{option} must be positive and finite, not {value:g}.",
                         f"Pass seconds, e.g. {option} 30.")
    if value > MAX_NUMBER:
        raise UsageError(f"{option} {value:g} is out of range (at most {MAX_NUMBER:g} seconds).",
                         f"Pass seconds, e.g. {option} 30.")
    return value


def fanout_options(args: argparse.Namespace) -> FanoutOptions:
    """Where and how to run, from the options of ``add_target_arguments``.

    With none of --nodes/--hostfile/--slurm-job, ``$WCOLL`` (pdsh's hostfile variable) is
    read when set; otherwise the command runs on this host.
    """
    import os

    from mldebug.fanout import FanoutOptions
    from mldebug.hosts import expand, read_hostfile

    check_seconds("--timeout", args.timeout)
    check_seconds("--connect-timeout", args.connect_timeout)
    if getattr(args, "fanout", 1) < 1:
        raise UsageError("--fanout must be at least 1.", "Pass e.g. --fanout 64.")
    exclude = expand(args.exclude) if getattr(args, "exclude", None) else []
    opts = FanoutOptions(timeout=args.timeout, connect_timeout=args.connect_timeout,
                         fanout=args.fanout, remote_python=args.remote_python,
                         ssh_args=args.ssh_args, exclude=exclude)
    nodes = getattr(args, "nodes", None)
    if nodes is not None:
        if not nodes.strip():
            raise UsageError("--nodes is empty.", "Pass hosts, e.g. --nodes node[1-4]; "
                             "leave the option out to run on this host.")
        opts.hosts = expand(nodes)
    elif getattr(args, "hostfile", None):
        opts.hosts = read_hostfile(args.hostfile)
    elif getattr(args, "slurm_job", None):
        opts.slurm_job = str(args.slurm_job)
    elif getattr(args, "k8s", None) is not None or getattr(args, "k8s_job", None) is not None:
        from mldebug.k8s import K8sTarget, check_target

        opts.k8s = check_target(K8sTarget(
            selector=args.k8s, job=args.k8s_job, namespace=args.namespace,
            context=args.context, kubeconfig=args.kubeconfig, container=args.container))
    elif os.environ.get("WCOLL"):
        opts.hosts = read_hostfile(os.environ["WCOLL"])
    if exclude and opts.is_local:
        raise UsageError("--exclude needs a host list or a SLURM job.",
                         "Add --nodes, --hostfile or --slurm-job.")
    if opts.k8s is None:
        for opt in ("namespace", "context", "kubeconfig", "container"):
            if getattr(args, opt, None) is not None:
                raise UsageError(f"--{opt} is for Kubernetes pods.",
                                 "Add --k8s SELECTOR or --k8s-job NAME (docs/k8s.md).")
    return opts


def add_json_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--json", action="store_true",
                   help="print the whole report as JSON (schema in docs/)")


def add_show_secrets_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--show-secrets", action="store_true",
                   help="keep secrets (tokens, passwords, --api-key=... values, URL passwords) "
                        "in command lines, variables and saved files; redacted by default")


def print_report(report: Any, as_json: bool, render: Callable[[Any], None], *,
                 show_secrets: bool = False) -> None:
    """``--json``: the report's ``to_dict()`` as JSON on stdout (``print_doc``); otherwise
    ``render(report)``."""
    if as_json:
        print_doc(report.to_dict(), show_secrets=show_secrets)
    else:
        render(report)


def print_doc(doc: dict[str, Any], *, show_secrets: bool = False) -> None:
    """A command's ``--json`` document on stdout: in the envelope every command shares
    (``mldebug.cli.envelope``, docs/json.md), secrets redacted unless ``show_secrets``."""
    from mldebug.cli.envelope import wrap
    from mldebug.redact import redact_doc
    from mldebug.render import print_json

    doc = wrap(doc)
    print_json(doc if show_secrets else redact_doc(doc))


def job_targets(pid: int | None, job: str | None) -> list[dict[str, Any]]:
    """The rank processes on this host that --pid / --job select (``mldebug.ranks.find_ranks``'
    dicts; the caller's own processes only, every user's as root). Neither given: every rank.
    A selection that finds no rank is an error with the fix, never 'every job' (the rule
    'fr trigger', 'fr watch' and 'trace show' share with 'hang')."""
    import os

    from mldebug.errors import MldebugError
    from mldebug.nodekit import short_hostname
    from mldebug.ranks import find_ranks, list_processes

    uid = None if os.geteuid() == 0 else os.geteuid()
    # the host as 'mldebug hang' passes it: a loopback MASTER_ADDR key names it
    # (master:HOST/127.0.0.1:PORT), so --job takes the key hang prints
    targets, errors = find_ranks(list_processes(), pid=pid, uid=uid, host=short_hostname())
    if job is not None:
        targets = [t for t in targets if (t.get("job") or {}).get("key") == job]
    if not targets and (pid is not None or job is not None):
        why = "; ".join(str(e.get("error")) for e in errors[:3])
        what = " and ".join(w for w in (f"pid {pid}" if pid is not None else "",
                                        f"job {job!r}" if job is not None else "") if w)
        raise MldebugError(f"no rank process of {what} on this host" + (f" ({why})" if why
                                                                         else "") + ".",
                           "'mldebug hang' lists the jobs and their keys; pass the launcher's "
                           "pid (torchrun) or a key it prints.")
    return targets
