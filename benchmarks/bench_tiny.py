"""make-tiny / shrink-layers figures, measured side by side in one run (not a test).

1. make-tiny over the 15-architecture matrix: seconds to shrink + build + validate + save
   (one process, after a warm-up), bytes on disk, and source/tiny parameter ratio.
2. shrink-layers: load time of a 24-layer checkpoint vs the same checkpoint cut to 2 layers
   with --out (sliced safetensors), best of 3 loads each.

Run: .venv/bin/python benchmarks/bench_tiny.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mldebug.tiny.layers import shrink_layers, time_load  # noqa: E402
from mldebug.tiny.make import human_bytes, make_tiny  # noqa: E402
from mldebug.tiny.shrink import ShrinkSpec  # noqa: E402

MATRIX = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma2", "gemma3",
          "gpt2", "gpt_neox", "t5", "bart", "bert", "whisper", "llava"]


def main() -> None:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_tiny("llama", root / "warmup", ShrinkSpec())  # imports, tokenizer training code
        print(f"{'model type':<12} {'build s':>8} {'on disk':>10} {'params src/tiny':>16}")
        total = 0.0
        for mt in MATRIX:
            t0 = time.perf_counter()
            r = make_tiny(mt, root / mt, ShrinkSpec())
            dt = time.perf_counter() - t0
            total += dt
            size = sum(p.stat().st_size for p in (root / mt).iterdir())
            print(f"{mt:<12} {dt:>8.2f} {human_bytes(size):>10} "
                  f"{r.params_before / r.params_after:>15.0f}x")
        print(f"matrix total: {total:.1f} s for {len(MATRIX)} architectures")

        big = root / "qwen3-24"
        spec = ShrinkSpec(hidden=512, heads=8, kv_heads=4, intermediate=2048, layers=24,
                          vocab=1024, explicit=frozenset({"hidden", "heads", "kv_heads",
                                                          "intermediate", "layers", "vocab"}))
        make_tiny("qwen3", big, spec, tokenizer=False)
        small = root / "qwen3-2"
        shrink_layers(big, 2, out=small, in_place=False, measure=False)
        time_load(small)  # warm-up
        before = min(time_load(big) for _ in range(3))
        after = min(time_load(small) for _ in range(3))
        size_b = sum(p.stat().st_size for p in big.glob("*.safetensors"))
        size_a = sum(p.stat().st_size for p in small.glob("*.safetensors"))
        print(f"shrink-layers 24 -> 2: weights {human_bytes(size_b)} -> {human_bytes(size_a)}, "
              f"load {before:.3f} s -> {after:.3f} s ({before / after:.1f}x faster)")


if __name__ == "__main__":
    main()
