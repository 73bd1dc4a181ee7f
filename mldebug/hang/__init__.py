"""mldebug hang: live stacks of every rank, grouped, with the odd ones out named.

Layers: ``node`` (stdlib-only collector that runs on each node), ``collect`` (local and
fan-out collection, save/load), ``model`` (dataclasses), ``pyspy`` (parsing py-spy JSON and
text dumps), ``analyze`` (pure grouping and suspect selection), ``report`` (rendering).
"""
