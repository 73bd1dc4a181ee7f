"""Inf/nan and under/overflow detection, and tensor inspection.

Importing this package imports torch; ``mldebug`` itself only imports it when one of these
names is first used (``from mldebug import DebugUnderflowOverflow``).
"""

from __future__ import annotations

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

__all__ = [
    "DebugUnderflowOverflow",
    "Entry",
    "ModuleCall",
    "HeadroomWarning",
    "OverflowDetected",
    "OverflowReport",
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
