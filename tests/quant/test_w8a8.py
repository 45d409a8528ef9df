"""The simulated W8A8: the fake-quantiser's grid, the edit on a model, and the error a planted outlier causes."""

from __future__ import annotations

import pytest
import torch

import vitsinks.quant  # noqa: F401 - registers the w8a8 edit
from tests.helpers.tiny import tiny_vit
from vitsinks.backbones import adapt
from vitsinks.configs.schema import QuantConfig
from vitsinks.posthoc import METHODS
from vitsinks.quant.w8a8 import W8A8, fake_quant, qmax, scale_of
from vitsinks.quantize import feature_cosines
from vitsinks.utils.errors import BadValue


def test_fake_quant_lies_on_the_grid_within_half_a_step_and_is_idempotent() -> None:
    x = torch.randn(5000, generator=torch.Generator().manual_seed(0)) * 3
    for bits in (4, 8):
        s = scale_of(x.abs().max(), bits)
        q = fake_quant(x, s, bits)
        levels = q / s
        assert torch.allclose(levels, levels.round(), atol=1e-4) and levels.abs().max() <= qmax(bits) + 1e-4
        assert (q - x).abs().max() <= s / 2 * (1 + 1e-5)  # inside the range: at most half a step off
        assert torch.equal(fake_quant(q, s, bits), q)
    s = scale_of(1.0, 8)
    assert fake_quant(torch.tensor([5.0, -5.0]), s, 8).tolist() == pytest.approx([127 * s, -127 * s])  # clamped
    assert (fake_quant(x, scale_of(x.abs().max(), 16), 16) - x).abs().max() < 2e-5 * x.abs().max()  # 16 bits
    assert torch.equal(fake_quant(torch.zeros(3), 0.0, 8), torch.zeros(3))  # an all-zero tensor stays


def test_the_edit_quantises_every_block_weight_and_input_with_the_fitted_scales() -> None:
    torch.manual_seed(0)
    model = tiny_vit().eval()
    images = torch.randn(6, 3, 32, 32)
    state = W8A8.fit(adapt(model), images, QuantConfig(weight_bits=6, act_bits=8))
    assert METHODS["w8a8"] is W8A8 and not W8A8.mitigation
    assert state["weight_bits"] == 6 and state["act_bits"] == 8 and state["calib_images"] == 6
    assert len(state["layers"]) == 4 * len(model.blocks)
    fc1 = state["layers"].index("blocks.1.mlp.fc1")
    seen: list[torch.Tensor] = []
    model.blocks[1].mlp.fc1.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        model.forward_features(images)
    assert float(state["act_max"][fc1]) == pytest.approx(float(seen[0].abs().max()))  # max |x| of the float model
    before = model.blocks[0].attn.qkv.weight.detach().clone()
    W8A8.apply(adapt(model), state)
    w = model.blocks[0].attn.qkv.weight
    step = scale_of(before.abs().max(), 6)
    assert torch.allclose(w / step, (w / step).round(), atol=1e-3) and (w - before).abs().max() <= step / 2 * 1.001
    assert model.patch_embed.proj.weight.dtype == torch.float32  # the patch embedding is not touched
    quantised: list[torch.Tensor] = []
    model.blocks[1].mlp.fc1.register_forward_pre_hook(lambda _m, a: quantised.append(a[0].detach()))
    with torch.no_grad():
        model.forward_features(images)
    s = float(state["act_scale"][fc1])
    assert s == pytest.approx(float(state["act_max"][fc1]) / 127)
    assert torch.allclose(quantised[0] / s, (quantised[0] / s).round(), atol=1e-3)  # the layer sees grid values


def test_a_state_of_another_architecture_is_refused() -> None:
    state = W8A8.fit(adapt(tiny_vit().eval()), torch.randn(2, 3, 32, 32), QuantConfig())
    with pytest.raises(BadValue, match="fitted on the linear layers"):
        W8A8.apply(adapt(tiny_vit(depth=3)), state)


def _plant(model: torch.nn.Module, factor: float, block: int = 1, channel: int = 5) -> None:
    """Channel `channel` of block `block`'s fc1 input x `factor` (its LayerNorm's weight and bias), the fc1 weight's
    column / `factor`: the float model computes the same function, the fc1 input carries one outlier channel."""
    with torch.no_grad():
        blk = model.blocks[block]
        blk.norm2.weight[channel] *= factor
        blk.norm2.bias[channel] *= factor
        blk.mlp.fc1.weight[:, channel] /= factor


def test_the_w8a8_error_grows_with_a_planted_outlier() -> None:
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    fc1 = "blocks.1.mlp.fc1"
    cosines, first_block, scales = [], [], []
    reference = None
    for factor in (1.0, 10.0, 100.0):
        torch.manual_seed(0)
        fp32 = tiny_vit().eval()
        _plant(fp32, factor)
        with torch.no_grad():
            out = fp32.forward_features(images)
        reference = out if reference is None else reference
        assert torch.allclose(out, reference, atol=1e-4)  # the float function is unchanged by the plant
        state = W8A8.fit(adapt(fp32), images, QuantConfig())
        quant = tiny_vit().eval()
        quant.load_state_dict(fp32.state_dict())
        W8A8.apply(adapt(quant), state)
        final, by_block = feature_cosines(adapt(fp32), adapt(quant), images)
        cosines.append(final)
        first_block.append(by_block[0])
        scales.append(float(state["act_scale"][state["layers"].index(fc1)]))
    assert scales[0] < scales[1] < scales[2] and scales[2] > 20 * scales[0]  # the outlier sets the scale
    assert cosines[0] > cosines[1] > cosines[2]  # and the error grows with it
    assert first_block == pytest.approx([first_block[0]] * 3, abs=1e-9)  # the block before the plant: unchanged
