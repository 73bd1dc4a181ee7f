"""Inf/nan and under/overflow detection, tensor inspection, and the distributed NaN sentinel.

The names below are resolved on first use: ``import mldebug.numerics`` (and the torch-free
``mldebug.numerics.records``, which ``mldebug numerics report`` reads with) does not import
torch; ``from mldebug.numerics import DebugUnderflowOverflow`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mldebug.lazy import exports

if TYPE_CHECKING:  # the real types for type checkers; at run time resolved on first use
    from mldebug.numerics.detector import DebugUnderflowOverflow, OverflowDetected
    from mldebug.numerics.inspection import (
        TensorStats,
        detect_overflow,
        lovely,
        patch_tensor_repr,
        tensor_info,
        tensor_info_dict,
        tensor_stats,
        unpatch_tensor_repr,
    )
    from mldebug.numerics.report import (
        Entry,
        HeadroomWarning,
        ModuleCall,
        OverflowReport,
        render_report,
    )
    from mldebug.numerics.sentinel import NanSentinel, NonFiniteDetected, ReplicasDiverged

_LAZY: dict[str, str] = {
    "DebugUnderflowOverflow": "mldebug.numerics.detector",
    "OverflowDetected": "mldebug.numerics.detector",
    "TensorStats": "mldebug.numerics.inspection",
    "detect_overflow": "mldebug.numerics.inspection",
    "lovely": "mldebug.numerics.inspection",
    "patch_tensor_repr": "mldebug.numerics.inspection",
    "tensor_info": "mldebug.numerics.inspection",
    "tensor_info_dict": "mldebug.numerics.inspection",
    "tensor_stats": "mldebug.numerics.inspection",
    "unpatch_tensor_repr": "mldebug.numerics.inspection",
    "Entry": "mldebug.numerics.report",
    "HeadroomWarning": "mldebug.numerics.report",
    "ModuleCall": "mldebug.numerics.report",
    "OverflowReport": "mldebug.numerics.report",
    "render_report": "mldebug.numerics.report",
    "NanSentinel": "mldebug.numerics.sentinel",
    "NonFiniteDetected": "mldebug.numerics.sentinel",
    "ReplicasDiverged": "mldebug.numerics.sentinel",
}

__all__ = [
    "DebugUnderflowOverflow",
    "Entry",
    "HeadroomWarning",
    "ModuleCall",
    "NanSentinel",
    "NonFiniteDetected",
    "OverflowDetected",
    "OverflowReport",
    "ReplicasDiverged",
    "TensorStats",
    "detect_overflow",
    "lovely",
    "patch_tensor_repr",
    "render_report",
    "tensor_info",
    "tensor_info_dict",
    "tensor_stats",
    "unpatch_tensor_repr",
]


__getattr__, __dir__ = exports('mldebug.numerics', _LAZY, globals())
