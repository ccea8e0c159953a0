"""`evaluate` metric modules of the caption metrics, shipped as files and loaded by path.

Load them with `rlcaption.metrics.load_metric(name)`, which calls `evaluate.load` on the file, so they work offline.
"""
