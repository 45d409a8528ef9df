"""Concentration, diagonal mass, update shares and head utilisation, massive emergence and sink lifetimes: closed forms
on a planted block, and the float64 truth (`tests.helpers.shape_reference`) on a model of every family."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from tests.helpers.planted_depth import two_heads
from tests.helpers.shape_reference import (
    attention_reference,
    emergence_reference,
    float64_pass,
    lifetime_reference,
    shares_reference,
)
from tests.helpers.tiny import tiny_vit
from tests.helpers.tiny_models import TINY_MODELS, tiny_images
from vitsinks.diagnostics import diagnose, diagnose_tokens
from vitsinks.diagnostics.head_shape import attention_shape, update_shares
from vitsinks.diagnostics.persistence import MASSIVE_K, head_lifetimes, massive_emergence
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.models.layout import KeyLayout


@pytest.mark.parametrize("s", [0.0, 2.0, 5.0])
def test_planted_heads_have_their_closed_forms(s: float) -> None:
    blk, x = two_heads(s)
    d = diagnose_tokens([blk], x)
    e = math.exp(s)
    np.testing.assert_allclose(d["concentration"][0, 0], [e, 1.0], rtol=1e-5)
    np.testing.assert_allclose(d["diag_mass"][0, 0], [0.25, e / (e + 3)], rtol=1e-5)
    np.testing.assert_allclose(d["update_share"][0, 0], [0.6, 0.4], rtol=1e-5)  # LayerScale counted: 3 and 2
    np.testing.assert_allclose(d["head_util"][0, 0], 25 / 26, rtol=1e-5)


def test_one_head_writing_everything_uses_half_of_two_heads() -> None:
    blk, x = two_heads(2.0)
    with torch.no_grad():
        blk.attn.qkv.weight[21, 4] = 0.0  # head 1's values are 0: it writes nothing
    d = diagnose_tokens([blk], x)
    np.testing.assert_allclose(d["update_share"][0, 0], [1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(d["head_util"][0, 0], 0.5, rtol=1e-6)


def test_degenerate_columns_and_silent_blocks() -> None:
    attn = torch.zeros(1, 3, 4, 4)
    attn[0, 1, :, 0] = 1.0  # every query on key 0: the median column sum is 0
    attn[0, 2] = torch.eye(4)
    got = attention_shape(attn)
    assert math.isnan(got["concentration"][0, 0]) and got["concentration"][0, 1] == math.inf
    assert got["concentration"][0, 2] == 1.0 and got["diag_mass"].tolist() == [[0.0, 0.25, 1.0]]
    assert attention_shape(torch.full((1, 1, 2, 2), 0.5))["concentration"].item() == 1.0  # even count: the mean
    silent = update_shares(torch.zeros(2, 3))
    assert torch.isnan(silent["head_util"]).all() and torch.isnan(silent["update_share"]).all()


def _gated() -> torch.nn.Module:
    torch.manual_seed(0)
    return tiny_vit(gate="elementwise", registers=1).eval()


def _diff() -> torch.nn.Module:
    """Differential attention with lambda = 1 in every block: weights of both signs, |A| read."""
    torch.manual_seed(0)
    model = tiny_vit(attn="diff").eval()
    with torch.no_grad():
        for b, blk in enumerate(model.blocks):  # exp(q1 . k1) - exp(0) + lambda_init = 1
            dot = math.log(2 - (0.8 - 0.6 * math.exp(-0.3 * b)))
            blk.attn.lambda_q1.fill_(math.sqrt(dot / blk.attn.lambda_q1.numel())), blk.attn.lambda_k1.copy_(
                blk.attn.lambda_q1)
            blk.attn.lambda_q2.zero_(), blk.attn.lambda_k2.zero_()
    return model


def _clipped_dead() -> torch.nn.Module:
    """Clipped softmax where the near-uniform heads clip to all 0 and head 0, made peaked, stays alive."""
    torch.manual_seed(0)
    model = tiny_vit(attn="clipped_softmax", kind_settings={"gamma": -0.07}).eval()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight[: blk.attn.head_dim] *= 30.0
    return model


CASES = [*(pytest.param(t.build, id=t.name) for t in TINY_MODELS), pytest.param(_gated, id="vitsinks_gated"),
         pytest.param(_diff, id="vitsinks_diff"), pytest.param(_clipped_dead, id="vitsinks_clipped")]


@pytest.mark.parametrize("build", CASES)
def test_fields_equal_their_float64_reference(build: Callable[[], torch.nn.Module]) -> None:
    """Every family (transformers' DINOv2 and open_clip among them) and a gated ViT, in batches of 2 and 1."""
    model, x = build(), tiny_images(3)
    d = diagnose(model, x, batch_size=2, keep_maps=0)
    ref = float64_pass(model, x)
    a = attention_reference(ref["attn"])
    np.testing.assert_array_equal(d["sink_idx"], a["sink_idx"])
    for k in ("concentration", "diag_mass", "dead", "neg_mass"):
        np.testing.assert_allclose(d[k], a[k], rtol=1e-4, atol=1e-7, err_msg=k)
    for k, v in shares_reference(ref["head_norm"]).items():
        np.testing.assert_allclose(d[k], v, rtol=1e-4, atol=1e-7, err_msg=k)
    for k in (MASSIVE_K, 1.02):  # the fields' threshold, and one that random weights' tokens cross
        want = emergence_reference(ref["res_norm"], k)
        got = {f: d[f] for f in want} if k == MASSIVE_K else massive_emergence(d["res_norm"], k)
        np.testing.assert_array_equal(got["massive_new"], want["massive_new"])
        np.testing.assert_allclose(got["massive_cv"], want["massive_cv"], rtol=1e-4, atol=1e-6)
    assert want["massive_new"].sum() > 0
    n_keys = KeyLayout.from_fields(d).n_keys
    mass = a["mass"]
    strongest = (d["mass"] == d["mass"].max(axis=2, keepdims=True), mass == mass.max(axis=2, keepdims=True))
    for got_ev, want_ev in ((SinkRules().events(d), a["routed_frac"] >= 0.9), strongest):  # the rule's; one per block
        np.testing.assert_array_equal(got_ev, want_ev)
        got = head_lifetimes(d["sink_idx"], got_ev, n_keys)
        for k, v in lifetime_reference(a["sink_idx"], want_ev).items():
            np.testing.assert_array_equal(got[k], v, err_msg=k)
