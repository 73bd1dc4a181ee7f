"""Environment and NCCL diagnostics: facts -> rules -> findings, and NCCL log parsing.

- ``node.py``: stdlib-only script that gathers one node's facts (run locally or over pdsh/srun)
- ``collect.py``: runs it through ``mldebug.fanout.run_script``
- ``facts.py``: the facts as dataclasses; ``rules.py``: checks; ``diff.py``: across nodes
- ``ifname.py``: NCCL_SOCKET_IFNAME / NCCL_IB_HCA syntax; ``presets.py``: debug env presets
- (NCCL log parsing lives in ``mldebug.nccllog``)

Nothing here imports torch.
"""
