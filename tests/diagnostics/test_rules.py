"""The sink rules: one typed representation of the `diagnostics` settings, read by every consumer."""

from __future__ import annotations

import numpy as np
import pytest

from vitsinks.configs.schema import load_config
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.summary import rule_record
from vitsinks.utils.errors import BadValue


def fields() -> dict[str, np.ndarray]:
    # four heads: a routed NOP-like sink, a routed broadcast-like one with a high stable rank, no sink, a def1 sink
    return {"routed_frac": np.array([0.95, 0.92, 0.5, 0.89]), "min_a": np.array([0.1, 0.2, 0.1, 0.8]),
            "ratio_out": np.array([0.1, 0.7, 0.9, 0.6]), "ratio_head": np.array([0.6, 0.7, 0.1, 0.1]),
            "stable_rank": np.array([1.0, 3.0, 1.0, 1.2])}


def test_the_rules_of_the_config_are_the_config() -> None:
    cfg = load_config(["diagnostics.rule=def1", "diagnostics.eps=0.3", "diagnostics.ratio=ratio_head",
                       "diagnostics.use_stable_rank=false"])
    assert SinkRules.from_config(cfg.diagnostics) == SinkRules("def1", 0.3, "ratio_head", False)
    assert SinkRules.from_config(load_config().diagnostics) == SinkRules()  # the dataclass defaults agree


def test_events_and_classes_follow_each_setting() -> None:
    d = fields()
    assert SinkRules().event_class(d).tolist() == ["nop", "other", "none", "none"]  # rank 3.0 > 1.5: not broadcast
    assert SinkRules(use_stable_rank=False).event_class(d).tolist() == ["nop", "broadcast", "none", "none"]
    assert SinkRules("def1", 0.3).event_class(d).tolist() == ["none", "none", "none", "broadcast"]
    assert SinkRules(ratio="ratio_head").classify(d).tolist() == [1, 2, 0, 0]
    with pytest.raises(BadValue, match="eps"):
        SinkRules("def1", 0.6).events(d)


def test_the_record_is_what_summaries_store_and_reads_back() -> None:
    rules = SinkRules("def1", 0.2, "ratio_head", False)
    stored = rule_record(rules, n_blocks=4)
    assert {k: stored[k] for k in rules.record()} == rules.record() and stored["blocks_counted"] == "1..L-1"
    assert SinkRules.from_record(stored) == rules
