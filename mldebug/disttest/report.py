"""dist-test results: one ``RankResult`` per rank -> findings (pure) -> rendering.

Each rank of a ``--nproc`` launch also prints its result as one ``MLDEBUG-JSON`` line, which
the launching process reads back into ``RankResult``s; ``analyze`` names what failed where,
with a fix, so ``--json`` carries findings like every other command.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from mldebug.findings import Finding, Severity, findings_to_json, render_findings
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA = "mldebug.dist-test/1"


@dataclass
class RankResult:
    """What one rank found: ``status`` is ok, fail or timeout; ``step`` the check it was in."""

    rank: int
    world_size: int
    host: str = ""
    local_rank: int = 0
    status: str = "ok"
    step: str = ""
    message: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankResult:
        return cls(rank=int(d["rank"]), world_size=int(d["world_size"]),
                   host=str(d.get("host", "")), local_rank=int(d.get("local_rank") or 0),
                   status=str(d.get("status", "ok")), step=str(d.get("step", "")),
                   message=str(d.get("message", ""))[:500],
                   versions={str(k): str(v) for k, v in (d.get("versions") or {}).items()})


@dataclass
class DistTestReport:
    world_size: int
    ranks: list[RankResult]
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.severity is not Severity.ERROR for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "ok": self.ok, "world_size": self.world_size,
                "ranks": [asdict(r) for r in sorted(self.ranks, key=lambda r: r.rank)],
                "findings": findings_to_json(self.findings)}


NCCL_WITHOUT_CUDA = "backend nccl needs CUDA, and this torch sees no GPU"

_STEP_FIX = {
    "init_process_group": "Check that every rank reaches MASTER_ADDR:MASTER_PORT "
                          "(mldebug env --check-port) and that the backend is built into torch.",
    "all_reduce": "Check the network between the ranks (mldebug env --nodes ...); rerun with "
                  "NCCL_DEBUG=INFO and read it with mldebug nccl-log.",
    "barrier": "Check the network between the ranks (mldebug env --nodes ...).",
    "device allocation": "Check the device is free and healthy (nvidia-smi).",
}


def analyze(world_size: int, ranks: list[RankResult], launcher_rc: int | None = None,
            ) -> DistTestReport:
    """Findings from the ranks' results: timeouts, failures, ranks that never reported."""
    report = DistTestReport(world_size, ranks)
    by_kind: dict[tuple[str, str, str], list[int]] = {}
    for r in ranks:
        if r.status != "ok":
            by_kind.setdefault((r.status, r.step, r.message if r.status == "fail" else ""),
                               []).append(r.rank)
    for (status, step, message), bad in sorted(by_kind.items(), key=lambda kv: min(kv[1])):
        who = f"rank{'s' if len(bad) > 1 else ''} {fold_ints(bad)}"
        if status == "timeout":
            report.findings.append(Finding(
                Severity.ERROR, f"{step} did not complete on {who}",
                detail="another rank never joined it (it may have failed, hung or taken "
                       "another code path)",
                fix="Run 'mldebug hang' while it waits to see where every rank is; raise "
                    "--timeout if the network is just slow.",
                code="dist-test-timeout"))
        elif message.startswith(NCCL_WITHOUT_CUDA):
            report.findings.append(Finding(
                Severity.ERROR, f"{message} ({who})",
                fix="Use --backend gloo on CPU, or run where torch.cuda.is_available() is True.",
                code="dist-test-nccl-without-cuda"))
        else:
            report.findings.append(Finding(
                Severity.ERROR, f"{step} failed on {who}", detail=message,
                fix=_STEP_FIX.get(step, "Rerun with MLDEBUG_VERBOSE=1 for the traceback."),
                code="dist-test-failed"))
    missing = sorted(set(range(world_size)) - {r.rank for r in ranks}) if world_size <= 1 << 16 else []
    if missing:
        report.findings.append(Finding(
            Severity.ERROR, f"rank{'s' if len(missing) > 1 else ''} {fold_ints(missing)} "
                            f"of {world_size} never reported",
            detail=f"the launcher exited with code {launcher_rc}" if launcher_rc else "",
            fix="The rank crashed or was killed before its checks ended: its output above "
                "says why; rerun with MLDEBUG_VERBOSE=1.",
            code="dist-test-missing-ranks"))
    if not report.findings:
        report.findings.append(Finding(
            Severity.INFO, f"all {world_size} ranks passed init_process_group, all_reduce, "
                           "barrier and device allocation", code="dist-test-ok"))
    return report


def render(report: DistTestReport, console: Console) -> None:
    """The findings of a dist-test run (the ranks' own lines were printed as they ran)."""
    render_findings(report.findings, console)
