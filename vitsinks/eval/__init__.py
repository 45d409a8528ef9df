"""Frozen-backbone evaluation: the linear probe (`vitsinks.eval.linear`) and the dense probes (`vitsinks.eval.dense`).

What a finished run gets with `eval.after_train=true` is `vitsinks.run.pipeline.after_train`.
"""
