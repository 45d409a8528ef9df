"""Diagnostics against hand-built models, closed forms and a second implementation path."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from vitsinks.diagnostics import (
    classify,
    diagnose,
    diagnose_tokens,
    events,
    location,
    qk_spectrum,
    stable_rank,
    summarize,
)
from vitsinks.diagnostics.summary import mitigation_measures
from vitsinks.models import ATTN_KINDS, MITIGATIONS, SinkBlock, build_vit
from vitsinks.models.layout import KeyLayout


def hand_block() -> tuple[SinkBlock, torch.Tensor]:
    """Head 0 routes every query to token 0, whose value is 0; head 1 routes to token 2, whose value is large."""
    blk = SinkBlock(4, 2, qkv_bias=False, init_values=1.0)
    blk.norm1 = nn.Identity()
    x = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0.5], [1, 0, 1, 0], [1, 0, 0, -0.5]], dtype=torch.float32)
    w = torch.zeros(12, 4)
    w[0, 0] = w[2, 0] = 50.0  # q: head 0 and head 1 both [50, 0] for every token
    w[4, 1] = 1.0  # k head 0 = [is token 0, 0]
    w[6, 2] = 1.0  # k head 1 = [is token 2, 0]
    w[8, 3] = w[9, 3] = 1.0  # v head 0 = [x3, x3]: zero on token 0
    w[10, 2] = 10.0  # v head 1 = [10 * is token 2, x3]
    w[11, 3] = 1.0
    with torch.no_grad():
        blk.attn.qkv.weight.copy_(w)
        blk.attn.proj.weight.copy_(torch.eye(4))
        blk.attn.proj.bias.zero_()
        blk.ls1.gamma.copy_(torch.tensor([1.0, 1.0, 2.0, 1.0]))
    return blk, x[None]


def test_hand_built_heads_give_exact_fields() -> None:
    blk, x = hand_block()
    d = diagnose_tokens([blk], x)
    d["num_registers"] = np.array(0)
    f = {k: d[k][0, 0] for k in ("sink_idx", "mass", "routed_frac", "min_a", "ratio_head", "ratio_out")}
    assert f["sink_idx"].tolist() == [0, 2]
    np.testing.assert_allclose(f["mass"], [1, 1], atol=1e-6)
    assert f["routed_frac"].tolist() == [1.0, 1.0]
    np.testing.assert_allclose(f["min_a"], [1, 1], atol=1e-6)
    # head 0: v_0 = 0 -> ratio 0. head 1: ||v_2|| = 10, others 0, 0.5, 0.5 -> 10 / (1/3) = 30;
    # after W_O = I and LayerScale (1, 1, 2, 1), u_2 = (0, 0, 20, 0) -> 20 / (1/3) = 60.
    np.testing.assert_allclose(f["ratio_head"], [0, 30], rtol=1e-5)
    np.testing.assert_allclose(f["ratio_out"], [0, 60], rtol=1e-5)
    assert abs(d["stable_rank"][0, 0, 1] - 1.0) < 1e-4  # every row of U is u_2: rank one
    assert classify(d).tolist() == [[[0, 1]]]  # NOP-like, broadcast-like
    assert location(d).tolist() == [[[0, 2]]]  # [CLS] (token 0), patch
    assert d["recompute_error"][0] < 1e-6


def test_stable_rank_closed_form() -> None:
    U = torch.diag(torch.tensor([3.0, 2.0, 1.0]))
    assert abs(stable_rank(U).item() - (9 + 4 + 1) / 9) < 1e-6
    R = torch.randn(5, 7)
    expected = torch.linalg.matrix_norm(R, "fro") ** 2 / torch.linalg.matrix_norm(R, 2) ** 2
    assert abs(stable_rank(R).item() - expected.item()) < 1e-4
    assert math.isnan(stable_rank(torch.zeros(3, 4)).item())


def test_qk_spectrum_matches_direct_svd_of_theta() -> None:
    torch.manual_seed(0)
    dim, heads = 12, 3
    w = torch.randn(3 * dim, dim)
    frac, gap = qk_spectrum(w, heads)
    for h in range(heads):
        wq, wk = w[h * 4 : (h + 1) * 4], w[dim + h * 4 : dim + (h + 1) * 4]
        sv = torch.linalg.svdvals(wq.T.double() @ wk.double())  # Theta = W_q^T W_k, dim x dim
        assert abs(frac[h].item() - (sv[0] / sv.sum()).item()) < 1e-5
        assert abs(gap[h].item() - (sv[0] / sv[1]).item()) < 1e-4


VARIANTS = [*({"attn": k} for k in ATTN_KINDS), *({name: m.example} for name, m in MITIGATIONS.items()),
            {"gate": "headwise"}, {"gate": "elementwise", "registers": 2}]  # every kind, every mitigation


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_diagnose_every_variant_shapes_and_recomputation(kw: dict) -> None:
    torch.manual_seed(0)
    model = build_vit("vit_cpu", img_size=32, depth=3, embed_dim=48, num_heads=3, layerscale_init=0.5, **kw)
    d = diagnose(model, torch.randn(5, 3, 32, 32), batch_size=2, keep_maps=3)
    layout = model.key_layout()
    assert layout.n_tokens == model.tokens_per_image() and KeyLayout.from_fields(d) == layout
    for k in ("sink_idx", "mass", "routed_frac", "min_a", "ratio_head", "ratio_out", "stable_rank"):
        assert d[k].shape == (5, 3, 3), k
    assert d["attn_col_mean"].shape == (3, 3, 3, layout.n_keys)  # every key: the tokens and any extra slot
    assert d["qk_sigma1_frac"].shape == (3, 3) and d["massive_ratio"].shape == (5, 3)
    assert d["recompute_error"].max() < 1e-5
    assert ((d["sink_idx"] >= 0) & (d["sink_idx"] < layout.n_keys)).all()
    assert (d["routed_frac"] <= 1).all() and (d["min_a"] <= d["mass"] + 1e-6).all()
    s = summarize(d)
    assert s["shape"] == {"images": 5, "blocks": 3, "heads": 3, "registers": model.num_reg_tokens}  # cores: too


def test_events_rules_and_summary_counts_by_hand() -> None:
    d = {
        "routed_frac": np.array([[[1.0, 0.95], [0.5, 0.92]], [[0.0, 0.91], [1.0, 0.1]]]),
        "min_a": np.array([[[0.9, 0.4], [0.2, 0.6]], [[0.0, 0.55], [0.8, 0.0]]]),
        "ratio_out": np.array([[[0.1, 0.7], [1.0, 0.3]], [[0.0, 2.0], [0.05, 1.0]]]),
        "ratio_head": np.ones((2, 2, 2)),
        "stable_rank": np.array([[[1.0, 1.2], [3.0, 1.0]], [[1.0, 2.0], [1.0, 1.0]]]),
        "sink_idx": np.array([[[0, 5], [1, 9]], [[0, 2], [0, 0]]]),
        "mass": np.array([[[0.9, 0.5], [0.3, 0.8]], [[0.2, 0.6], [0.4, 0.1]]]),
        "num_registers": np.array(1),
    }
    ev = events(d)
    assert ev.sum() == 5
    assert events(d, "def1", eps=0.5).sum() == 4 and events(d, "def1", eps=0.2).sum() == 2
    s = summarize({**d, "massive_token": np.zeros((2, 2), int), "massive_ratio": np.ones((2, 2)),
                   "token_norm_max": np.ones((2, 2)), "qk_sigma1_frac": np.full((2, 2), 0.5),
                   "qk_sigma1_over_sigma2": np.ones((2, 2)), "recompute_error": np.zeros(2)})
    # blocks 1..L-1 = block 1 only: image 0 has one event (head 1: ratio 0.3 -> unclassified, patch);
    # image 1 has one (head 0: ratio 0.05 -> NOP, on [CLS]). Averages over 2 images:
    assert s["sinks_per_image"]["all"]["all"] == 1.0
    assert s["sinks_per_image"]["nop"]["cls"] == 0.5 and s["sinks_per_image"]["unclassified"]["patch"] == 0.5
    # block 0: image 0 heads 0 (NOP, cls) and 1 (broadcast: 0.7 >= 0.5, rank 1.2; patch 5 > 1 register);
    # image 1 head 1 (ratio 2.0 but stable rank 2.0 -> unclassified; index 2 is past the one register -> patch)
    b0 = s["sinks_per_image_block0"]
    assert b0["nop"]["cls"] == 0.5 and b0["broadcast"]["patch"] == 0.5 and b0["unclassified"]["patch"] == 0.5
    assert s["block_frequency"] == [0.75, 0.5]
    assert s["max_mass_by_block"] == [0.75, 0.6]  # block 0: (0.9 + 0.6) / 2; block 1: (0.8 + 0.4) / 2


def test_low_rank_fields_match_forming_u_and_U_explicitly() -> None:
    """ratio_out and stable_rank avoid forming u and U; a direct computation must agree."""
    from vitsinks.diagnostics import head_fields

    torch.manual_seed(0)
    B, H, N, hd = 2, 3, 7, 4
    dim = H * hd
    attn = torch.softmax(torch.randn(B, H, N, N) * 3, -1)
    v, w_o, ls = torch.randn(B, H, N, hd), torch.randn(dim, dim), torch.rand(dim) + 0.5
    f = head_fields(attn, v, w_o, ls)
    w_heads = w_o.view(dim, H, hd).permute(1, 0, 2)  # W_O^h: (dim, hd) per head
    u = torch.einsum("hed,bhnd->bhne", w_heads, v) * ls  # (B, H, N, dim)
    U = attn @ u
    s = f["sink_idx"]
    for b in range(B):
        for h in range(H):
            norms = u[b, h].norm(dim=-1)
            others = torch.cat([norms[: s[b, h]], norms[s[b, h] + 1 :]]).mean()
            assert abs(f["ratio_out"][b, h] - norms[s[b, h]] / others) < 1e-4
            direct = torch.linalg.matrix_norm(U[b, h], "fro") ** 2 / torch.linalg.matrix_norm(U[b, h], 2) ** 2
            assert abs(f["stable_rank"][b, h] - direct) < 1e-3


def test_continuous_measures_by_hand() -> None:
    from vitsinks.diagnostics.summary import continuous_measures

    # 2 images, 2 blocks, 2 heads; block 1 head 0 is the strongest (mean mass 0.8) and sits on register 1
    mass = np.array([[[0.1, 0.2], [0.9, 0.3]], [[0.2, 0.4], [0.7, 0.1]]])
    d = {
        "mass": mass, "prefix_mass": mass + 0.05, "routed_frac": np.zeros_like(mass),
        "min_a": np.array([[[0.0, 0.0], [0.85, 0.0]], [[0.0, 0.0], [0.55, 0.0]]]),
        "ratio_out": np.array([[[1.0, 1.0], [0.1, 1.0]], [[1.0, 1.0], [0.3, 1.0]]]),
        "stable_rank": np.full_like(mass, 3.0), "sink_idx": np.array([[[5, 5], [1, 5]], [[5, 5], [1, 5]]]),
        "num_registers": np.array(4), "gate_mean": np.full_like(mass, 0.25),
    }
    m = continuous_measures(d)
    strong = m["strongest_head_by_block"]
    assert strong["head"] == [1, 0] and np.allclose(strong["mass"], [0.3, 0.8])
    assert strong["location"] == ["patch", "register"] and np.isclose(strong["ratio"][1], 0.2)
    assert np.isclose(strong["prefix_mass"][1], 0.85)
    assert np.allclose(m["mass_share_by_block"], [1 / 4, 3 / 4]) and np.isclose(m["mass_share"], 4 / 8)
    # Definition 1 on block 1 only (blocks 1..L-1): min_a 0.85 / 0.55 -> eps 0.5: 2 events, 0.2: 1, 0.1: 0
    def1 = m["def1_sinks_per_image"]
    assert [def1[e]["all"] for e in ("0.5", "0.3", "0.2", "0.1")] == [1.0, 0.5, 0.5, 0.0]
    assert def1["0.5"]["nop"] == 0.5  # only the 0.1-ratio event is NOP-like (0.3 is unclassified)
    assert "gate_mean_by_block" not in m  # the gate's summary is the gate's own (mitigation_measures)
    assert mitigation_measures(d)["gate_mean_by_block"] == [0.25, 0.25]


def test_the_recomputation_check_fails_loudly_and_writes_nothing(tmp_path, monkeypatch) -> None:
    import json

    from vitsinks.diagnostics import run_diagnostics
    from vitsinks.utils.errors import CheckFailed

    torch.manual_seed(0)
    model = build_vit("vit_cpu", img_size=32, depth=2, embed_dim=48, num_heads=3)
    images = torch.randn(3, 3, 32, 32)
    shown = np.zeros((3, 32, 32, 3), np.uint8)
    summary = run_diagnostics(model, images, shown, tmp_path / "ok", None)
    text = (tmp_path / "ok" / "summary.json").read_text()
    stored = json.loads(text)["recompute_error_max"]
    assert 0 < stored < 1e-5 and stored == summary["recompute_error_max"]  # unrounded (it used to read 0.0)
    assert "e-" in text.split('"recompute_error_max":')[1].split(",")[0]  # scientific notation in the file
    explicit = SinkBlock.forward_explicit

    def drifting(self, x, causal=False):  # an explicit path that no longer computes what the model computes
        out, it = explicit(self, x, causal=causal)
        return out * (1 + 1e-3), it

    monkeypatch.setattr(SinkBlock, "forward_explicit", drifting)
    with pytest.raises(CheckFailed, match=r"block \d differs .* by 1\.\d+e-03 .*tolerance 1e-04"):
        run_diagnostics(model, images, shown, tmp_path / "bad", None)
    assert not (tmp_path / "bad" / "summary.json").exists()


def _hand_fields() -> dict[str, np.ndarray]:
    """2 images x 3 blocks x 2 heads, one register (token 0 [CLS], 1 the register, 2.. patches). Events per
    (image, block, head) are written next to each value; `ratio_out` equals `ratio_head`, so only the stable-rank
    test separates the default summary's classes from the sink table's."""
    # image 0: b0h0 relaxed + Def.1 at every eps (min_a 0.95), NOP, [CLS]; b0h1 none;
    #          b1h0 relaxed, Def.1 eps 0.5 / 0.3 (0.75), ratio 0.6 with stable rank 3, patch;
    #          b1h1 relaxed, Def.1 eps 0.5 (0.55), ratio 0.3 (unclassified), register;
    #          b2h0 none; b2h1 relaxed, Def.1 eps 0.5 / 0.3 / 0.2 (0.85), NOP, [CLS].
    # image 1: b0h0 relaxed (routed_frac exactly 0.9), no Def.1 (0.4), broadcast (2.0), patch; b0h1 none;
    #          b1h0 Def.1 eps 0.5 only (0.6, routed_frac 0.89 < 0.9), ratio exactly 0.2 (NOP), [CLS];
    #          b1h1 relaxed, Def.1 at every eps (0.92), ratio exactly 0.5 (broadcast), register; block 2 none.
    ratio = np.array([[[0.1, 1.0], [0.6, 0.3], [1.0, 0.05]], [[2.0, 1.0], [0.2, 0.5], [1.0, 1.0]]])
    return {
        "routed_frac": np.array([[[1.0, 0.5], [0.95, 0.92], [0.2, 1.0]], [[0.9, 0.1], [0.89, 1.0], [0.0, 0.3]]]),
        "min_a": np.array([[[0.95, 0.3], [0.75, 0.55], [0.0, 0.85]], [[0.4, 0.0], [0.6, 0.92], [0.0, 0.1]]]),
        "ratio_head": ratio, "ratio_out": ratio.copy(),
        "stable_rank": np.array([[[1.0, 1.0], [3.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]]),
        "sink_idx": np.array([[[0, 4], [5, 1], [3, 0]], [[3, 2], [0, 1], [2, 2]]]),
        "mass": np.full((2, 3, 2), 0.5), "num_registers": np.array(1),
    }


# counted by hand from _hand_fields, blocks 1..2, averaged over the 2 images:
# rule -> (total, total_patch, total_cls, total_reg, bc, bc_patch, bc_cls, bc_reg, nop, nop_patch, nop_cls, nop_reg)
HAND_TABLE = {
    ("relaxed", None): (2.0, 0.5, 0.5, 1.0, 1.0, 0.5, 0.0, 0.5, 0.5, 0.0, 0.5, 0.0),
    ("def1", 0.5): (2.5, 0.5, 1.0, 1.0, 1.0, 0.5, 0.0, 0.5, 1.0, 0.0, 1.0, 0.0),
    ("def1", 0.3): (1.5, 0.5, 0.5, 0.5, 1.0, 0.5, 0.0, 0.5, 0.5, 0.0, 0.5, 0.0),
    ("def1", 0.2): (1.0, 0.0, 0.5, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5, 0.0, 0.5, 0.0),
    ("def1", 0.1): (0.5, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0),
}
TABLE_COLUMNS = [f"{c}{p}" for c in ("total", "bc", "nop") for p in ("", "_patch", "_cls", "_reg")]


def test_sink_table_counts_by_hand() -> None:
    from vitsinks.diagnostics.sinktable import COLUMNS, sink_table

    assert COLUMNS == TABLE_COLUMNS
    t = sink_table(_hand_fields())
    assert [(r["rule"], r["eps"]) for r in t["rows"]] == list(HAND_TABLE)
    for r in t["rows"]:
        assert tuple(r[c] for c in TABLE_COLUMNS) == HAND_TABLE[(r["rule"], r["eps"])], (r["rule"], r["eps"])
    assert t["blocks_counted"] == "1..L-1" and t["images"] == 2 and t["registers"] == 1


def test_sink_table_block0_on_request_and_a_one_block_model() -> None:
    from vitsinks.diagnostics.sinktable import sink_table

    d = _hand_fields()
    rows = {(r["rule"], r["eps"]): r for r in sink_table(d, block0=True)["rows"]}
    # block 0 adds image 0's NOP [CLS] event (relaxed and every eps) and image 1's broadcast patch event (relaxed)
    relaxed = rows[("relaxed", None)]
    assert (relaxed["total"], relaxed["nop"], relaxed["bc"], relaxed["total_cls"], relaxed["bc_patch"]) == \
        (3.0, 1.0, 1.5, 1.0, 1.0)
    assert (rows[("def1", 0.1)]["total"], rows[("def1", 0.1)]["nop_cls"]) == (1.0, 0.5)
    one = {k: v[:, :1] if getattr(v, "ndim", 0) == 3 else v for k, v in d.items()}  # block 0 alone
    t = sink_table(one)
    assert t["blocks_counted"] == "0 (the only block)" and t["rows"][0]["total"] == 1.0  # its only block counts


def test_sink_table_classes_use_ratio_head_alone_unlike_the_default_summary() -> None:
    from vitsinks.diagnostics.sinktable import sink_table

    d = _hand_fields()
    extra = {"massive_token": np.zeros((2, 3), int), "massive_ratio": np.ones((2, 3)),
             "token_norm_max": np.ones((2, 3)), "qk_sigma1_frac": np.full((3, 2), 0.5),
             "qk_sigma1_over_sigma2": np.ones((3, 2)), "recompute_error": np.zeros(3)}
    s = summarize({**d, **extra})
    # image 0, block 1, head 0: ratio 0.6 with stable rank 3 -> unclassified by default, broadcast-like here
    assert s["sinks_per_image"]["broadcast"]["patch"] == 0.0 and s["sinks_per_image"]["unclassified"]["patch"] == 0.5
    assert sink_table(d)["rows"][0]["bc_patch"] == 0.5
    assert s["rule"] == {"events": "relaxed", "eps": 0.5, "ratio": "ratio_out", "use_stable_rank": True,
                         "blocks_counted": "1..L-1"}


def test_sink_table_refuses_eps_above_one_half() -> None:
    from vitsinks.diagnostics.sinktable import sink_table
    from vitsinks.utils.errors import BadValue

    with pytest.raises(BadValue, match=r"0 < eps <= 0\.5 .* got eps 0\.6$"):
        sink_table(_hand_fields(), eps=(0.5, 0.6))


def test_run_diagnostics_writes_the_sink_table_beside_the_summary(tmp_path) -> None:
    import csv

    from vitsinks.configs.schema import DiagnosticsConfig
    from vitsinks.diagnostics import run_diagnostics
    from vitsinks.diagnostics.sinktable import sink_table

    torch.manual_seed(0)
    model = build_vit("vit_cpu", img_size=32, depth=2, embed_dim=48, num_heads=3, registers=2)
    run_diagnostics(model, torch.randn(3, 3, 32, 32), np.zeros((3, 32, 32, 3), np.uint8), tmp_path,
                    DiagnosticsConfig(plots=False, block0=True))
    md = (tmp_path / "sink_table.md").read_text().splitlines()
    assert md[0].startswith("Sinks per image, 3 images, blocks 0..L-1 of 2; classes by ratio_head alone")
    assert "no stable-rank test" in md[0] and md[2].startswith("| rule | total | total_patch |")
    rows = list(csv.DictReader((tmp_path / "sink_table.csv").open()))
    assert [r["rule"] for r in rows] == ["relaxed", "def1", "def1", "def1", "def1"]
    assert {r["blocks_counted"] for r in rows} == {"0..L-1"} and {r["ratio"] for r in rows} == {"ratio_head"}
    expected = sink_table(dict(np.load(tmp_path / "per_image.npz")), block0=True)["rows"]
    for got, want in zip(rows, expected, strict=True):
        assert [float(got[c]) for c in TABLE_COLUMNS] == pytest.approx([want[c] for c in TABLE_COLUMNS])
