"""QK-norm (`model.qk_norm`): each head's q and k through a LayerNorm of their own, timm's `qk_norm` (the model's
norm layer, its eps), so the attention equals timm's `Attention(qk_norm=True)` on the same weights and timm ViTs with
it load unchanged; it reaches the config, the variant name and the architecture check."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from timm.layers import Attention, LayerNorm
from timm.models.vision_transformer import VisionTransformer

from tests.helpers.tiny import TINY_VIT, images, tiny_vit
from vitsinks.configs.schema import load_config
from vitsinks.models import SinkAttention, load_timm_state_dict, model_from_config, run_variant
from vitsinks.publish.timm_format import check_equal, from_timm, to_timm
from vitsinks.utils.errors import BadValue

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def test_the_attention_equals_timms_qk_norm_attention_on_its_state_dict() -> None:
    torch.manual_seed(0)
    norm = partial(LayerNorm, eps=1e-5)
    theirs = Attention(48, 3, qkv_bias=True, qk_norm=True, norm_layer=norm).double().eval()
    with torch.no_grad():
        for ln in (theirs.q_norm, theirs.k_norm):
            ln.weight.uniform_(0.5, 2.0)
            ln.bias.uniform_(-1.0, 1.0)
    ours = SinkAttention(48, 3, qkv_bias=True, qk_norm=True, norm_layer=norm).double().eval()
    ours.load_state_dict(theirs.state_dict())  # strict: the same names and shapes
    x = torch.randn(2, 9, 48, dtype=torch.float64) * 3
    with torch.no_grad():
        want = theirs(x)
        for mode in ("off", "sdpa", "flex"):
            ours.fused_mode = mode
            torch.testing.assert_close(ours(x), want, rtol=1e-10, atol=1e-10)
    plain = SinkAttention(48, 3, qkv_bias=True).double().eval()
    plain.load_state_dict({k: v for k, v in theirs.state_dict().items() if "_norm" not in k})
    with torch.no_grad():
        assert not torch.allclose(plain(x), want)  # the norms change the function


def test_a_timm_vit_with_qk_norm_loads_unchanged_and_computes_the_same() -> None:
    torch.manual_seed(0)
    timm_vit = VisionTransformer(**TINY_VIT, qkv_bias=True, num_classes=0, qk_norm=True).eval()
    with torch.no_grad():
        for blk in timm_vit.blocks:
            blk.attn.q_norm.weight.uniform_(0.5, 2.0)
            blk.attn.k_norm.bias.uniform_(-1.0, 1.0)
    ours = tiny_vit(qk_norm=True).eval()
    load_timm_state_dict(ours, timm_vit.state_dict())
    x = images(2)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), timm_vit.forward_features(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(BadValue, match="tensors do not fit|holds a ViT") as err:
        load_timm_state_dict(tiny_vit(), timm_vit.state_dict(), what="the file")
    assert "\n" not in str(err.value)


def test_the_config_switch_builds_it_with_the_models_norm_and_names_it() -> None:
    overrides = [f"model.{k}={v}" for k, v in TINY_VIT.items()]
    cfg = load_config(["exp=qknorm", "model.norm_eps=1e-5", *overrides])
    assert cfg.model.qk_norm is True and run_variant(cfg) == "qknorm"
    model = model_from_config(cfg.model)
    for blk in model.blocks:
        for ln in (blk.attn.q_norm, blk.attn.k_norm):
            assert isinstance(ln, torch.nn.LayerNorm) and ln.normalized_shape == (16,) and ln.eps == 1e-5
    assert model.variant == "qknorm"
    off = model_from_config(load_config(overrides).model)
    assert isinstance(off.blocks[0].attn.q_norm, torch.nn.Identity) and off.variant == "base"
    assert set(model.state_dict()) - set(off.state_dict()) == {f"blocks.{i}.attn.{n}_norm.{p}" for i in range(2)
                                                                 for n in "qk" for p in ("weight", "bias")}


@pytest.mark.parametrize("gate", ["none", "elementwise"])
def test_a_qk_norm_model_exports_to_timms_layout_and_back(gate: str) -> None:
    """timm builds it from a config (its VisionTransformer, or NaFlexVit for the gate) with the same features."""
    torch.manual_seed(0)
    model = tiny_vit(qk_norm=True, registers=2, gate=gate).eval()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.q_norm.weight.uniform_(0.5, 2.0)
            blk.attn.k_norm.bias.uniform_(-1.0, 1.0)
    exported = to_timm(model, "vit_cpu", None)
    assert exported.model_args["qk_norm"] is True
    assert check_equal(model, exported.build()) < 1e-5
    back = tiny_vit(qk_norm=True, registers=2, gate=gate).eval()
    from_timm(back, exported.build().state_dict(), exported.layout, "the export")
    with torch.no_grad():
        torch.testing.assert_close(back.forward_features(images(2)), model.forward_features(images(2)))
