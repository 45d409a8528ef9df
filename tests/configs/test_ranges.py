"""The Python API accepts what the command line accepts, setting by setting (`vitsinks.configs.ranges`): each value
around a declared bound is refused by a `vitsinks.pretrained` call exactly when the composed config with it is
refused by `check_config`, and the refusal names the command line's key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers.timm_models import CONFIGS, images, plant_sink, timm_vit
from vitsinks.configs.schema import load_config
from vitsinks.pretrained import diagnose, intervene
from vitsinks.pretrained.edit_calls import fit_massive, fit_w8a8, register_neurons
from vitsinks.utils.errors import BadValue, ConfigError

CALLS: list[tuple[Callable[[Any, Any, Any], Any], str, list[Any]]] = [
    (lambda m, x, v: fit_w8a8(m, x, weight_bits=v), "quant.weight_bits={}", [-3, 0, 1, 2, 16, 17]),
    (lambda m, x, v: fit_w8a8(m, x, act_bits=v), "quant.act_bits={}", [1, 2, 17]),
    (lambda m, x, v: fit_massive(m, x, massive=v), "trainfree.massive={}", [0, 1]),
    # k just above 1: random weights have no real artifact (tests/pretrained/test_edits_timm.py)
    (lambda m, x, v: register_neurons(m, x, top=v, k=1.05), "trainfree.neurons={}", [0, 1]),
    (lambda m, x, v: register_neurons(m, x, 2, k=v), "trainfree.outlier_k={}", [1.0, 1.05]),
    (lambda m, x, v: intervene(m, x, heads=[(1, 0)], edits=["zero_sink_value"], batch_size=v),
     "intervene.batch_size={}", [0, 1, 2]),
    (lambda m, x, v: intervene(m, x, heads=[(1, 0)], edits=["zero_sink_value"], min_events=v),
     "intervene.min_events={}", [0, 1]),
    (lambda m, x, v: diagnose(m, x, n_images=v), "diagnostics.n_images={}", [0, 1]),
    (lambda m, x, v: diagnose(m, x, neurons=v), "diagnostics.high_norm_k=[{}]", [1.0, 2.0]),
]


def cli_accepts(override: str) -> bool:
    try:
        load_config([override])
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize(("call", "override", "values"), CALLS, ids=[c[1].split("=")[0] for c in CALLS])
def test_the_api_refuses_exactly_what_the_command_line_refuses(call: Callable[[Any, Any, Any], Any], override: str,
                                                               values: list[Any]) -> None:
    m, x = timm_vit(CONFIGS["deit"]), images(4)
    plant_sink(m, 1, 0)
    key = override.split("=")[0]
    verdicts = {}
    for v in values:
        try:
            call(m, x, v)
            verdicts[v] = True
        except BadValue as err:
            assert f"the command line's {key})" in str(err), str(err)
            verdicts[v] = False
    assert verdicts == {v: cli_accepts(override.format(v)) for v in values}
    assert not all(verdicts.values()) and any(verdicts.values())  # the values straddle the bound
