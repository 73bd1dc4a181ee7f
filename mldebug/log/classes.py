"""The fault class each `mldebug log` verdict code names (the fault matrix's vocabulary,
docs/faults.md): the ``class`` of log's JSON verdict (mldebug.cli.envelope)."""

from __future__ import annotations

CLASSES: dict[str, str] = {
    "log-first-failure-exception": "exception", "log-first-failure-cuda-oom": "exception",
    "log-first-failure-cuda-error": "exception", "log-first-failure-nccl-error": "exception",
    "log-first-failure-overflow": "exception", "log-first-failure-dataloader-killed": "dead",
    "log-killed": "dead", "log-crash": "dead", "log-exit-no-traceback": "dead",
    "log-watchdog-stall": "outside", "log-monitored-barrier": "outside",
    "log-silent-rank": "outside", "log-phase-tiebreak": "outside",
    "log-size-mismatch": "desync", "log-rank-behind": "desync",
    "log-collective-mismatch": "desync", "log-fingerprint-mismatch": "desync",
    "log-launcher-failed": "launch", "log-launcher-root": "launch", "log-launch": "launch",
    "log-all-waiting": "network", "log-stopped": "stopped", "log-terminated": "healthy",
}


def class_of(code: str) -> str | None:
    """The class of a verdict code; a first failure of a kind not listed is an exception."""
    if code in CLASSES:
        return CLASSES[code]
    return "exception" if code.startswith("log-first-failure-") else None
