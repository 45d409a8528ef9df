"""The post-hoc edits on a timm ViT (through its views) equal the same edits on vitsinks' own ViT with the converted
weights (its own blocks): W8A8, the test-time register, the register neurons and their summary, the massive fix.
What each edit does on every family is the adapter contract's (tests/backbones/test_adapter_contract.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from timm.layers import GluMlp
from timm.models.vision_transformer import VisionTransformer

from tests.helpers.timm_models import CONFIGS, SHAPE, images, own_twin, timm_vit
from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics.neurons import find_register_neurons, summarize_neurons
from vitsinks.posthoc.massive import MeanMassive, ZeroMassive
from vitsinks.posthoc.test_time_register import TestTimeRegister
from vitsinks.pretrained import adapt, diagnose
from vitsinks.pretrained.edit_calls import (
    add_test_time_register,
    apply_massive,
    apply_w8a8,
    fit_massive,
    fit_w8a8,
    register_neurons,
)
from vitsinks.quant import W8A8
from vitsinks.quant.outliers import layer_paths
from vitsinks.utils.errors import BadValue


@pytest.mark.parametrize("name", ["deit", "dinov2_reg"])
@torch.no_grad()
def test_w8a8_equals_vitsinks_own(name: str) -> None:
    m = timm_vit(CONFIGS[name])
    own = own_twin(m, CONFIGS[name])
    x, calib = images(3), images(5)[3:]
    before = adapt(m).forward_features(x)
    assert list(layer_paths(adapt(m))) == list(layer_paths(adapt(own)))
    state = fit_w8a8(m, calib)
    want = W8A8.fit(adapt(own), calib, SimpleNamespace(weight_bits=8, act_bits=8))
    torch.testing.assert_close(state["act_max"], want["act_max"], rtol=1e-5, atol=0)
    got = apply_w8a8(m, state).forward_features(x)
    ref = W8A8.apply(adapt(own), want).forward_features(x)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(m.forward_features(x), got)  # the hooks are on the model itself
    assert 1e-4 < (got - before).norm() / before.norm() < 0.1  # quantised: changed, a little


@torch.no_grad()
def test_test_time_register_equals_vitsinks_own() -> None:
    m = timm_vit(CONFIGS["deit"])
    own = own_twin(m, CONFIGS["deit"])
    x = images(3)
    neurons = [(0, 3), (0, 17), (1, 5)]
    f = add_test_time_register(m, neurons)
    TestTimeRegister.apply(adapt(own), {"neurons": [list(n) for n in neurons]})
    assert (f.num_registers, f.num_prefix) == (1, 2) == (own.num_reg_tokens, own.num_prefix_tokens)
    torch.testing.assert_close(f.forward_features(x), own.forward_features(x), rtol=1e-5, atol=1e-5)
    t = diagnose(f, x)
    assert t["layout"]["num_registers"][0] == 1 and t["checks"]["recompute_error"].max() < 1e-4
    assert adapt(m).num_registers == 0  # the model keeps its layout; only the view has the register


@torch.no_grad()
def test_register_neurons_equal_vitsinks_own() -> None:
    m = timm_vit(CONFIGS["dinov2_reg"])
    own = own_twin(m, CONFIGS["dinov2_reg"])
    x = images(4)
    got = register_neurons(m, x, top=8, k=1.05)  # a low threshold: random weights have no real artifact
    want = find_register_neurons(adapt(own), x, 8, 1.05)
    assert [(b, u) for b, u, _ in got] == [(b, u) for b, u, _ in want]
    torch.testing.assert_close(torch.tensor([s for *_, s in got]), torch.tensor([s for *_, s in want]), rtol=1e-5,
                               atol=0)


@pytest.mark.parametrize("name", ["dinov2_reg", "deit"])
@torch.no_grad()
def test_neuron_summary_equals_vitsinks_own(name: str) -> None:
    """`diagnose(..., neurons=k)`'s table equals `summarize_neurons` (summary.json's `register_neurons`) on vitsinks'
    own ViT with the converted weights."""
    m = timm_vit(CONFIGS[name])
    own = own_twin(m, CONFIGS[name])
    x, k = images(4), 1.05  # a low threshold: random weights have no real artifact
    got = diagnose(m, x, neurons=k)["neurons"]
    want = summarize_neurons(adapt(own), x, DiagnosticsConfig(high_norm_k=[k], register_neurons=10))["by_block"]
    assert [(b, u) for b, e in enumerate(want) for u in e["units"]] == list(zip(got["block"], got["unit"], strict=True))
    np.testing.assert_allclose(got["score"], [s for e in want for s in e["scores"]], rtol=1e-5)
    np.testing.assert_allclose(got["norm_share"], [e["norm_share"] for e in want for _ in e["units"]], rtol=1e-5)
    assert len(got["unit"]) == 10 * len(m.blocks) and list(got["rank"][:3]) == [0, 1, 2]
    assert "neurons" not in diagnose(m, x) and list(diagnose(m, x, neurons=True)["neurons"]) == list(got)
    with pytest.raises(BadValue, match=r"neurons=0.5 \(must be > 1; the command line's diagnostics.high_norm_k\)"):
        diagnose(m, x, neurons=0.5)  # before any work, as the command line checks the threshold


@torch.no_grad()
def test_a_gated_mlp_has_no_register_neurons_through_the_views() -> None:
    """timm's GluMlp also names its parts fc1, act, fc2, but its `act` is only the gate: no units to rank or move."""
    m = VisionTransformer(**SHAPE, mlp_layer=GluMlp).eval()
    assert len(diagnose(m, images(2), neurons=1.05)["neurons"]["unit"]) == 0
    with pytest.raises(BadValue, match="GluMlp is no plain MLP"):
        add_test_time_register(m, [(0, 1)])


@pytest.mark.parametrize("method", [MeanMassive, ZeroMassive])
@torch.no_grad()
def test_massive_fix_equals_vitsinks_own(method: type[MeanMassive]) -> None:
    m = timm_vit(CONFIGS["dinov2_reg"])
    own = own_twin(m, CONFIGS["dinov2_reg"])
    x, fit = images(3), images(6)[3:]
    state = fit_massive(m, fit, massive=3)
    want = method.fit(adapt(own), fit, SimpleNamespace(massive=3))
    assert (state["block"], state["channels"]) == (want["block"], want["channels"])
    np.testing.assert_allclose(state["means"], want["means"], rtol=1e-5)
    before = adapt(m).forward_features(x)
    got = apply_massive(m, state, zero=method is ZeroMassive).forward_features(x)
    torch.testing.assert_close(got, method.apply(adapt(own), want).forward_features(x), rtol=1e-5, atol=1e-5)
    assert (got - before).abs().max() > 0
    assert diagnose(m, x)["checks"]["recompute_error"].max() < 1e-4  # the views' recomputation sees the edit too
