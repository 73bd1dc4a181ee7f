"""The node script's real output has the shape tests/envfacts.BASE assumes (no drift)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from envfacts import BASE

from mldebug.env.facts import NodeFacts

NODE = Path(__file__).resolve().parent.parent / "mldebug" / "env" / "node.py"


def test_node_script_document_matches_the_synthetic_base() -> None:
    r = subprocess.run([sys.executable, str(NODE), "--torch-timeout", "20"], capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("MLDEBUG-JSON "))
    real = json.loads(line[len("MLDEBUG-JSON "):])
    missing = set(BASE) - set(real)
    assert not missing, f"envfacts.BASE has keys node.py does not print: {missing}"
    for key, value in BASE.items():
        if isinstance(value, dict) and value and isinstance(real[key], dict) and real[key]:
            extra = set(value) - set(real[key]) - {"driver", "devices", "p2p", "cuda", "hip",
                                                   "nccl", "cuda_build", "installed"}
            assert not extra, f"{key}: {extra} not in the real document"
    facts = NodeFacts.from_dict(real)
    assert facts.os.get("glibc") is not None and isinstance(real["packages"], dict)
