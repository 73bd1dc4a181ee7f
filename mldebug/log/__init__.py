"""Post-mortem of a dead job from its logs alone: the rank that failed first, the ranks that
never reached the collective the others timed out in, OOM kills, NCCL warnings.

collect.py reads files (the only I/O), parse.py turns lines into per-rank state (pure),
analyze.py turns that state into findings, report.py renders them.
"""
