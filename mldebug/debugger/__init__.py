"""Debuggers for any rank of any node.

- ``hooks``: ``breakpoint(rank=...)`` and ``post_mortem()`` - choose the route below.
- ``forked``: pdb on the rank's terminal (forked children, multiprocessing, torchrun).
- ``remote``: pdb served on 127.0.0.1 with a token when the rank has no terminal.
- ``ide``: debugpy on 127.0.0.1 for VS Code / PyCharm.
- ``registry``, ``wire``, ``client``, ``node``: the session files, the protocol, the
  terminal client and the node script of ``mldebug pdb`` (all stdlib-only: they run on nodes).
- ``collect``, ``model``, ``analyze``, ``report``: ``mldebug pdb list`` across nodes.
"""
