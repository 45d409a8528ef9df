"""Massive activations fixed post hoc: on a planted massive activation (one channel of one token, the same value on
every image), the mean keeps the model's features, zero changes them; the massive block is the onset."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_vit
from tests.diagnostics.test_neurons import images
from vitsinks.configs.schema import TrainFreeConfig
from vitsinks.diagnostics import diagnose
from vitsinks.models import SinkViT
from vitsinks.trainfree import METHODS
from vitsinks.trainfree.massive import massive_block
from vitsinks.utils.errors import BadValue

CH, TOKEN, VALUE = 3, 1 + 7, 100.0  # channel, sequence index (patch 7) and value of the planted activation


@torch.no_grad()
def plant_massive(model: SinkViT) -> SinkViT:
    """Channel CH of the residual stream: VALUE at token TOKEN and 0 elsewhere at block 0's output, on every image
    (the embedding puts it there and block 0 writes nothing to it); later blocks carry it on."""
    model.eval()
    model.patch_embed.proj.weight[CH] = 0
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


@pytest.mark.parametrize("name", ["mean_massive", "zero_massive"])
def test_mean_keeps_the_features_and_zero_changes_them(name: str) -> None:
    torch.manual_seed(0)
    model, x = plant_massive(tiny_vit(depth=3)), images()
    base = copy.deepcopy(model)
    m = METHODS[name]
    state = m.fit(model, x, TrainFreeConfig(massive=1))
    assert state["block"] == 0 and state["channels"] == [CH] and state["means"] == pytest.approx([VALUE])
    edited = m.apply(model, state)
    with torch.no_grad():
        want, got = base.forward_features(x), edited.forward_features(x)
    cos = F.cosine_similarity(got[:, TOKEN], want[:, TOKEN], dim=-1)
    if name == "mean_massive":  # the value is the same on every image: the mean is the value, nothing changes
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # the token's stream loses the channel that dominated its LayerNorms
        assert cos.abs().max() < 0.5
    d = diagnose(edited, x)  # the edit is on a path the explicit recomputation also takes
    assert d["recompute_error"].max() < 1e-4
    assert (d["token_norm_max"][:, 0] < VALUE / 2).all() == (name == "zero_massive")


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
    METHODS["mean_massive"].apply(model, {"block": 1, "channels": [CH, 5], "means": [-7.0, 3.5]})
    with torch.no_grad():
        model.forward_features(x)
    torch.testing.assert_close(seen["h"], want, rtol=0, atol=1e-4)
    assert torch.allclose(seen["h"][:, TOKEN, CH], torch.tensor(-7.0), atol=1e-4)


def test_a_state_of_another_architecture_is_refused() -> None:
    with pytest.raises(BadValue, match="not in this 2-block"):
        METHODS["zero_massive"].apply(tiny_vit(), {"block": 4, "channels": [0], "means": [1.0]})
