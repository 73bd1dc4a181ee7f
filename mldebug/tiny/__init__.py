"""Tiny models, tokenizers and datasets: shrink rules (pure), builders and validators.

``shrink`` holds the canonical size map and constraint fixing over plain config dicts;
``tokenizer``/``spm`` shrink tokenizers; ``make`` builds and validates a tiny model;
``layers`` cuts a real checkpoint's layer stack; ``dataset`` makes tiny datasets.
Heavy libraries (torch, transformers, datasets) are imported inside functions only.
"""
