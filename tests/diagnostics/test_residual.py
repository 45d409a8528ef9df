"""The residual side of sinks against planted constructions whose answers are known by hand, numpy and float64."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.tiny import near_identity, tiny_vit
from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics import (
    DiagnosticsSummary,
    diagnose,
    diagnose_tokens,
    plots,
    run_diagnostics,
    spectrum,
    summarize,
)
from vitsinks.diagnostics.plots import all_plots
from vitsinks.diagnostics.residual import (
    block_stats,
    check_ks,
    entering_norms,
    finite_norms,
    high_norm,
    high_norm_stats,
    lower_median,
    sink_tokens,
)
from vitsinks.diagnostics.summary import residual_columns
from vitsinks.utils.errors import BadValue, NonFinite
from vitsinks.utils.rundir import FINAL, RunDir

D, N, C = 48, 17, 200.0  # tiny_vit: width, tokens ([CLS] + 16 patches); the query scale of the planted sink head
A = 1 / math.sqrt(D)  # every entry of the planted input is +-A: every token has norm 1
# token -> (channel, value) added to block 1's MLP output: [CLS] 3, patches 5, 6 and 9 get 7, 15 and 30.
PLANTS = {0: (5, 3.0), 5: (5, 7.0), 6: (5, 15.0), 9: (17, 30.0)}
# By hand: a planted token's norm at block 1 is sqrt(1 - A^2 + (A + V)^2) = 3.30, 7.21, 15.18, 30.16 (the others
# stay 1, the median of 17 tokens with 4 planted), so at k = 2, 5, 10, 20 the high-norm tokens are 4, 3, 2, 1.
EXPECTED = {"2.0": (4, 1), "5.0": (3, 0), "10.0": (2, 0), "20.0": (1, 0)}  # k -> (per image, of them on [CLS])


def planted(sink: int, images: int = 2, plant_at: int = 1) -> tuple[list[nn.Module], torch.Tensor]:
    """tiny_vit's two blocks made (almost) the identity on unit-norm tokens, with `PLANTS` added to block
    `plant_at`'s MLP output by a hook; block 1's three heads send every query to token `sink` (a sink event per head
    and image) whatever the plants (its queries and keys read channels 0 and 1 only)."""
    torch.manual_seed(0)
    blocks = list(tiny_vit().blocks)
    near_identity(blocks)
    with torch.no_grad():
        b1 = blocks[1]
        b1.norm1 = nn.Identity()
        w = torch.zeros_like(b1.attn.qkv.weight)
        w[2 * D:] = b1.attn.qkv.weight[2 * D:]  # values stay random (finite value ratios)
        for h in range(3):
            w[h * 16, 0] = C / A  # q = (C, 0, ...) for every token (channel 0 is +A everywhere)
            w[D + h * 16, 1] = 1 / A  # k = (+1 on `sink`, -1 elsewhere): scores +-C / 4
        b1.attn.qkv.weight.copy_(w)
        b1.attn.qkv.bias.zero_()

    def plant(module: nn.Module, inputs: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        for t, (c, v) in PLANTS.items():
            out[:, t, c] += v
        return out

    blocks[plant_at].mlp.register_forward_hook(plant)
    g = torch.Generator().manual_seed(1)
    x = (torch.randint(0, 2, (images, N, D), generator=g) * 2 - 1).float()
    x[..., 0] = 1
    x[..., 1] = -1
    x[:, sink, 1] = 1
    for t, (c, _) in PLANTS.items():
        x[:, t, c] = 1  # the plant adds to +A: |h| = A + V
    return blocks, x * A


def diagnosed(sink: int, plant_at: int = 1, **kw: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    blocks, x = planted(sink, plant_at=plant_at)
    d = diagnose_tokens(blocks, x, keep_maps=1)
    d.update(spectrum(blocks), num_registers=np.array(0), num_prefix=np.array(1), grid=np.array([4, 4]))
    return d, summarize(d, **kw)


def test_planted_high_norm_tokens_at_block_1_with_counts_locations_and_top_activation_by_hand() -> None:
    d, s = diagnosed(sink=9)
    planted_norm = [math.sqrt(1 - A**2 + (A + v) ** 2) for _, v in PLANTS.values()]
    np.testing.assert_allclose(d["res_norm"][:, 1, list(PLANTS)], [planted_norm] * 2, rtol=1e-5)
    np.testing.assert_allclose(np.delete(d["res_norm"][:, 1], list(PLANTS), axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(d["res_norm"][:, 0], 1, rtol=1e-5)
    r = s["residual"]
    assert set(r["high_norm"]) == set(EXPECTED)
    for k, (per_image, on_cls) in EXPECTED.items():
        h = r["high_norm"][k]
        assert h["per_image_by_block"] == [0, per_image]  # block 1, not block 0
        assert h["location_by_block"]["cls"] == [0, on_cls]
        assert h["location_by_block"]["patch"] == [0, per_image - on_cls]
        assert h["location_by_block"]["register"] == [0, 0]
        assert h["sink_share_by_block"] == [None, None]  # made by block 1's MLP: no block's attention sees them
    top = r["top_activations"]
    np.testing.assert_allclose(top["top_by_block"][1], [A + 30, A + 15, A + 7], rtol=1e-5)
    np.testing.assert_allclose(top["median_by_block"], [A, A], rtol=1e-4)
    np.testing.assert_allclose(top["ratio_by_block"][1], (A + 30) / A, rtol=1e-4)
    assert top["ratio_by_block"][0] < 1.01  # block 0: every |h| is A
    assert top["channel_by_block"][1] == 17 and top["location_by_block"][1] == "patch"
    assert d["res_top_token"][:, 1].tolist() == [9, 9]
    assert s["massive_activations"]["ratio_by_block"][1] > 20  # the older key is still written


def test_sink_share_is_one_when_the_high_norm_token_is_the_sink_and_zero_when_it_is_not() -> None:
    """Planted by block 0's MLP, the high-norm tokens enter block 1, whose attention sees them: the share is read
    there; block 0 is entered by unit-norm tokens only (no share)."""
    d, s = diagnosed(sink=9, plant_at=0)
    assert (d["sink_idx"][:, 1] == 9).all() and (d["routed_frac"][:, 1] >= 0.9).all()  # the planted sink heads
    np.testing.assert_allclose(d["res_norm_in"], 1, rtol=1e-5)  # the tokens entering block 0
    high = s["residual"]["high_norm"]
    assert all(v["sink_share_by_block"][0] is None for v in high.values())
    assert {k: v["per_image_by_block"] for k, v in high.items()} == {k: [n, n] for k, (n, _) in EXPECTED.items()}
    # token 9 is the only sink: it is 1 of the 1, 2, 3, 4 high-norm tokens at k = 20, 10, 5, 2
    share = {k: v["sink_share_by_block"][1] for k, v in high.items()}
    assert share == pytest.approx({"20.0": 1.0, "10.0": 0.5, "5.0": 1 / 3, "2.0": 0.25}, abs=1e-6)
    d, s = diagnosed(sink=3, plant_at=0)  # an ordinary patch is the sink: none of the high-norm tokens is
    assert (d["sink_idx"][:, 1] == 3).all() and (d["routed_frac"][:, 1] >= 0.9).all()
    assert all(v["sink_share_by_block"][1] == 0.0 for v in s["residual"]["high_norm"].values())
    assert DiagnosticsSummary.from_json(s).residual == s["residual"]


def test_sink_tokens_join_only_heads_with_events() -> None:
    sink_idx = np.array([[[2, 4], [1, 1]]])  # (1 image, 2 blocks, 2 heads)
    ev = np.array([[[True, False], [False, True]]])
    got = sink_tokens(sink_idx, ev, 5)
    assert got[0, 0].tolist() == [False, False, True, False, False]  # head 1's key 4 has no event
    assert got[0, 1].tolist() == [False, True, False, False, False]


def test_quantiles_and_histogram_match_numpy_on_float64_norms() -> None:
    torch.manual_seed(0)
    model = tiny_vit(registers=2)
    images = torch.randn(3, 3, 32, 32)
    d = diagnose(model, images, keep_maps=2)
    r = summarize(d)["residual"]
    with torch.no_grad():
        x, norms = model.embed_tokens(images), []
        for blk in model.blocks:
            x = blk(x)
            norms.append(x.double().norm(dim=-1).numpy())
    norms = np.stack(norms, 1)  # (images, L, N)
    np.testing.assert_allclose(d["res_norm"], norms, rtol=1e-5)
    np.testing.assert_allclose(d["token_norms"], norms[:2], rtol=1e-5)
    for name, q in (("q50", 0.5), ("q90", 0.9), ("q99", 0.99), ("max", 1.0)):
        np.testing.assert_allclose(r["norm_quantiles_by_block"][name], np.quantile(norms, q, axis=(0, 2)),
                                   rtol=1e-5, atol=1e-5)
    edges = np.array(r["norm_hist"]["edges"])
    np.testing.assert_allclose(np.diff(np.log(edges)), np.log(edges[1] / edges[0]), rtol=1e-9)  # log-spaced
    np.testing.assert_allclose([edges[0], edges[-1]], [norms.min(), norms.max()], rtol=1e-5)
    for b in range(norms.shape[1]):
        want = np.histogram(np.clip(norms[:, b].ravel(), edges[0], edges[-1]), bins=edges)[0]
        assert r["norm_hist"]["counts_by_block"][b] == want.tolist()
        assert sum(want) == norms.shape[0] * norms.shape[2]


def test_block_stats_match_numpy() -> None:
    x = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))  # 35 entries: an odd count, one median
    got = block_stats(x)
    h = np.abs(x.numpy()).reshape(2, -1)
    np.testing.assert_allclose(got["top"].numpy(), -np.sort(-h, axis=1)[:, :3], rtol=1e-6)
    np.testing.assert_allclose(got["abs_median"].numpy(), np.median(h, axis=1), rtol=1e-6)
    arg = h.argmax(axis=1)
    assert got["top_token"].tolist() == (arg // 7).tolist() and got["top_channel"].tolist() == (arg % 7).tolist()
    np.testing.assert_allclose(got["norm"].numpy(), np.linalg.norm(x.numpy(), axis=-1), rtol=1e-6)
    even = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    lower = np.sort(even.numpy(), axis=1)[:, 4]  # of 10 values, the lower middle one
    for selection in (True, False):  # numpy's selection (CPU) and torch's median (other devices)
        np.testing.assert_array_equal(lower_median(even, selection).numpy(), lower)


def test_leaderboard_columns_and_residual_off(tmp_path) -> None:
    _, s = diagnosed(sink=9)
    run = RunDir(tmp_path / "run")
    path = run.summary(FINAL)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(s))
    row = DiagnosticsSummary.collect(run)
    assert {"high_norm", "high_norm_sinks", "top_act"} <= {c.key for c in DiagnosticsSummary.columns()}
    # k = 10: 2 tokens per image at block 1's output; no block's attention sees them: no share
    assert row["high_norm"] == 2 and math.isnan(row["high_norm_sinks"])
    assert row["top_act"] == pytest.approx((A + 30) / A, rel=1e-4)
    path.write_text(json.dumps(diagnosed(sink=9, plant_at=0)[1]))  # made by block 0: they enter block 1
    row = DiagnosticsSummary.collect(run)
    assert row["high_norm"] == 2 and row["high_norm_sinks"] == 0.5  # half of them (token 9) block 1's sink
    _, off = diagnosed(sink=9, residual=False)
    assert "residual" not in off and DiagnosticsSummary.from_json(off).residual is None
    path.write_text(json.dumps(off))
    row = DiagnosticsSummary.collect(run)
    assert all(math.isnan(row[k]) for k in ("high_norm", "high_norm_sinks", "top_act"))
    _, other = diagnosed(sink=9, high_norm_k=[3])  # the sweep follows the setting
    assert list(other["residual"]["high_norm"]) == ["3.0"]
    assert other["residual"]["high_norm"]["3.0"]["per_image_by_block"] == [0, 4]


def test_plots_draw_the_summary(figures, tmp_path, monkeypatch) -> None:
    for name in ("attention_maps", "nop_broadcast_scatter", "sink_heatmap", "location_by_block",
                 "massive_activations"):  # not what this test is about
        monkeypatch.setattr(plots, name, lambda *a, **k: tmp_path / "other.png")
    d, s = diagnosed(sink=9, plant_at=0)  # high-norm tokens at both blocks' outputs, entering block 1
    paths = all_plots(d, s, np.zeros((1, 32, 32, 3), np.uint8), tmp_path)
    assert [p.name for p in paths] == ["other.png"] * 5 + ["residual_norms.png", "high_norm_tokens.png"]
    r = s["residual"]
    hist, quant = figures[0].axes[:2]  # then the colour bar
    counts = np.array(r["norm_hist"]["counts_by_block"], dtype=float)
    np.testing.assert_allclose(np.ma.filled(hist.collections[0].get_array(), 0).reshape(counts.shape),
                               counts / counts.sum(1, keepdims=True))
    assert [ln.get_xdata().tolist() for ln in hist.lines] == [r["norm_quantiles_by_block"][q]
                                                              for q in ("q50", "q90", "q99", "max")]
    assert [ln.get_ydata().tolist() for ln in quant.lines] == [r["norm_quantiles_by_block"][q]
                                                               for q in ("q50", "q90", "q99", "max")]
    counts_ax, share_ax, top_ax = figures[1].axes
    assert [ln.get_ydata().tolist() for ln in counts_ax.lines] == [[4, 4], [3, 3], [2, 2], [1, 1]]
    share = share_ax.lines[0].get_ydata()  # k = 2: none enters block 0; token 9 is 1 of the 4 entering block 1
    assert math.isnan(share[0]) and share[1] == pytest.approx(0.25)
    assert top_ax.lines[0].get_ydata().tolist() == r["top_activations"]["ratio_by_block"]
    off = {k: v for k, v in s.items() if k != "residual"}
    assert [p.name for p in all_plots(d, off, np.zeros((1, 32, 32, 3), np.uint8), tmp_path)] == ["other.png"] * 5


def test_run_diagnostics_follows_the_residual_settings(tmp_path) -> None:
    torch.manual_seed(0)
    model, images = tiny_vit(), torch.randn(2, 3, 32, 32)
    shown = np.zeros((2, 32, 32, 3), np.uint8)
    on = run_diagnostics(model, images, shown, tmp_path / "on",
                         DiagnosticsConfig(high_norm_k=[3.0], plots=False, report=False))
    assert list(on["residual"]["high_norm"]) == ["3.0"]
    assert json.loads((tmp_path / "on" / "summary.json").read_text())["residual"]["norm_hist"] == on["residual"][
        "norm_hist"]
    arrays = np.load(tmp_path / "on" / "per_image.npz")
    assert arrays["token_norms"].shape == (2, 2, N)
    x = model.embed_tokens(images)  # the tokens entering block 0, as the diagnosis saw them
    np.testing.assert_allclose(arrays["res_norm_in"], x.norm(dim=-1).detach().numpy(), rtol=1e-6)
    assert on["residual"]["sink_share_of"] == "entering"
    off = run_diagnostics(model, images, shown, tmp_path / "off", DiagnosticsConfig(residual=False, plots=False,
                                                                                    report=False))
    assert "residual" not in off and off["massive_activations"] == on["massive_activations"]


def test_the_sink_share_is_read_on_the_tokens_entering_each_block_by_hand() -> None:
    """1 image, 2 blocks, 5 tokens. Entering block 0 (the embedded tokens): token 2 stands out (8 vs a median of 1)
    and is block 0's sink. Block 0's output: tokens 1 and 3 stand out; they enter block 1, whose sink is token 3."""
    norm_in = np.array([[1.0, 1.0, 8.0, 1.0, 1.0]])
    out = np.array([[[1.0, 9.0, 1.0, 9.0, 1.0], [1.0] * 5]])  # (images, L, N): the blocks' outputs
    entering = entering_norms(out, norm_in)
    np.testing.assert_array_equal(entering, [[[1.0, 1.0, 8.0, 1.0, 1.0], [1.0, 9.0, 1.0, 9.0, 1.0]]])
    sink = np.zeros((1, 2, 5), bool)
    sink[0, 0, 2] = sink[0, 1, 3] = True
    loc = np.array([0, 2, 2, 2, 2])
    stats = high_norm_stats(out, 2.0, loc, sink, entering)
    np.testing.assert_allclose(stats["per_image"], [2, 0])  # counted at the outputs
    np.testing.assert_allclose(stats["sink_share"], [1.0, 0.5])  # token 2 of 1; token 3 of tokens 1 and 3
    unknown = entering_norms(out, None)  # a diagnosis that kept no entering norms: no share at block 0
    assert np.isnan(unknown[:, 0]).all() and (unknown[:, 1] == out[:, 0]).all()
    assert np.isnan(high_norm_stats(out, 2.0, loc, sink, unknown)["sink_share"][0])


def test_the_share_column_of_a_one_block_model_and_of_an_older_summary() -> None:
    one = {"sink_share_of": "entering", "high_norm": {"10.0": {"per_image_by_block": [3.0],
                                                                "sink_share_by_block": [0.5]}}}
    assert residual_columns(one)["high_norm_sinks"] == 0.5 and residual_columns(one)["high_norm"] == 3.0
    older = {k: v for k, v in one.items() if k != "sink_share_of"}  # counted each block's own output
    assert math.isnan(residual_columns(older)["high_norm_sinks"]) and residual_columns(older)["high_norm"] == 3.0
    two = {**one, "high_norm": {"10.0": {"per_image_by_block": [4.0, 1.0], "sink_share_by_block": [None, 0.25]}}}
    assert residual_columns(two)["high_norm_sinks"] == 0.25  # block 0's output has the most: they enter block 1


def test_the_register_neuron_column_is_the_largest_share_over_blocks() -> None:
    empty = {"units": [], "scores": [], "norm_share": None}  # a block without outliers (or without an MLP)
    r = {"register_neurons": {"by_block": [empty, {"units": [3], "scores": [9.0], "norm_share": 0.4},
                                           {"units": [1], "scores": [2.0], "norm_share": 0.7}]}}
    assert residual_columns(r)["reg_share"] == 0.7
    assert math.isnan(residual_columns({"register_neurons": {"by_block": [empty, empty]}})["reg_share"])
    assert math.isnan(residual_columns({"top_activations": {"ratio_by_block": [2.0]}})["reg_share"])


def test_thresholds_are_multiples_above_one_and_non_finite_norms_are_refused() -> None:
    assert check_ks([5, 2.0, 5.0]) == [5.0, 2.0]
    for k in (1.0, 0.5, -3.0, float("nan"), float("inf")):  # the schema's range for high_norm_k: gt=1
        with pytest.raises(BadValue, match="trainfree.outlier_k must hold finite multiples > 1"):
            check_ks([2.0, k], "trainfree.outlier_k")
    norms = np.array([[[1.0, 2.0, 4.0, 6.0]]])  # median 3 (the mean of the two middle norms)
    assert high_norm(norms, 1.9).tolist() == [[[False, False, False, True]]]
    for bad in (np.array([1.0, np.inf]), torch.tensor([np.nan, 1.0])):
        with pytest.raises(NonFinite, match="NaN or inf"):
            finite_norms(bad)
    ok = torch.ones(2)
    assert finite_norms(ok) is ok
