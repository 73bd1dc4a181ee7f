"""``mldebug dist-test``: can every rank init, all_reduce, barrier and allocate?

- ``worker.py``: what each rank runs (imports torch), and the local launch (``--nproc``)
- ``report.py``: the ranks' results -> findings (pure) -> render / ``--json``
"""
