"""``mldebug nccl-log``: read NCCL_DEBUG=INFO output and say what NCCL chose and where it failed.

collect/parse (``parse.py``: lines -> ``ParsedLog``) -> model (``model.py``) -> analysis
(``analyze.py``, rules for known causes in ``rules.py``) -> ``report.py`` (``render``).
Nothing here imports torch.
"""
