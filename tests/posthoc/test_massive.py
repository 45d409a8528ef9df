"""Massive activations fixed post hoc: on a planted massive activation (one channel of one token, a value that
differs from image to image), the edit sets it to the fitted mean (or 0) on every image, the mean keeps the model's
features, zero changes them; the massive block is the onset."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.tiny import images, tiny_vit
from vitsinks.backbones import adapt
from vitsinks.configs.schema import TrainFreeConfig
from vitsinks.diagnostics import diagnose
from vitsinks.models import SinkViT
from vitsinks.posthoc import METHODS
from vitsinks.posthoc.massive import block_peaks, massive_block
from vitsinks.utils.errors import BadValue, NonFinite

CH, TOKEN, VALUE = 3, 1 + 7, 100.0  # channel, sequence index (patch 7) and mean value of the planted activation
SPREAD = 3.0  # the std of channel CH at every patch (the image's own part of the planted value)


@torch.no_grad()
def plant_massive(model: SinkViT) -> SinkViT:
    """Channel CH of the residual stream at block 0's output: VALUE + e at token TOKEN and e at the other patches,
    e ~ N(0, SPREAD^2) a projection of the patch's pixels (so it differs per image), 0 at [CLS] (the embedding puts
    it there and block 0 writes nothing to it); later blocks carry it on."""
    model.eval()
    w = torch.randn(model.patch_embed.proj.weight[CH].shape, generator=torch.Generator().manual_seed(2))
    model.patch_embed.proj.weight[CH] = w / w.norm() * SPREAD  # unit-variance pixels: std SPREAD
    model.patch_embed.proj.bias[CH] = 0
    model.cls_token[..., CH] = 0
    model.pos_embed[..., CH] = 0
    model.pos_embed[0, TOKEN, CH] = VALUE
    blk = model.blocks[0]
    for lin in (blk.attn.proj, blk.mlp.fc2):
        lin.weight[CH] = 0
        lin.bias[CH] = 0
    return model


def test_the_massive_block_is_the_onset_by_hand() -> None:
    top = torch.tensor([[1.0, 10.0, 12.0, 30.0], [1.0, 10.0, 12.0, 30.0]])
    median = torch.tensor([[1.0, 1.0, 1.0, 2.0], [1.0, 1.0, 1.0, 2.0]])  # ratios 1, 10, 12, 15: half of 15 is 7.5
    block, ratios = massive_block(top, median)
    assert block == 1 and ratios == pytest.approx([1.0, 10.0, 12.0, 15.0])
    assert massive_block(top, torch.zeros_like(median))[0] == 0  # every ratio inf: the first block


def block0_output(model: SinkViT, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(block 0's output, the final features) of `model` on `x`."""
    seen = {}
    handle = model.blocks[0].register_forward_hook(lambda _m, _i, out: seen.update(h=out.clone()))
    with torch.no_grad():
        final = model.forward_features(x)
    handle.remove()
    return seen["h"], final


@pytest.mark.parametrize("name", ["mean_massive", "zero_massive"])
def test_the_fitted_mean_or_zero_replaces_each_images_own_value(name: str) -> None:
    torch.manual_seed(0)
    model, x = plant_massive(tiny_vit(depth=3)), images()
    base = copy.deepcopy(model)
    h0, want = block0_output(base, x)
    own = h0[:, TOKEN, CH].double()
    assert own.std() > 1  # the value differs per image: an edit that did nothing could not meet the checks below
    m = METHODS[name]
    state = m.fit(adapt(model), x, TrainFreeConfig(massive=1))
    assert state["block"] == 0 and state["channels"] == [CH]
    assert state["means"] == pytest.approx([float(own.mean())], rel=1e-6)  # the mean over images at the token
    edited = m.apply(adapt(model), state).model
    h1, got = block0_output(edited, x)
    target = 0.0 if name == "zero_massive" else state["means"][0]
    torch.testing.assert_close(h1[:, TOKEN, CH], torch.full((len(x),), target), rtol=0, atol=1e-4)
    h1[:, TOKEN, CH] = h0[:, TOKEN, CH]
    torch.testing.assert_close(h1, h0, rtol=0, atol=1e-6)  # every other token and channel of the block unchanged
    cos = F.cosine_similarity(got[:, TOKEN], want[:, TOKEN], dim=-1)
    if name == "mean_massive":  # the token keeps the channel that dominates its LayerNorms: its features stay
        assert cos.min() > 0.99
    else:  # the token's stream loses that channel
        assert cos.abs().max() < 0.5
    d = diagnose(edited, x)  # the edit is on a path the explicit recomputation also takes
    assert d["recompute_error"].max() < 1e-4
    assert (d["token_norm_max"][:, 0] < VALUE / 2).all() == (name == "zero_massive")


def test_the_peaks_are_the_max_and_lower_median_of_abs_h_in_float64() -> None:
    torch.manual_seed(0)
    model, x = plant_massive(tiny_vit(depth=2)), images(3)
    top, median, peak_abs, peak = block_peaks(adapt(model), x, batch_size=2)
    with torch.no_grad():
        t = model.embed_tokens(x)
        for b, blk in enumerate(model.blocks):
            t = blk(t)
            a = t.double().abs().flatten(1)
            lower = a.sort(dim=1).values[:, (a.shape[1] - 1) // 2]  # the ((n - 1) // 2)-th smallest
            torch.testing.assert_close(top[:, b].double(), a.amax(1), rtol=1e-6, atol=0)
            torch.testing.assert_close(median[:, b].double(), lower, rtol=1e-6, atol=0)
            torch.testing.assert_close(peak_abs[:, b].double(), t.double().abs().amax(1), rtol=1e-6, atol=0)
            torch.testing.assert_close(peak[:, b].abs(), peak_abs[:, b])
    assert (peak[:, 0, CH] > VALUE / 2).all()  # the planted channel's peak is at the planted token, signed


def test_a_model_with_broken_activations_is_refused() -> None:
    model = tiny_vit()
    with torch.no_grad():
        model.blocks[1].mlp.fc2.bias[0] = float("nan")
    with pytest.raises(NonFinite, match="NaN or inf"):
        METHODS["mean_massive"].fit(adapt(model), images(2), TrainFreeConfig())


def test_the_edit_sets_the_block_output_at_each_images_massive_token() -> None:
    torch.manual_seed(0)
    model, x = plant_massive(tiny_vit(depth=3)), images(4)
    seen = {}
    model.blocks[1].register_forward_hook(lambda _m, _i, out: seen.update(h=out.clone()))
    with torch.no_grad():
        model.forward_features(x)
    want = seen["h"].clone()
    for ch, value in ((CH, -7.0), (5, 3.5)):  # by hand: per image, the token with the largest |h| in the channel
        token = want[:, :, ch].abs().argmax(dim=1)
        want[torch.arange(4), token, ch] = value
    METHODS["mean_massive"].apply(adapt(model), {"block": 1, "channels": [CH, 5], "means": [-7.0, 3.5]})
    with torch.no_grad():
        model.forward_features(x)
    torch.testing.assert_close(seen["h"], want, rtol=0, atol=1e-4)
    assert torch.allclose(seen["h"][:, TOKEN, CH], torch.tensor(-7.0), atol=1e-4)


def test_a_state_of_another_architecture_is_refused() -> None:
    with pytest.raises(BadValue, match="not in this 2-block"):
        METHODS["zero_massive"].apply(adapt(tiny_vit()), {"block": 4, "channels": [0], "means": [1.0]})
