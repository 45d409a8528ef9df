"""timm's layouts of vitsinks' ViTs: timm's own model, built from JSON arguments alone, computes vitsinks' features
(bit for bit in timm's `VisionTransformer`; in `NaFlexVit`, exactly those of the exported weights, and the source's up
to the dropped key bias, which float64 shows is no change of the function); the way back restores the model; the
variants timm cannot build are named with the reason, for every registered kind and mitigation."""

from __future__ import annotations

import json
from typing import Any

import pytest
import timm
import torch
from timm.models.naflexvit import NaFlexVit
from timm.models.vision_transformer import VisionTransformer

from tests.helpers.tiny import images, tiny_vit
from vitsinks.models import ATTN_KINDS, MITIGATIONS, SinkViT
from vitsinks.models.kinds import DEFAULT_KIND
from vitsinks.publish.timm_format import (
    NAFLEX,
    VIT,
    check_equal,
    fill_identity,
    from_timm,
    to_timm,
    unmappable,
)
from vitsinks.utils.errors import BadValue, CheckFailed

MAPPABLE: dict[str, dict[str, Any]] = {
    "base": {},
    "reg": {"registers": 4},
    "reg_in_pos_embed_layerscale": {"registers": 2, "register_pos_embed": True, "layerscale_init": 0.1},
    "no_biases": {"qkv_bias": False, "proj_bias": False},
    "gate": {"gate": "elementwise"},
    "gate_reg_layerscale": {"gate": "elementwise", "registers": 4, "layerscale_init": 1e-2},
}


def trained_like(**kw: Any) -> SinkViT:
    """A tiny ViT whose weights are far from their init (every tensor moved), so that a wrong mapping shows."""
    torch.manual_seed(0)
    model = tiny_vit(**kw).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def from_json_args(tm: Any) -> torch.nn.Module:
    """timm's model as a hub folder's config.json builds it: the arguments through JSON, then the weights."""
    args = json.loads(json.dumps(tm.model_args))
    model = timm.create_model(tm.architecture, **args)
    model.load_state_dict(fill_identity(tm.state_dict, model.state_dict()), strict=True)
    return model.eval()


@pytest.mark.parametrize("name", sorted(MAPPABLE))
@torch.no_grad()
def test_timm_computes_the_features_from_json_arguments_alone(name: str) -> None:
    kw = MAPPABLE[name]
    model = trained_like(**kw)
    tm = to_timm(model, "vit_cpu", kw.get("layerscale_init"))
    theirs = from_json_args(tm)
    x = images(3)
    ours, got = model.forward_features(x), theirs.forward_features(x)
    if "gate" in kw:
        assert tm.layout == NAFLEX and isinstance(theirs, NaFlexVit)
        assert all(b.attn.gate is not None for b in theirs.blocks)  # timm's gated attention
        back = tiny_vit(**kw).eval()
        from_timm(back, theirs.state_dict(), tm.layout, "the export")
        assert torch.equal(back.forward_features(x), got)  # the exported weights: the same features, bit for bit
        torch.testing.assert_close(got, ours, rtol=1e-5, atol=1e-5)  # the source: up to the dropped key bias
    else:
        assert tm.layout == VIT and type(theirs) is VisionTransformer
        assert torch.equal(got, ours)


@pytest.mark.parametrize("name", [n for n, kw in MAPPABLE.items() if "gate" not in kw])
def test_the_vit_layout_maps_back_to_the_same_weights(name: str) -> None:
    model = trained_like(**MAPPABLE[name])
    tm = to_timm(model, "vit_cpu", MAPPABLE[name].get("layerscale_init"))
    back = tiny_vit(**MAPPABLE[name])
    from_timm(back, from_json_args(tm).state_dict(), VIT, "the export")
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


@torch.no_grad()
def test_dropping_the_key_bias_changes_no_feature_in_float64() -> None:
    """q . (k + b_k) = q . k + q . b_k: the same number added to all the scores of a query, which softmax ignores."""
    model = trained_like(gate="elementwise", registers=4).double()
    x = images(3).double()
    before = model.forward_features(x)
    dim = model.embed_dim
    for blk in model.blocks:
        assert blk.attn.qkv.bias[dim:2 * dim].abs().min() > 0  # a key bias there to drop
        blk.attn.qkv.bias[dim:2 * dim] = 0
    torch.testing.assert_close(model.forward_features(x), before, rtol=0, atol=1e-12)


def _unmappable_cases() -> dict[str, tuple[dict[str, Any], str]]:
    """Every registered attention kind but softmax, every mitigation's example but the elementwise gate, and the
    architecture settings timm's configs cannot express: the model's keywords and what the reason must name."""
    cases = {f"attn={k}": ({"attn": k}, k) for k in ATTN_KINDS if k != DEFAULT_KIND}
    for name, m in MITIGATIONS.items():
        if m.setting(m.example) != "elementwise":
            cases[f"{name}={m.example}"] = ({name: m.example}, f"model.{name}")
    cases["gate=headwise"] = ({"gate": "headwise"}, "model.gate")
    cases["norm_eps"] = ({"norm_eps": 1e-5}, "eps is 1e-05")
    cases["attention_only"] = ({"mlp": False}, "model.mlp=false")
    cases["gate_without_qkv_bias"] = ({"gate": "elementwise", "qkv_bias": False}, "no qkv bias")
    return cases


@pytest.mark.parametrize("case", sorted(_unmappable_cases()))
def test_a_variant_timm_cannot_build_is_named_with_the_reason(case: str) -> None:
    kw, named = _unmappable_cases()[case]
    model = tiny_vit(**kw)
    reasons = unmappable(model)
    assert len(reasons) == 1 and named in reasons[0]
    with pytest.raises(BadValue, match="timm cannot build this model from a config"):
        to_timm(model, "vit_cpu", None)


@torch.no_grad()
def test_the_check_refuses_a_wrong_mapping() -> None:
    model = trained_like(registers=4)
    theirs = to_timm(model, "vit_cpu", None).build()
    assert check_equal(model, theirs) == 0.0
    theirs.blocks[1].mlp.fc1.weight[0, 0] += 1.0
    with pytest.raises(CheckFailed, match="other features than vitsinks'"):
        check_equal(model, theirs)
