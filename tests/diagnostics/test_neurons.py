"""Register neurons: a planted unit that writes a high-norm artifact on one patch token is found, ranked first, and
explains that token's norm as a float64 recomputation of the block says."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from timm.layers import GluMlp, Mlp, SwiGLU
from torch import nn

from tests.helpers.register_neuron import PATCH, UNIT, last_norms, plant_register_neuron
from tests.helpers.tiny import images, tiny_vit
from vitsinks.backbones import adapt
from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics import diagnose
from vitsinks.diagnostics.neurons import (
    NeuronCollector,
    capture,
    find_register_neurons,
    neuron_k,
    outlier_mask,
    summarize_neurons,
)
from vitsinks.models import SinkViT
from vitsinks.utils.errors import BadValue, NonFinite

Planted = tuple[SinkViT, torch.Tensor]


@pytest.fixture
def planted() -> Planted:
    torch.manual_seed(0)
    x = images()
    return plant_register_neuron(tiny_vit(depth=3), x), x


def test_the_planted_token_is_high_norm_and_its_unit_is_ranked_first(planted: Planted) -> None:
    model, x = planted
    norms = last_norms(model, x)
    ratio = norms / norms.median(dim=-1, keepdim=True).values
    assert (ratio[:, 1 + PATCH] > 20).all()
    others = torch.cat([ratio[:, : 1 + PATCH], ratio[:, 2 + PATCH :]], dim=1)
    assert (others < 5).all()  # the planted token is the only outlier at k = 5
    ranked = find_register_neurons(adapt(model), x, top=3, k=5.0)
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


@pytest.mark.parametrize("during_diagnosis", [False, True], ids=["own pass", "collected by diagnose"])
def test_summary_reports_the_planted_unit_and_its_norm_share_against_float64(planted: Planted,
                                                                             during_diagnosis: bool) -> None:
    model, x = planted
    st = DiagnosticsConfig(high_norm_k=[2.0, 5.0, 10.0, 20.0], register_neurons=1)
    if during_diagnosis:  # the diagnosis's forward pass (with its explicit recomputation of every block) collects
        collector = NeuronCollector(model.blocks, neuron_k(st.high_norm_k), model.num_prefix_tokens)
        diagnose(model, x, batch_size=3, neurons=collector)  # batches of 3: the sums run over batches
        out = summarize_neurons(adapt(model), None, st, collector.got)
    else:
        out = summarize_neurons(adapt(model), x, st)
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
    none = summarize_neurons(adapt(model), x, DiagnosticsConfig(high_norm_k=[1000.0]))
    assert none == {"by_block": [{"units": [], "scores": [], "norm_share": None}] * 2}
    with pytest.raises(BadValue, match="no artifact"):
        find_register_neurons(adapt(model), x, top=2, k=1000.0)
    attention_only = tiny_vit(depth=2, mlp=False).eval()
    assert [e["units"] for e in summarize_neurons(adapt(attention_only), x, DiagnosticsConfig(high_norm_k=[1.01]))[
        "by_block"]] == [[], []]
    with pytest.raises(BadValue, match="no MLP"):
        find_register_neurons(adapt(attention_only), x, top=2, k=1.01)


def test_scores_are_the_mean_over_images_of_the_mean_abs_activation_at_outliers(planted: Planted) -> None:
    model, x = planted
    model.blocks[1].mlp.act.register_forward_hook(lambda _m, _i, out: out.mul_(-1))  # |a| ranks, not a
    ranked = dict(((b, u), s) for b, u, s in find_register_neurons(adapt(model), x, top=1000, k=5.0))
    seen = {}
    h = model.blocks[2].mlp.act.register_forward_hook(lambda _m, _i, out: seen.update(a=out[:, 1 + PATCH].clone()))
    last_norms(model, x)
    h.remove()
    want = seen["a"].abs().mean(0)  # one outlier per image: its |activation|, averaged over the images
    got = torch.tensor([ranked[(2, u)] for u in range(want.numel())])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert max(ranked, key=ranked.get) == (1, UNIT)


def test_the_ranking_can_stop_at_a_block(planted: Planted) -> None:
    model, x = planted
    every = find_register_neurons(adapt(model), x, top=1000, k=5.0)
    for max_block in (0, 1):
        got = find_register_neurons(adapt(model), x, top=1000, k=5.0, max_block=max_block)
        assert got == [r for r in every if r[0] <= max_block]  # the same scores, later blocks left out
    assert find_register_neurons(adapt(model), x, top=1, k=5.0, max_block=1)[0][:2] == (1, UNIT)
    assert (1, UNIT) not in [r[:2] for r in find_register_neurons(adapt(model), x, top=1000, k=5.0, max_block=0)]
    with pytest.raises(BadValue, match="max_block=3 is not a block of this 3-block model"):
        find_register_neurons(adapt(model), x, top=1, k=5.0, max_block=3)


MLPS = {"GluMlp": lambda: GluMlp(48, 96), "SwiGLU": lambda: SwiGLU(48, 96),
        "Mlp with a hidden-layer norm \\(LayerNorm\\)": lambda: Mlp(48, 96, norm_layer=nn.LayerNorm)}


@pytest.mark.parametrize("name", list(MLPS), ids=["GluMlp", "SwiGLU", "Mlp+norm"])
def test_another_mlp_has_no_register_neurons_and_the_fit_names_it(name: str) -> None:
    torch.manual_seed(0)
    model, x = tiny_vit(depth=2).eval(), images(4)
    model.blocks[1].mlp = MLPS[name]()
    out = summarize_neurons(adapt(model), x, DiagnosticsConfig(high_norm_k=[1.01], register_neurons=2))["by_block"]
    assert out[1] == {"units": [], "scores": [], "norm_share": None}
    assert len(out[0]["units"]) == 2 and isinstance(out[0]["norm_share"], float)  # the plain Mlp block still ranks
    with pytest.raises(BadValue, match=f"block 1 has {name}"):
        find_register_neurons(adapt(model), x, top=2, k=1.01)


def test_outliers_are_the_residual_high_norm_rule_on_patches() -> None:
    norms = torch.tensor([[9.0, 1.0, 2.0, 4.0, 6.0]])  # median 4 (odd count); k = 1.4: above 5.6
    assert outlier_mask(norms, 1.4, 1).tolist() == [[False, False, False, False, True]]  # [CLS] never counts
    even = torch.tensor([[1.0, 2.0, 4.0, 6.0]])  # median (2 + 4) / 2 = 3, not the lower middle 2: above 5.7
    assert outlier_mask(even, 1.9, 0).tolist() == [[False, False, False, True]]
    with pytest.raises(NonFinite, match="NaN or inf"):
        outlier_mask(torch.tensor([[1.0, float("nan"), 2.0]]), 2.0, 0)
    for k in (1.0, 0.5, float("inf")):  # the schema's range: k > 1
        with pytest.raises(BadValue, match="multiples > 1"):
            capture(adapt(tiny_vit()), images(1), k)
        with pytest.raises(BadValue, match="high_norm_k must hold finite multiples > 1"):
            neuron_k([5.0, k])
