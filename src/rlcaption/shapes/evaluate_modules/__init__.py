"""The shapes benchmark's `evaluate` metric module (scene grounding), loaded by `rlcaption.metrics.load_metric`."""
