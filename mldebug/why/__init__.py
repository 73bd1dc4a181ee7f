"""mldebug why: join what every reader found about one job into one verdict.

``model`` holds the plain evidence items (what a reader claimed, from which source, over which
ranks), ``collect`` walks and sniffs the inputs (bounded, by content), ``join`` is the pure
decision. The readers themselves (log, fr, hang, numerics) are called by ``mldebug.cli.why``,
which turns each one's report into evidence items: capabilities never import each other.
"""
