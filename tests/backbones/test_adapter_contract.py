"""The adapter contract: every registered model family (`vitsinks.backbones.ADAPTERS`) builds a `Backbone` of a tiny
model that computes what the library's own forward computes, block by block as its explicit recomputation, and every
post-hoc edit, written once on the seam, does on it what it says: a test-time register with the register neurons
moved onto it, the massive activations set to their mean, W8A8's weights on their grid and inputs quantised."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.tiny_models import TINY_MODELS, TinyModel, tiny_images
from vitsinks.backbones import ADAPTERS, adapt
from vitsinks.configs.schema import QuantConfig, TrainFreeConfig
from vitsinks.diagnostics import diagnose
from vitsinks.diagnostics.neurons import find_register_neurons
from vitsinks.models.seam import Attention, Backbone, Block
from vitsinks.posthoc import remove_edits
from vitsinks.posthoc.massive import MeanMassive
from vitsinks.posthoc.test_time_register import TestTimeRegister
from vitsinks.quant.outliers import layer_paths
from vitsinks.quant.w8a8 import W8A8, qmax

CASES = [pytest.param(t, id=t.name) for t in TINY_MODELS]


def test_every_registered_family_has_a_tiny_model() -> None:
    assert {t.family for t in TINY_MODELS} == set(ADAPTERS)


def backbone_of(tiny: TinyModel) -> tuple[nn.Module, Backbone]:
    model = tiny.build().eval()
    backbone = adapt(model)
    assert backbone.family == tiny.family and backbone.model is model
    return model, backbone


@torch.no_grad()
def final_tokens(backbone: Backbone, x: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """The backbone's final tokens, or the output of block `block`, through every block's real forward."""
    h = backbone.embed_tokens(x)
    for i in range(len(backbone.blocks)):
        h = backbone.block(i, h)
        if i == block:
            return h
    return backbone.readout(h)


@pytest.mark.parametrize("tiny", CASES)
@torch.no_grad()
def test_the_backbone_is_the_model(tiny: TinyModel) -> None:
    """forward_features equals the library's own forward; each block's explicit recomputation its real forward."""
    model, backbone = backbone_of(tiny)
    x = tiny_images()
    got, want = backbone.forward_features(x), tiny.reference(model, x)
    if tiny.pooled:
        got = got[:, 0] @ model.proj
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    h = backbone.embed_tokens(x)
    rows, cols = backbone.grid((32, 32))
    assert h.shape[1] == backbone.num_prefix + rows * cols and backbone.num_cls in (0, 1)
    for blk in backbone.blocks:
        assert isinstance(blk, Block) and isinstance(blk.attn, Attention)
        real = blk(h)
        explicit, it = blk.forward_explicit(h)
        torch.testing.assert_close(explicit, real, rtol=1e-4, atol=1e-4)
        assert it.attn.shape == (len(x), blk.attn.num_heads, h.shape[1], h.shape[1])
        h = real


def register_unit(backbone: Backbone) -> tuple[int, int]:
    """A unit of the first block with a plain MLP: (block, unit)."""
    block = next(b for b, blk in enumerate(backbone.blocks) if blk.mlp_parts() is not None)
    return block, 3


@pytest.mark.parametrize("tiny", CASES)
@torch.no_grad()
def test_the_test_time_register(tiny: TinyModel) -> None:
    """One zero register after the prefix, the register neurons' activations moved onto it (each unit's peak over
    the tokens there, 0 at every patch), what the explicit recomputation sees too; `remove_edits` takes it off."""
    model, backbone = backbone_of(tiny)
    x = tiny_images()
    before, prefix = backbone.forward_features(x), backbone.num_prefix
    block, unit = register_unit(backbone)
    ranked = find_register_neurons(backbone, x, top=2, k=1.01)  # a low threshold: random weights have no artifact
    assert len(ranked) == 2 and ranked[0][2] >= ranked[1][2]
    edited = TestTimeRegister.apply(backbone, {"neurons": [[block, unit]]})
    assert (edited.num_registers, edited.num_prefix) == (backbone.num_registers + 1, prefix + 1)
    tokens = edited.embed_tokens(x)
    assert tokens.shape[1] == before.shape[1] + 1 and tokens[:, prefix].abs().max() == 0
    seen: dict[str, torch.Tensor] = {}

    def keep(_module: nn.Module, _args: object, out: torch.Tensor) -> None:
        seen.setdefault("a", out[..., unit].clone())

    handle = edited.blocks[block].mlp_parts().act.register_forward_hook(keep)  # after the edit's own hook
    final = edited.forward_features(x)
    handle.remove()
    a = seen["a"]
    assert (a[:, prefix + 1 :] == 0).all() and (a[:, prefix] >= a.amax(dim=1) - 1e-6).all()
    assert final.shape[1] == before.shape[1] + 1
    assert diagnose(edited, x)["recompute_error"].max() < 1e-4
    assert remove_edits(model) == ["a test-time register"]
    torch.testing.assert_close(adapt(model).forward_features(x), before, rtol=0, atol=0)


@pytest.mark.parametrize("tiny", CASES)
@torch.no_grad()
def test_the_mean_massive_fix(tiny: TinyModel) -> None:
    """At the massive block's output, each fitted channel at each image's massive token is its fitted mean, and
    nothing else changes; the explicit recomputation sees the edit."""
    model, backbone = backbone_of(tiny)
    x, fit = tiny_images(), tiny_images(6, seed=2)
    state = MeanMassive.fit(backbone, fit, TrainFreeConfig(massive=2))
    block, channels = state["block"], state["channels"]
    h0 = final_tokens(backbone, x, block)
    MeanMassive.apply(backbone, state)
    h1 = final_tokens(backbone, x, block)
    rows = torch.arange(len(x))
    for ch, mean in zip(channels, state["means"], strict=True):
        token = h0[:, :, ch].abs().argmax(dim=1)
        torch.testing.assert_close(h1[rows, token, ch], torch.full((len(x),), mean), rtol=0, atol=1e-4)
        h1[rows, token, ch] = h0[rows, token, ch]
    torch.testing.assert_close(h1, h0, rtol=0, atol=1e-5)
    assert diagnose(backbone, x)["recompute_error"].max() < 1e-4


@pytest.mark.parametrize("tiny", CASES)
@torch.no_grad()
def test_w8a8(tiny: TinyModel) -> None:
    """Every block linear layer's weight on its 8-bit grid, its input quantised by the hook: the features change, a
    little."""
    model, backbone = backbone_of(tiny)
    x, calib = tiny_images(), tiny_images(4, seed=3)
    before = backbone.forward_features(x)
    state = W8A8.fit(backbone, calib, QuantConfig())
    layers = layer_paths(backbone)
    assert state["layers"] == list(layers) and len(layers) >= 4 * len(backbone.blocks)
    W8A8.apply(backbone, state)
    for name, layer in layers.items():
        w = layer.weight
        steps = w / (w.abs().amax() / qmax(8))
        torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-3, msg=name)
    after = backbone.forward_features(x)
    assert 0 < float((after - before).norm() / before.norm()) < 0.1
