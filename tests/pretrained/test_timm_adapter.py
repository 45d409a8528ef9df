"""The timm adapter: views of an unmodified timm `VisionTransformer` reproduce its forward and give the same
diagnostics as vitsinks' own ViT on the same (converted) weights, and the same attention as a float64 recomputation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import ResPostBlock, VisionTransformer
from torch import nn

from tests.helpers.adapter_checks import assert_fields_equal_own, assert_fields_match_attention
from tests.helpers.timm_models import CONFIGS, SHAPE, images, own_twin, plant_sink, timm_vit
from vitsinks.diagnostics import core
from vitsinks.diagnostics.core import diagnose_tokens
from vitsinks.models import SinkViT, build_vit, load_timm_state_dict
from vitsinks.pretrained import adapt, diagnose, diagnose_fields, intervene
from vitsinks.utils.errors import BadValue


@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.no_grad()
def test_views_reproduce_the_model(name: str) -> None:
    m = timm_vit(CONFIGS[name])
    f = adapt(m)
    assert f.family == "timm" and f.num_cls == 1 and f.num_registers == CONFIGS[name].get("reg_tokens", 0)
    x = images()
    t = f.embed(x)
    for blk in f.blocks:
        out, _ = blk.forward_explicit(t)
        t = blk(t)
        assert (out - t).abs().max() <= 1e-5 * t.abs().max()
    final = f.readout(t)
    torch.testing.assert_close(final, m.forward_features(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f.classifier(final), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.no_grad()
def test_fields_equal_vitsinks_own_implementation(name: str) -> None:
    m = timm_vit(CONFIGS[name])
    own, f, x = own_twin(m, CONFIGS[name]), adapt(m), images()
    assert_fields_equal_own(f, own, x)


def reference_attention(blk: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Block `blk`'s attention (B, H, N, N) written out from its parameters in float64."""
    a, H = blk.attn, blk.attn.num_heads
    d = {k: v.double() for k, v in blk.state_dict().items()}
    z = F.layer_norm(x.double(), (x.shape[-1],), d["norm1.weight"], d["norm1.bias"], blk.norm1.eps)
    qkv = z @ d["attn.qkv.weight"].T + d["attn.qkv.bias"]
    B, N, _ = qkv.shape
    q, k, _ = qkv.view(B, N, 3, H, -1).permute(2, 0, 3, 1, 4)
    if "attn.q_norm.weight" in d:
        hd = q.shape[-1]
        q = F.layer_norm(q, (hd,), d["attn.q_norm.weight"], d["attn.q_norm.bias"], a.q_norm.eps)
        k = F.layer_norm(k, (hd,), d["attn.k_norm.weight"], d["attn.k_norm.bias"], a.k_norm.eps)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    e = (s - s.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.no_grad()
def test_attention_equals_a_float64_recomputation(name: str) -> None:
    m = timm_vit(CONFIGS[name])
    f, x = adapt(m), images()
    t = f.blocks[0](f.embed(x))  # block 1's input
    it = f.blocks[1].attn.internals(f.blocks[1].norm1(t))
    ref = reference_attention(m.blocks[1], t)
    assert (it.attn.double() - ref).abs().max() < 1e-5
    assert_fields_match_attention(diagnose_tokens(f.blocks[1:], t, num_prefix=f.num_prefix), ref, f.num_prefix)


@torch.no_grad()
def test_diagnose_tables_blocks_and_heads() -> None:
    m = timm_vit(CONFIGS["dinov2_reg"])
    x = images(4)
    full = diagnose_fields(m, x, batch_size=3)  # two batches
    assert full["sink_idx"].shape == (4, 2, 3) and int(full["num_registers"]) == 4 and int(full["num_prefix"]) == 5
    assert full["recompute_error"].max() < 1e-4
    last = diagnose_fields(m, x, blocks=[-1])
    np.testing.assert_array_equal(last["block"], [1])
    np.testing.assert_allclose(last["mass"], full["mass"][:, 1:], rtol=1e-5, atol=1e-6)
    with pytest.raises(BadValue, match="blocks"):
        diagnose_fields(m, x, blocks=[2])
    tabs = diagnose(m, x, heads=[0, 2])
    heads = tabs["heads"]
    assert len(heads["mass"]) == 4 * 2 * 2 and set(heads["head"]) == {0, 2}
    assert set(heads["sink_location"]) <= {"cls", "register", "patch"}
    assert len(tabs["blocks"]["massive_ratio"]) == 4 * 2 and len(tabs["qk"]["head"]) == 2 * 2
    pairs = diagnose(m, x, heads=[(1, 1)])["heads"]
    assert set(zip(pairs["block"], pairs["head"], strict=True)) == {(1, 1)}


@torch.no_grad()
def test_interventions_protocol() -> None:
    m = timm_vit(CONFIGS["dinov2_reg"])
    f = adapt(m)
    s, x = f.eval(), images()
    t = s.embed(x)
    blk = s.blocks[0]
    it = blk.attn.internals(blk.norm1(t))
    torch.testing.assert_close(blk.from_heads(t, it.attn @ it.v, it.gate), s.block(0, t), rtol=1e-5, atol=1e-5)
    sink = it.attn[:, 1].mean(-2).argmax(-1)
    red = blk.attn.redirected(blk.norm1(t), 1, sink)
    a = it.attn[:, 1].clone()
    a[torch.arange(len(a)), :, sink] = 0
    torch.testing.assert_close(red, a / a.sum(-1, keepdim=True), rtol=1e-4, atol=1e-6)
    assert s.num_prefix == 5 and s.num_registers == 4 and len(s.without_registers(t)[0]) == t.shape[1] - 4


def test_intervene_on_a_planted_sink() -> None:
    m = timm_vit(CONFIGS["deit"])
    plant_sink(m, 1, 0)
    x = images(6)
    got = intervene(m, x[:4], heads=[(1, 0)], edits=["zero_sink_value", "redirect_sink_attention"], heldout=x[4:],
                    batch_size=4)
    rows = got["rows"]
    assert got["heads"] == [(1, 0)] and sorted(set(rows["edit"])) == ["redirect_sink_attention", "zero_sink_value"]
    assert len(rows["edit"]) == 2 * 4 and set(rows["sink_loc"]) == {"cls"}
    assert float(got["checks"]["recompute_error_max"]) < 1e-4 and got["checks"]["redirect_rows_checked"] > 0
    assert all(np.isfinite(rows["final_patch_relrms"])) and max(rows["final_patch_relrms"]) > 0


@pytest.mark.parametrize("qkv_bias", (True, False))
@torch.no_grad()
def test_gate_fields_and_edits_equal_vitsinks_own(qkv_bias: bool) -> None:
    """timm's gated attention through the views: `gate_mean` (with every other per-head field, in
    `test_fields_equal_vitsinks_own_implementation`) and the gate's edits equal vitsinks' own gated ViT on the
    converted weights; without a qkv bias timm's gate has none either (converted as a zero bias)."""
    shape = {**SHAPE, "qkv_bias": qkv_bias}
    torch.manual_seed(0)
    m = VisionTransformer(**shape, **CONFIGS["gated"]).eval()
    own = SinkViT(**shape, gate="elementwise", reg_tokens=2, init_values=0.1, register_pos_embed=True)
    load_timm_state_dict(own, m.state_dict())
    own.eval()
    if qkv_bias:
        plant_sink(m, 1, 0)
        load_timm_state_dict(own, m.state_dict())
    x = images(4)
    got, want = diagnose(m, x)["heads"], diagnose(own, x)["heads"]
    np.testing.assert_allclose(got["gate_mean"], want["gate_mean"], rtol=1e-5, atol=1e-6)
    assert 0.05 < got["gate_mean"].min() and got["gate_mean"].max() < 0.95  # a real gate: neither open nor shut
    torch.testing.assert_close(m.forward_features(x), own.forward_features(x), rtol=1e-5, atol=1e-5)
    if not qkv_bias:
        return
    edits = ["open_gate", "close_gate"]
    rows, own_rows = (intervene(model, x, heads=[(1, 0)], edits=edits)["rows"] for model in (m, own))
    assert sorted(set(rows["edit"])) == sorted(edits) and len(rows["edit"]) == 2 * len(x)
    for k, v in own_rows.items():
        if isinstance(v[0], float):
            np.testing.assert_allclose(rows[k], v, rtol=1e-4, atol=1e-6, err_msg=k)
        else:
            assert list(rows[k]) == list(v), k
    assert min(rows["final_patch_relrms"]) > 1e-4  # the edits move the model


@torch.no_grad()
def own_forward_with_zero_value(m: VisionTransformer, x: torch.Tensor, block: int, head: int, key: int
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's own final tokens and logits when head `head` of block `block` gets a zero value at token `key`, by a
    hook on its fused qkv Linear."""
    a, dim = m.blocks[block].attn, m.embed_dim
    rows = slice(2 * dim + head * a.head_dim, 2 * dim + (head + 1) * a.head_dim)

    def zero_value(_m: nn.Module, _inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[:, key, rows] = 0.0
        return out

    handle = a.qkv.register_forward_hook(zero_value)
    try:
        final = m.forward_features(x)
        return final, m.forward_head(final)
    finally:
        handle.remove()


def test_intervene_without_cls_reads_the_models_own_pooled_head() -> None:
    """A timm ViT without [CLS] (2 registers first, average pooling, a head): the planted sink on register 0 is key 0
    and a register, and zeroing its value moves the final patches and the head's logits (timm's own pooling) as
    timm's forward with a hook on the value does."""
    m = timm_vit({"class_token": False, "global_pool": "avg", "reg_tokens": 2})
    plant_sink(m, 1, 0, token="reg")
    f, x, labels = adapt(m), images(4), torch.tensor([0, 1, 2, 3])
    assert (f.num_cls, f.num_registers, f.num_prefix) == (0, 2, 2)
    got = intervene(m, x, heads=[(1, 0)], edits=["zero_sink_value"], labels=labels, batch_size=4)
    rows = got["rows"]
    assert set(rows["sink_idx"]) == {0} and set(rows["sink_loc"]) == {"register"}
    with torch.no_grad():
        base, base_logits = m.forward_features(x), m(x)
    final, logits = own_forward_with_zero_value(m, x, 1, 0, 0)
    p, pe = base[:, 2:].double(), final[:, 2:].double()  # the patches: every token after the 2 registers
    relrms = (((pe - p) ** 2).sum(-1).mean(1) / (p**2).sum(-1).mean(1)).sqrt()
    assert relrms.min() > 1e-3
    np.testing.assert_allclose(rows["final_patch_relrms"], relrms.numpy(), rtol=1e-4)
    lp0, lp = F.log_softmax(base_logits.double(), -1), F.log_softmax(logits.double(), -1)
    np.testing.assert_allclose(rows["probe_kl"], (lp0.exp() * (lp0 - lp)).sum(-1).numpy(), rtol=1e-3, atol=1e-9)
    np.testing.assert_allclose(rows["probe_ce"], (-lp[torch.arange(4), labels]).numpy(), rtol=1e-5)
    np.testing.assert_array_equal(rows["probe_agree"], (logits.argmax(-1) == base_logits.argmax(-1)).double().numpy())


def test_registry() -> None:
    own = own_twin(timm_vit(CONFIGS["deit"]), CONFIGS["deit"])
    assert adapt(own).family == "vitsinks"
    with pytest.raises(BadValue, match="no adapter"):
        adapt(nn.Linear(2, 2))
    post = VisionTransformer(**SHAPE, block_fn=ResPostBlock)
    with pytest.raises(BadValue, match="ResPostBlock"):
        adapt(post)


@torch.no_grad()
def test_native_model_equals_the_diagnostics_of_its_own() -> None:
    """A `SinkViT` through `pretrained` gives `diagnostics.core.diagnose`'s fields, its extra key slot included."""
    torch.manual_seed(0)
    own = build_vit("vit_mini", img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, registers=2,
                    attn="sink_logit").eval()
    x = images(4)
    got, want = diagnose_fields(own, x), core.diagnose(own, x, keep_maps=0)
    assert tuple(got["extra_keys"]) == tuple(want["extra_keys"]) == ("null",)
    for k, v in want.items():
        if v.dtype.kind == "f":
            np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], v, err_msg=k)
    own.blocks[1].attn.sink_logit.fill_(20.0)  # every query of block 1 on its null key
    tabs = diagnose(own, x)
    assert set(tabs["heads"]["sink_location"][tabs["heads"]["block"] == 1]) == {"null"}


def test_half_precision_is_refused() -> None:
    m = timm_vit(CONFIGS["deit"]).to(torch.bfloat16)
    with pytest.raises(BadValue, match="float32"):
        diagnose(m, images(2))
