"""Flight recorder: dumps on demand for any backend, safe loading, cross-rank analysis.

In the training script (after or before ``init_process_group``)::

    import mldebug.fr
    mldebug.fr.enable()

then, while the job runs or hangs, ``mldebug fr trigger`` and ``mldebug fr analyze DIR``.
Importing this package never imports torch.
"""

from __future__ import annotations

from mldebug.fr.recorder import Recorder, default_dir, dump, enable, native_env

__all__ = ["Recorder", "default_dir", "dump", "enable", "native_env"]
