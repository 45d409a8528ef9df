"""Register neurons: a planted unit that writes a high-norm artifact on one patch token is found, ranked first, and
explains that token's norm as a float64 recomputation of the block says."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_vit
from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics.neurons import find_register_neurons, neuron_k, summarize_neurons
from vitsinks.models import SinkViT
from vitsinks.utils.errors import BadValue

C0 = 0  # the channel only the planted token carries into the register block
PATCH = 5  # the planted patch (sequence index 1 + PATCH without registers)
UNIT = 17  # the planted MLP unit
THRESHOLD, GAIN, WRITE = 2.5, 8.0, 50.0  # unit fires above THRESHOLD in LayerNorm units; writes WRITE x median norm


def images(n: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def plant_register_neuron(model: SinkViT, x: torch.Tensor, block: int = 1) -> SinkViT:
    """Edit `model` in place: channel C0 of the residual stream is 0 at every token but patch PATCH, where it holds
    6 x the typical per-channel spread (the stream measured on `x`), up to `block`; unit UNIT of `block` reads C0
    through its LayerNorm (it fires only at PATCH) and writes there a vector of WRITE x the median token norm."""
    model.eval()
    model.patch_embed.proj.weight[C0] = 0
    model.patch_embed.proj.bias[C0] = 0
    model.cls_token[..., C0] = 0
    model.pos_embed[..., C0] = 0
    for b in range(block + 1):
        blk = model.blocks[b]
        blk.attn.proj.weight[C0] = 0
        blk.attn.proj.bias[C0] = 0
        if b < block:
            blk.mlp.fc2.weight[C0] = 0
            blk.mlp.fc2.bias[C0] = 0
    t = model.embed_tokens(x)
    for blk in model.blocks[:block]:
        t = blk(t)
    spread = t.std().item()
    model.pos_embed[0, 1 + PATCH, C0] = 6 * spread
    blk = model.blocks[block]
    blk.mlp.fc1.weight[UNIT] = 0
    blk.mlp.fc1.weight[UNIT, C0] = GAIN
    blk.mlp.fc1.bias[UNIT] = -GAIN * THRESHOLD
    seen = {}
    handle = blk.mlp.act.register_forward_hook(lambda _m, _i, out: seen.update(a=out[:, 1 + PATCH, UNIT]))
    t = model.embed_tokens(x)
    for b in model.blocks[: block + 1]:
        t = b(t)
    handle.remove()
    median = t.norm(dim=-1).median().item()
    v = torch.randn(model.embed_dim, generator=torch.Generator().manual_seed(1))
    v[C0] = 0
    blk.mlp.fc2.weight[:, UNIT] = v / v.norm() * WRITE * median / seen["a"].mean().item()
    return model


Planted = tuple[SinkViT, torch.Tensor]


@pytest.fixture
def planted() -> Planted:
    torch.manual_seed(0)
    x = images()
    return plant_register_neuron(tiny_vit(depth=3), x), x


def last_norms(model: SinkViT, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        t = model.embed_tokens(x)
        for blk in model.blocks:
            t = blk(t)
    return t.norm(dim=-1)


def test_the_planted_token_is_high_norm_and_its_unit_is_ranked_first(planted: Planted) -> None:
    model, x = planted
    norms = last_norms(model, x)
    ratio = norms / norms.median(dim=-1, keepdim=True).values
    assert (ratio[:, 1 + PATCH] > 20).all()
    others = torch.cat([ratio[:, : 1 + PATCH], ratio[:, 2 + PATCH :]], dim=1)
    assert (others < 5).all()  # the planted token is the only outlier at k = 5
    ranked = find_register_neurons(model, x, top=3, k=5.0)
    assert [r[:2] for r in ranked][:1] == [(1, UNIT)]
    assert ranked[0][2] > 10 * ranked[1][2]


@torch.no_grad()
def expected_share(model: SinkViT, x: torch.Tensor, block: int, unit: int) -> float:
    """1 - ||x_t - c(t)|| / ||x_t|| at the planted token, averaged over images, with the block's MLP written out in
    float64: c(t) = W2[:, unit] a_unit(t)."""
    t = model.embed_tokens(x)
    for blk in model.blocks[:block]:
        t = blk(t)
    blk = copy.deepcopy(model.blocks[block]).double()
    t = t.double()
    mid = t + blk.ls1(blk.attn(blk.norm1(t)))
    z = F.layer_norm(mid, (mid.shape[-1],), blk.norm2.weight, blk.norm2.bias, blk.norm2.eps)
    a = F.gelu(z @ blk.mlp.fc1.weight.T + blk.mlp.fc1.bias)
    out = mid + a @ blk.mlp.fc2.weight.T + blk.mlp.fc2.bias
    c = a[..., unit, None] * blk.mlp.fc2.weight[:, unit]
    tok = out[:, 1 + PATCH]
    return float((1 - (tok - c[:, 1 + PATCH]).norm(dim=-1) / tok.norm(dim=-1)).mean())


def test_summary_reports_the_planted_unit_and_its_norm_share_against_float64(planted: Planted) -> None:
    model, x = planted
    st = DiagnosticsConfig(high_norm_k=[2.0, 5.0, 10.0, 20.0], register_neurons=1)
    out = summarize_neurons(model, x, st)
    assert set(out) == {"by_block"} and len(out["by_block"]) == 3
    b1 = out["by_block"][1]
    assert b1["units"] == [UNIT] and len(b1["scores"]) == 1
    want = expected_share(model, x, 1, UNIT)
    assert want > 0.9  # the planted write is most of the token
    assert b1["norm_share"] == pytest.approx(want, abs=1e-4)
    for e in out["by_block"]:
        assert set(e) == {"units", "scores", "norm_share"} and isinstance(e["norm_share"], float)
    assert out["by_block"][0]["norm_share"] < 0.5  # block 0 writes nothing special there


def test_the_threshold_rule_and_a_model_without_outliers() -> None:
    assert neuron_k([20.0, 2.0, 10.0, 5.0]) == 5.0 and neuron_k([3.0]) == 3.0
    with pytest.raises(BadValue, match="high_norm_k"):
        neuron_k([])
    torch.manual_seed(0)
    model, x = tiny_vit(depth=2).eval(), images(4)
    none = summarize_neurons(model, x, DiagnosticsConfig(high_norm_k=[1000.0]))
    assert none == {"by_block": [{"units": [], "scores": [], "norm_share": None}] * 2}
    with pytest.raises(BadValue, match="no artifact"):
        find_register_neurons(model, x, top=2, k=1000.0)
    attention_only = tiny_vit(depth=2, mlp=False).eval()
    assert [e["units"] for e in summarize_neurons(attention_only, x, DiagnosticsConfig(high_norm_k=[1.01]))[
        "by_block"]] == [[], []]
    with pytest.raises(BadValue, match="no MLP"):
        find_register_neurons(attention_only, x, top=2, k=1.01)


def test_scores_are_the_mean_over_images_of_the_mean_abs_activation_at_outliers(planted: Planted) -> None:
    model, x = planted
    model.blocks[1].mlp.act.register_forward_hook(lambda _m, _i, out: out.mul_(-1))  # |a| ranks, not a
    ranked = dict(((b, u), s) for b, u, s in find_register_neurons(model, x, top=1000, k=5.0))
    seen = {}
    h = model.blocks[2].mlp.act.register_forward_hook(lambda _m, _i, out: seen.update(a=out[:, 1 + PATCH].clone()))
    last_norms(model, x)
    h.remove()
    want = seen["a"].abs().mean(0)  # one outlier per image: its |activation|, averaged over the images
    got = torch.tensor([ranked[(2, u)] for u in range(want.numel())])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert max(ranked, key=ranked.get) == (1, UNIT)
