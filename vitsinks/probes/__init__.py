"""The frozen-backbone probes: features and their cache, the linear and dense heads, the probe protocols, the metrics
and the typed results (run by `python -m vitsinks.eval.linear` and `python -m vitsinks.eval.dense`)."""
